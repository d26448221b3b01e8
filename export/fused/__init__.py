"""The fused graphs: one step of `Transformer.decode_step`, and the encoder, written straight from
the weights with onnx.helper on ONNX Runtime's com.microsoft contrib operators (the contracts are
`contract.graphs.fused_decoder_io` and `contract.graphs.encoder_io`).

Why graphs of their own rather than the torch export: the exported step has 144 nodes at int8
(Reshape, Transpose, Concat around every attention), and at batch 1 ONNX Runtime's per-node
cost is most of a step; its cache grows by a Concat every step and is copied on every beam
reorder. Here, per decoder layer:

    x ─ Add+LayerNorm ─ QKV (one int8 MatMul, bias in) ─ Split ─ DecoderMaskedMultiHeadAttention ─ out proj
      ─ Add+LayerNorm ─ Q ─ MultiHeadAttention over the encoder's keys/values ─ out proj
      ─ Add+LayerNorm ─ W1 ─ Relu | Gelu | QuickGelu ─ W2

Every architecture of `export.model.ModelConfig` has them: pre-norm (the Add+LayerNorm before a
sublayer, and a final LayerNorm) and post-norm (the same two nodes after it, none at the end;
`ResidualStream`), the activations relu, gelu (ONNX Runtime's Gelu: exact, with erf) and swish
(QuickGelu with alpha 1: x * sigmoid(x)), token embeddings scaled by √d_model or not (the table
is pre-scaled), computed or stored positions (both a `pe` table), a source vocabulary of its own
(the encoder's table), and a stored logits bias (the output projection's bias, in every step).

- DecoderMaskedMultiHeadAttention (past_present_share_buffer) reads and writes a preallocated
  (B, H, M, d_k) cache in place: the host binds the same buffer as past and present, and the
  kernel writes slot `past_sequence_length` only. Beams reorder through `cache_indirection`
  ((n, K, M): which beam holds each slot of a beam's history), so the cache is never copied.
- The cross-attention folds a sentence's K beams into one query (n, K, D), one attention per
  sentence and head, over the encoder's (n, H, S, d_k) keys and values (format 3's layout).
- LayerNormalization after an Add, not SkipLayerNormalization (which computes LN(x + skip) and
  would fit either norm placement): on the CPU the contrib kernel took 3.5x as long (46 µs a node
  at 32 rows, docs/performance.md).
- The linear layers are DynamicQuantizeMatMul (int8 weights per output channel, activations
  quantised at run time) or MatMulNBits (8 bits, blocks of 128, accuracy level 4), which is
  faster for one row only (docs/performance.md has the table from 1 to 128 rows).
- The token embeddings of the quantised graphs are int8 rows with a scale each, gathered and
  multiplied back (`token_embedding`), as CTranslate2 int8 keeps them: at OPUS-MT's vocabulary
  30 MB in each graph where the fp32 table takes 119 MB.
- The self-attention mask is bound at full capacity (B, M) and sliced to (B, P + 1) in the graph,
  so that the host binds every input once per batch and writes into it between steps.
- The search's ranking: LogSoftmax, then the k best of each row in two passes over blocks of the
  vocabulary (`block_top_k`; ONNX Runtime's TopK keeps a heap over the whole row). The unscored
  variant (`scored=False`, greedy search when nobody asks for a score) ends with the argmax of the
  logits instead (`block_argmax`), as CTranslate2 skips its log-softmax then, after adding the
  input eos_bias to </s>'s logit in its block alone: rows under their minimum length ban </s>
  there (-inf), so that a minimum needs no scores either. Its output layer is padded to a
  multiple of 64 where no block divides the vocabulary (OPUS-MT's 58,101).

The encoder (`build_fused_encoder`) is the same pattern over the source: per layer Add+LayerNorm,
one packed QKV MatMul, MultiHeadAttention with the key padding mask, out proj, Add+LayerNorm, the
feed-forward; then every decoder layer's cross-attention keys and values from one MatMul over
the memory, laid out (B, H, S, d_k) by one Transpose: 51 nodes at int8, where the torch export
spends 36 of its 103 on Reshape and Transpose around unfused attention.

Shapes: B rows = n sentences x K beams (a sentence's beams are consecutive rows), M cache slots,
P = past_sequence_length (the slot this step writes), S source length, D d_model, H heads.

The modules: `builder` (GraphBuilder, ResidualStream, the quantisers, the token embedding,
`save_graph`), `ranking` (the output projection and the search's ranking subgraphs), `decoder`
(`build_fused_decoder`) and `encoder` (`build_fused_encoder`).
"""
