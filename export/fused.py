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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from contract.graphs import EOS_BIAS, FUSED_LINEAR_KINDS, VOCAB_IDS, encoder_io, fused_decoder_io
from contract.manifest import TensorSpec
from export.model import DecoderLayer, EncoderLayer, FeedForward, MultiHeadAttention, Transformer

MS = "com.microsoft"
DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32}
NBITS_BLOCK = 128

_Layer = TypeVar("_Layer", bound=torch.nn.Module)


def quantize_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (K, N) -> int8 (K, N) and scales (N,): symmetric per output column, as
    onnxruntime.quantization.quantize_dynamic(per_channel=True, QInt8) makes them."""
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def quantize_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """w (K, N) -> MatMulNBits' 8-bit layout: B (N, K / block, block) uint8 with the default zero
    point 128, scales (N, K / block)."""
    K, N = w.shape
    kb = -(-K // block)
    wt = np.zeros((N, kb * block), np.float32)
    wt[:, :K] = w.T
    wt = wt.reshape(N, kb, block)
    amax = np.abs(wt).max(axis=2)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = (np.clip(np.rint(wt / scale[:, :, None]), -127, 127) + 128).astype(np.uint8)
    return q, scale


class GraphBuilder:
    """Nodes and initializers of one graph, with the few node shapes the step is made of."""

    def __init__(self, linear_kind: str):
        if linear_kind not in FUSED_LINEAR_KINDS:
            raise ValueError(f"unknown linear kind {linear_kind!r}; choose from {FUSED_LINEAR_KINDS}")
        self.linear_kind = linear_kind
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def init(self, name: str, value: npt.ArrayLike) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs[0]

    def linear(self, name: str, x: str, w: np.ndarray, b: np.ndarray | None) -> str:
        """y = x @ w + b as one node; w (K, N)."""
        K, N = w.shape
        bias = self.init(f"{name}.b", b.astype(np.float32)) if b is not None else ""
        y = f"{name}.y"
        if self.linear_kind == "fp32":
            mm = self.node("MatMul", [x, self.init(f"{name}.w", w.astype(np.float32))], [f"{name}.mm"], name)
            return self.node("Add", [mm, bias], [y], f"{name}.add") if bias else mm
        if self.linear_kind == "int8":
            q, s = quantize_per_channel(w)
            ins = [
                x,
                self.init(f"{name}.wq", q),
                self.init(f"{name}.ws", s),
                self.init(f"{name}.wz", np.zeros(N, np.int8)),
            ]
            return self.node("DynamicQuantizeMatMul", [*ins, bias], [y], name, MS)
        q, s = quantize_blocks(w, NBITS_BLOCK)
        ins = [x, self.init(f"{name}.wq", q), self.init(f"{name}.ws", s), "", ""]
        return self.node(
            "MatMulNBits", [*ins, bias], [y], name, MS, K=K, N=N, bits=8, block_size=NBITS_BLOCK, accuracy_level=4
        )

    def module_linear(self, name: str, x: str, lin: torch.nn.Linear) -> str:
        return self.linear(name, x, _np(lin.weight).T, _np(lin.bias) if lin.bias is not None else None)

    def add_norm(
        self, name: str, x: str, residual: str, norm: torch.nn.LayerNorm, out: str | None = None
    ) -> tuple[str, str]:
        """(LayerNorm(x + residual), x + residual): the next sublayer's input (named `out`, by
        default NAME.y) and the residual stream."""
        s = self.node("Add", [x, residual], [f"{name}.sum"], f"{name}.add")
        g, b = self.init(f"{name}.g", _np(norm.weight)), self.init(f"{name}.b", _np(norm.bias))
        y = out or f"{name}.y"
        return self.node("LayerNormalization", [s, g, b], [y], name, axis=-1, epsilon=float(norm.eps)), s

    def packed_qkv(self, name: str, x: str, qkv_proj: torch.nn.Linear) -> tuple[str, str, str]:
        """q, k, v, each (B, T, D), from one packed MatMul and a Split: ONNX Runtime's CPU attention
        kernels take no packed QKV ("Tensor size (3072) != new size (1024)")."""
        qkv = self.module_linear(f"{name}.qkv", x, qkv_proj)  # (B, T, 3D)
        D = qkv_proj.out_features // 3
        split = self.init(f"{name}.split", np.array([D, D, D], np.int64))
        q, k, v = f"{name}.q", f"{name}.k", f"{name}.v"
        self.node("Split", [qkv, split], [q, k, v], f"{name}.qkv_split", axis=-1)
        return q, k, v

    def activation(self, name: str, x: str, kind: str) -> str:
        """The feed-forward's activation (`ModelConfig.activation`) as one node: Relu, ONNX Runtime's
        Gelu (exact, with erf) or swish x * sigmoid(x), which is QuickGelu with alpha 1."""
        if kind == "relu":
            return self.node("Relu", [x], [f"{name}.relu"], f"{name}.relu")
        if kind == "gelu":
            return self.node("Gelu", [x], [f"{name}.gelu"], f"{name}.gelu", MS)
        if kind == "swish":
            return self.node("QuickGelu", [x], [f"{name}.swish"], f"{name}.swish", MS, alpha=1.0)
        raise ValueError(f"no fused graph for the activation {kind!r}; the fused graphs have relu, gelu and swish")

    def feed_forward(self, name: str, h: str, ffn: FeedForward, activation: str) -> str:
        """A layer's feed-forward sublayer W2(act(W1(h))) on its input h."""
        f = self.activation(name, self.module_linear(f"{name}.w1", h, ffn.w1), activation)
        return self.module_linear(f"{name}.w2", f, ffn.w2)


class ResidualStream:
    """The residual stream of a stack (the encoder's or the decoder's) at the boundaries between its
    sublayers, each an Add and a LayerNormalization (two nodes, not SkipLayerNormalization: see
    above). A boundary joins the previous sublayer's output y to the stream x:

    - pre-norm (x + Sublayer(LN(x))): the next sublayer's input is LN(x + y) with that sublayer's
      norm, and the stream goes on as x + y; the last boundary applies the stack's final norm;
    - post-norm (LN(x + Sublayer(x))): LN(x + y) with the previous sublayer's norm is both the next
      input and the stream; the first boundary (token embedding + position) has no norm, and the
      last is the last sublayer's (a post-norm stack has no final norm).

    Either way, n sublayers have n + 1 boundaries; `join` takes the next one."""

    def __init__(
        self,
        g: GraphBuilder,
        pre_norm: bool,
        sublayers: list[tuple[str, torch.nn.LayerNorm]],
        final: torch.nn.LayerNorm | None,
    ):
        self.g, self.pre_norm = g, pre_norm
        boundaries = [*sublayers, ("final", final)] if pre_norm else [("embed_pos", None), *sublayers]
        self._boundaries = iter(boundaries)

    def join(self, y: str, x: str, out: str | None = None) -> tuple[str, str]:
        """(the next sublayer's input, the residual stream) at the next boundary; `out` names the input."""
        name, norm = next(self._boundaries)
        if norm is None:
            s = self.g.node("Add", [y, x], [out or f"{name}.sum"], f"{name}.add")
            return s, s
        h, s = self.g.add_norm(name, y, x, norm, out)
        return (h, s) if self.pre_norm else (h, h)


def _np(t: torch.Tensor | torch.nn.Module) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    return t.detach().cpu().float().numpy()


def _layers(stack: torch.nn.ModuleList, kind: type[_Layer]) -> list[_Layer]:
    """The modules of `stack`, each a `kind`."""
    layers = [m for m in stack if isinstance(m, kind)]
    if len(layers) != len(stack):
        raise TypeError(f"expected a stack of {kind.__name__}")
    return layers


def _final_norm(norm: torch.nn.Module) -> torch.nn.LayerNorm | None:
    """A stack's final norm: a pre-norm stack's LayerNorm, or None (post-norm's Identity)."""
    return norm if isinstance(norm, torch.nn.LayerNorm) else None


def _token_table(model: Transformer, embed: torch.nn.Embedding) -> np.ndarray:
    """An embedding table, pre-scaled by √d_model where the model scales its embeddings."""
    table = _np(embed.weight)
    return table * math.sqrt(model.cfg.d_model) if model.cfg.scale_embedding else table


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """table (V, D) -> int8 (V, D) and scales (V, 1): symmetric per row, as CTranslate2 int8 stores
    its embeddings."""
    amax = np.abs(table).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(table / scale), -127, 127).astype(np.int8), scale


def token_embedding(g: GraphBuilder, model: Transformer, embed: torch.nn.Embedding, ids: str) -> str:
    """The rows of `ids` in the token table (pre-scaled by √d_model where the model scales) as
    "x_tok", shaped ids' shape + (D,). The fp32 graphs gather fp32 rows; the quantised ones store
    the table as int8 rows with a scale each ("embed.q" (V, D), "embed.s" (V, 1): a quarter of the
    memory of a graph's largest tensor) and gather both, then Cast and Mul."""
    table = _token_table(model, embed)
    if g.linear_kind == "fp32":
        return g.node("Gather", [g.init("embed", table), ids], ["x_tok"], "embed")
    q, scale = quantize_rows(table)
    rows = g.node("Gather", [g.init("embed.q", q), ids], ["x_tok.q"], "embed")
    scales = g.node("Gather", [g.init("embed.s", scale), ids], ["x_tok.s"], "embed.s")
    rows = g.node("Cast", [rows], ["x_tok.f"], "embed.cast", to=TensorProto.FLOAT)
    return g.node("Mul", [rows, scales], ["x_tok"], "embed.dequant")


def rank_block(vocab_size: int) -> int:
    """The block of the vocabulary that the step's ranking reduces first (`block_top_k`): the largest
    divisor of the vocabulary up to 64, or 0 (rank in one pass) when there is none from 16 up."""
    block = max(d for d in range(1, 65) if vocab_size % d == 0)
    return block if block >= 16 else 0


def _blocks(g: GraphBuilder, x: str, V: int, block: int) -> tuple[str, str]:
    """x (B, V) as (B, V / block, block), and each block's maximum (B, V / block)."""
    xb = g.node(
        "Reshape", [x, g.init("rank.blocks", np.array([0, V // block, block], np.int64))], ["rank.xb"], "rank.xb"
    )
    bmax = g.node(
        "ReduceMax", [xb, g.init("rank.axis2", np.array([2], np.int64))], ["rank.bmax"], "rank.bmax", keepdims=0
    )
    return xb, bmax


def _candidates(g: GraphBuilder, xb: str, chosen: str) -> str:
    """The entries of the `chosen` blocks (B, kb) of xb, one row each: (B, kb * block)."""
    at = g.node("Unsqueeze", [chosen, g.init("rank.last", np.array([-1], np.int64))], ["rank.at"], "rank.at")
    cand = g.node("GatherND", [xb, at], ["rank.cb"], "rank.gather", batch_dims=1)  # (B, kb, block)
    return g.node("Reshape", [cand, g.init("rank.flat", np.array([0, -1], np.int64))], ["rank.cand"], "rank.cand")


def block_top_k(g: GraphBuilder, x: str, k: str, V: int, block: int, values: str, ids: str) -> None:
    """TopK of x (B, V) in two passes, the same result as one (ties: the lower id first): the best
    block maxima pick k blocks, which hold the k best entries, and TopK runs over those alone.
    ONNX Runtime's TopK keeps a heap per row over all V entries; ReduceMax over blocks is
    vectorised. Over (128, 8,000) with k 8: 475 against 945 µs (docs/performance.md)."""
    xb, bmax = _blocks(g, x, V, block)
    kb = g.node("Min", [k, g.init("rank.nb", np.array([V // block], np.int64))], ["rank.kb"], "rank.kb")
    g.node("TopK", [bmax, kb], ["rank.bv", "rank.bi"], "rank.best_blocks", axis=-1)  # (B, kb)
    # the chosen blocks in id order, so that the candidates keep the vocabulary's order for ties
    g.node("TopK", ["rank.bi", kb], ["rank.bis", "rank.bj"], "rank.block_order", axis=-1, largest=0)
    flat = _candidates(g, xb, "rank.bis")
    g.node("TopK", [flat, k], [values, "rank.ti"], "rank.top_k", axis=-1, largest=1, sorted=1)
    blk = g.init("rank.block", np.array([block], np.int64))
    which = g.node("Div", ["rank.ti", blk], ["rank.which"], "rank.which")
    inner = g.node("Mod", ["rank.ti", blk], ["rank.inner"], "rank.inner")
    base = g.node("GatherElements", ["rank.bis", which], ["rank.bid"], "rank.bid", axis=1)
    g.node("Add", [g.node("Mul", [base, blk], ["rank.base"], "rank.base"), inner], [ids], "rank.ids")


def block_argmax(g: GraphBuilder, x: str, V: int, block: int, ids: str, eos: tuple[str, int] | None = None) -> None:
    """ArgMax of x (B, V) keeping dims, in two passes with the same result (the first on ties): the
    block holding the maximum, then the maximum within it. Over (32, 8,000): 72 against 210 µs.
    `eos` (bias, id): the input bias (B, 1) is added to column id first, in that column's block
    alone (a row's </s> banned with -inf costs no pass over the logits)."""
    xb, bmax = _blocks(g, x, V, block)
    eos_block = ""
    if eos is not None:
        bias, eos_id = eos
        at, within = divmod(eos_id, block)
        blk_at = g.init("rank.eos_block", np.array(at, np.int64))
        own = g.node("Gather", [xb, blk_at], ["rank.eos_xb"], "rank.eos_xb", axis=1)  # (B, block)
        biased = g.node("Add", [own, bias], ["rank.eos_biased"], "rank.eos_biased")
        eos_block = g.node(
            "Where", [g.init("rank.eos_at", np.arange(block) == within), biased, own], ["rank.eos_b"], "rank.eos_b"
        )  # (B, block): the block with its </s> biased
        emax = g.node(
            "ReduceMax", [eos_block, g.init("rank.axis1", np.array([1], np.int64))], ["rank.eos_max"], "rank.eos_max"
        )  # (B, 1)
        in_block = g.init("rank.eos_blocks", (np.arange(V // block) == at)[None, :])
        bmax = g.node("Where", [in_block, emax, bmax], ["rank.bmax_eos"], "rank.bmax_eos")  # (B, V / block)
    bi = g.node("ArgMax", [bmax], ["rank.bi"], "rank.best_block", axis=-1, keepdims=1)  # (B, 1)
    cand = _candidates(g, xb, bi)  # (B, block)
    if eos_block:
        is_at = g.node("Equal", [bi, "rank.eos_block"], ["rank.is_eos_block"], "rank.is_eos_block")  # (B, 1)
        cand = g.node("Where", [is_at, eos_block, cand], ["rank.cand_eos"], "rank.cand_eos")
    inner = g.node("ArgMax", [cand], ["rank.inner"], "rank.inner", axis=-1, keepdims=1)
    blk = g.init("rank.block", np.array([block], np.int64))
    g.node("Add", [g.node("Mul", [bi, blk], ["rank.base"], "rank.base"), inner], [ids], "rank.ids")


def biased_eos(g: GraphBuilder, logits: str, eos_at: str) -> str:
    """logits (B, N) with the input eos_bias (B, 1) added to column `eos_at` ((1,) int64: </s>'s
    place), for steps that rank in one pass (one row, or a shortlist's candidates): the column
    gathered, biased and scattered back, one copy of the logits (an Add and a Where over all of
    them took 20 µs a toy one-row step)."""
    col = g.node("Gather", [logits, eos_at], ["logits.eos_col"], "logits.eos_col", axis=1)  # (B, 1)
    biased = g.node("Add", [col, EOS_BIAS], ["logits.eos_biased"], "logits.eos_biased")
    at = g.node(
        "Expand",
        [eos_at, g.node("Shape", [EOS_BIAS], ["logits.eos_shape"], "logits.eos_shape")],
        ["logits.eos_idx"],
        "logits.eos_idx",
    )
    return g.node("ScatterElements", [logits, at, biased], ["logits.eos"], "logits.eos", axis=1)


def build_fused_decoder(
    model: Transformer,
    path: str | Path,
    linear_kind: str = "int8",
    scored: bool = True,
    blocks: bool = True,
    shortlist: bool = False,
) -> onnx.ModelProto:
    """Write the fused decoder step of `model` to `path` and return it (`contract.graphs.fused_decoder_io`).
    `scored=False` ends it with an ArgMax over the logits instead of LogSoftmax and TopK: greedy
    search's step when nobody asks for scores, as CTranslate2 skips its log-softmax then. Over
    (32, 8,000) logits the two take about 240 against 480 µs. `blocks`: rank in two passes
    (`block_top_k`, `block_argmax`) where the vocabulary divides into blocks; for one row a
    single pass costs as much and takes fewer nodes. `shortlist`: the step over a vocabulary
    shortlist (`shortlist_ranking`), ranking the batch's `vocab_ids` only."""
    cfg = model.cfg
    g = GraphBuilder(linear_kind)
    _step_self_mask(g)
    # token embedding (table pre-scaled by √d_model where the model scales) + position: (B, 1, D) each
    x = token_embedding(g, model, model.embed, "tokens")
    pe = g.node("Gather", [g.init("pe", _np(model.pe)), "positions"], ["x_pos"], "pos_embed")
    _beam_folding(g, cfg.d_model)

    layers = _layers(model.decoder_layers, DecoderLayer)
    sublayers = [
        (f"l{i}.{kind}", res.norm)
        for i, layer in enumerate(layers)
        for kind, res in (("norm_self", layer.res_self), ("norm_cross", layer.res_cross), ("norm_ffn", layer.res_ffn))
    ]
    stream = ResidualStream(g, cfg.pre_norm, sublayers, _final_norm(model.decoder_norm))
    y, resid = x, pe
    for i, layer in enumerate(layers):
        h, resid = stream.join(y, resid)
        a = _self_attention(g, i, h, layer.self_attn, cfg.n_heads)
        h, resid = stream.join(a, resid)
        a = _cross_attention(g, i, h, layer.cross_attn, cfg.n_heads, last=i == len(layers) - 1)
        h, resid = stream.join(a, resid)
        y = g.feed_forward(f"l{i}", h, layer.ffn, cfg.activation)
    h, _ = stream.join(y, resid)
    if shortlist:
        shortlist_ranking(g, model, h, scored)
    else:
        _step_ranking(g, model, h, scored, blocks)
    _cross_attention_output(g)

    # MultiHeadAttention's scores output has no type inference of its own
    scores_info = helper.make_tensor_value_info("cross_scores", TensorProto.FLOAT, None)
    name = "fused_decoder_step" if scored else "fused_decoder_step_unscored"
    name += "_shortlist" if shortlist else ""
    return _save(g, name, fused_decoder_io(cfg, scored, shortlist), path, [scores_info])


def _step_self_mask(g: GraphBuilder) -> str:
    """The mask the kernels want, "self_mask_used": (B, P + 1) of the full-capacity (B, M) one."""
    total = g.node("Add", ["past_sequence_length", g.init("one", np.array([1], np.int32))], ["total_len"], "total_len")
    zero, axis1 = g.init("zero", np.array([0], np.int32)), g.init("axis1", np.array([1], np.int32))
    return g.node("Slice", ["self_mask", zero, total, axis1], ["self_mask_used"], "self_mask_used")


def _beam_folding(g: GraphBuilder, D: int) -> None:
    """The shapes that fold a sentence's beams into one cross-attention query, (B, 1, D) <-> (n, K, D):
    "fold_shape" (n, -1, D) from the encoder's keys, and "row_shape" (-1, 1, D)."""
    n = g.node("Shape", ["cross_key_0"], ["n_sentences"], "n_sentences", start=0, end=1)
    g.node("Concat", [n, g.init("fold_tail", np.array([-1, D], np.int64))], ["fold_shape"], "fold", axis=0)
    g.init("row_shape", np.array([-1, 1, D], np.int64))


def _self_attention(g: GraphBuilder, i: int, h: str, attn: MultiHeadAttention, H: int) -> str:
    """Decoder layer i's self-attention over the in-place cache, out projection included: (B, 1, D)."""
    p = f"l{i}"
    q, k, v = g.packed_qkv(p, h, attn.qkv_proj)  # (B, 1, D) each
    g.node(
        "DecoderMaskedMultiHeadAttention",
        [
            q,
            k,
            v,
            "self_mask_used",
            "",
            f"cache_key_{i}",
            f"cache_value_{i}",
            "past_sequence_length",
            "beam_width",
            "cache_indirection",
        ],
        [f"{p}.self", f"present_key_{i}", f"present_value_{i}"],
        f"{p}.self_attn",
        MS,
        num_heads=H,
        past_present_share_buffer=1,
    )  # (B, 1, D)
    return g.module_linear(f"{p}.self_out", f"{p}.self", attn.out_proj)


def _cross_attention(g: GraphBuilder, i: int, h: str, attn: MultiHeadAttention, H: int, last: bool) -> str:
    """Decoder layer i's cross-attention, one per sentence and head with its beams in the query, out
    projection included: (B, 1, D). The last layer's also returns its scores, "cross_scores"."""
    p = f"l{i}"
    q = g.node("Reshape", [g.module_linear(f"{p}.cross_q", h, attn.q_proj), "fold_shape"], [f"{p}.cq"], f"{p}.cq")
    outs = [f"{p}.cross"] + (["", "", "cross_scores"] if last else [])  # (n, K, D) [+ (n, H, K, S)]
    g.node(
        "MultiHeadAttention",
        [q, f"cross_key_{i}", f"cross_value_{i}", "", "src_mask"],
        outs,
        f"{p}.cross_attn",
        MS,
        num_heads=H,
    )
    c = g.node("Reshape", [f"{p}.cross", "row_shape"], [f"{p}.cross_rows"], f"{p}.cross_rows")  # (B, 1, D)
    return g.module_linear(f"{p}.cross_out", c, attn.out_proj)


def _step_ranking(g: GraphBuilder, model: Transformer, h: str, scored: bool, blocks: bool) -> None:
    """The output projection (its own copy of the tied embedding, so that it is quantised too), plus
    the stored logits bias where the model has one, and the search's outputs from the logits. The
    unscored step adds eos_bias to each row's </s> logit before its argmax; where it ranks in
    blocks and the vocabulary has no block that divides it, its output layer has padding columns
    up to a multiple of `ARGMAX_BLOCK`, which no row can win (`_padded_output`)."""
    cfg = model.cfg
    h = g.node("Reshape", [h, g.init("flat_shape", np.array([-1, cfg.d_model], np.int64))], ["hidden"], "hidden")
    table, bias = _output_table(model)  # (V, D), (V,) or None
    block = rank_block(cfg.vocab_size) if blocks else 0
    if blocks and not scored:
        block = block or ARGMAX_BLOCK
        table, bias = _padded_output(table, bias, block)
    logits = g.linear("logits", h, table.T, bias)  # (B, V), padded to a multiple of block unscored
    if scored:
        g.node("LogSoftmax", [logits], ["log_probs"], "log_softmax", axis=-1)
        if block:
            block_top_k(g, "log_probs", "top_k", cfg.vocab_size, block, "top_log_probs", "top_ids")
        else:
            g.node("TopK", ["log_probs", "top_k"], ["top_log_probs", "top_ids"], "top_k", axis=-1, largest=1, sorted=1)
        eos = g.init("eos_id", np.array(cfg.eos_id, np.int64))
        g.node("Gather", ["log_probs", eos], ["eos_log_prob"], "eos", axis=1)
    elif block:
        block_argmax(g, logits, len(table), block, "top_ids", eos=(EOS_BIAS, cfg.eos_id))
    else:
        logits = biased_eos(g, logits, g.init("eos_at", np.array([cfg.eos_id], np.int64)))
        g.node("ArgMax", [logits], ["top_ids"], "argmax", axis=-1, keepdims=1)  # (B, 1), the first on ties


# The block of an unscored step's two-pass argmax where no divisor of the vocabulary from 16 to 64
# serves (`rank_block`; OPUS-MT's 58,101 = 3 x 107 x 181): ONNX Runtime's ArgMax over (32, 58,101)
# takes 1.6 ms on one thread, ReduceMax over blocks of 64 of it 0.16 ms.
ARGMAX_BLOCK = 64


def _padded_output(table: np.ndarray, bias: np.ndarray | None, block: int) -> tuple[np.ndarray, np.ndarray | None]:
    """The output projection (V, D) and bias padded to a multiple of `block` rows: zero rows, whose
    logit is the bias's float32 minimum, which no token's logit falls to. Unchanged where V divides."""
    V, D = table.shape
    pad = -V % block
    if not pad:
        return table, bias
    bias = np.zeros(V, np.float32) if bias is None else bias.astype(np.float32)
    lowest = np.full(pad, np.finfo(np.float32).min, np.float32)
    return np.concatenate([table, np.zeros((pad, D), table.dtype)]), np.concatenate([bias, lowest])


def _output_table(model: Transformer) -> tuple[np.ndarray, np.ndarray | None]:
    """The output projection (V, D) (the tied embedding where the model has no generator of its
    own) and the stored logits bias (V,), or None."""
    out_w = model.generator.weight if model.generator is not None else model.embed.weight
    return _np(out_w), _np(model.final_logits_bias) if model.cfg.logits_bias else None


def _shortlist_logits(g: GraphBuilder, model: Transformer, h: str) -> str:
    """(B, K) logits of the `vocab_ids` rows of the output projection: a Gather of K rows of the
    (V, D) table, then one MatMul. fp32: the rows in fp32 and Gemm(transB). int8 (and nbits8):
    the table stored as int8 rows with a scale each, the same numbers as the full step's
    DynamicQuantizeMatMul (per output column); the gathered rows go through the same operator."""
    table, bias = _output_table(model)
    b = ""
    if bias is not None:
        b = g.node("Gather", [g.init("logits.b_all", bias), VOCAB_IDS], ["logits.b"], "logits.bias")
    if g.linear_kind == "fp32":
        w = g.node("Gather", [g.init("logits.w_all", table), VOCAB_IDS], ["logits.w"], "logits.rows")
        return g.node("Gemm", [h, w, *([b] if b else [])], ["logits"], "logits", transB=1)
    q, s = quantize_per_channel(table.T)  # per vocabulary row: the full step's scales
    wq = g.node("Gather", [g.init("logits.wq_all", q.T.copy()), VOCAB_IDS], ["logits.wq_rows"], "logits.rows")
    wq = g.node("Transpose", [wq], ["logits.wq"], "logits.wq", perm=[1, 0])  # (D, K)
    ws = g.node("Gather", [g.init("logits.ws_all", s), VOCAB_IDS], ["logits.ws"], "logits.scales")
    return g.node("DynamicQuantizeMatMul", [h, wq, ws, "", b], ["logits"], "logits", MS)  # zero points: 0


def _repeats_masked(g: GraphBuilder, logits: str) -> str:
    """logits (B, K) with -inf in every place of vocab_ids that repeats the id before it: the
    padding of a batch's candidates (`contract.shortlist.Shortlist.batch_ids`), which no ranking,
    log-softmax or draw may then count."""
    prev = g.node(
        "Slice",
        [VOCAB_IDS, g.init("repeats.zero", np.array([0], np.int64)), g.init("repeats.last", np.array([-1], np.int64))],
        ["repeats.prev"],
        "repeats.prev",
    )  # (K - 1,)
    nxt = g.node(
        "Slice",
        [VOCAB_IDS, g.init("repeats.one", np.array([1], np.int64)), g.init("repeats.end", np.array([2**62], np.int64))],
        ["repeats.next"],
        "repeats.next",
    )
    again = g.node("Equal", [nxt, prev], ["repeats.again"], "repeats.again")
    first = g.init("repeats.first", np.array([False]))
    again = g.node("Concat", [first, again], ["repeats.at"], "repeats.at", axis=0)  # (K,)
    neg = g.init("repeats.neg_inf", np.array(-np.inf, np.float32))
    return g.node("Where", [again, neg, logits], ["logits.candidates"], "logits.candidates")


def shortlist_ranking(g: GraphBuilder, model: Transformer, h: str, scored: bool) -> None:
    """`_step_ranking` over the batch's candidates `vocab_ids` (K,) (`contract.graphs.fused_decoder_io`
    with shortlist=True): LogSoftmax and TopK (or eos_bias and ArgMax) over K logits, the chosen positions
    mapped back to vocabulary ids by a Gather of vocab_ids, and </s>'s log-probability found by
    its place in vocab_ids."""
    cfg = model.cfg
    h = g.node("Reshape", [h, g.init("flat_shape", np.array([-1, cfg.d_model], np.int64))], ["hidden"], "hidden")
    logits = _repeats_masked(g, _shortlist_logits(g, model, h))  # (B, K)
    is_eos = g.node("Equal", [VOCAB_IDS, g.init("eos_id", np.array(cfg.eos_id, np.int64))], ["is_eos"], "is_eos")
    is_eos = g.node("Cast", [is_eos], ["is_eos.f"], "is_eos.f", to=TensorProto.FLOAT)
    if scored:
        g.node("LogSoftmax", [logits], ["log_probs"], "log_softmax", axis=-1)
        g.node("TopK", ["log_probs", "top_k"], ["top_log_probs", "rank.at"], "top_k", axis=-1, largest=1, sorted=1)
        eos_at = g.node("ArgMax", [is_eos], ["eos_at"], "eos_at", axis=0, keepdims=0)  # () its place
        g.node("Gather", ["log_probs", eos_at], ["eos_log_prob"], "eos", axis=1)
    else:
        eos_at = g.node("ArgMax", [is_eos], ["eos_at"], "eos_at", axis=0, keepdims=1)  # (1,) its place
        logits = biased_eos(g, logits, eos_at)
        g.node("ArgMax", [logits], ["rank.at"], "argmax", axis=-1, keepdims=1)  # (B, 1), the first on ties
    g.node("Gather", [VOCAB_IDS, "rank.at"], ["top_ids"], "top_ids", axis=0)


def _cross_attention_output(g: GraphBuilder) -> None:
    """ "cross_attention" (B, S): the last layer's cross-attention averaged over heads, from the
    kernel's scaled masked scores."""
    g.node("Softmax", ["cross_scores"], ["cross_probs"], "cross_softmax", axis=-1)  # (n, H, K, S)
    mean = g.node(
        "ReduceMean",
        ["cross_probs", g.init("heads_axis", np.array([1], np.int64))],
        ["cross_mean"],
        "cross_mean",
        keepdims=0,
    )  # (n, K, S)
    g.node("Flatten", [mean], ["cross_attention"], "cross_rows", axis=2)  # (B, S)


def build_fused_encoder(model: Transformer, path: str | Path, linear_kind: str = "int8") -> onnx.ModelProto:
    """Write the encoder of `model` with every decoder layer's cross-attention keys and values
    (`contract.graphs.encoder_io`) to `path` and return it. Its int8 MatMuls quantise the same
    activations per call as the torch export's do (the cross keys and values of all layers in one
    call over the memory, whose scale is the memory's either way), so in fp32, and in int8 but for
    its int8 token table (`token_embedding`), its outputs match that graph's to float rounding."""
    cfg = model.cfg
    g = GraphBuilder(linear_kind)

    # token embedding (the source's own table where it has one) + the first S positions: (B, S, D)
    embed = model.src_embed if model.src_embed is not None else model.embed
    x = token_embedding(g, model, embed, "src_ids")
    S = g.node("Shape", ["src_ids"], ["src_len"], "src_len", start=1, end=2)
    zero, axis0 = g.init("zero", np.array([0], np.int64)), g.init("axis0", np.array([0], np.int64))
    pe = g.node("Slice", [g.init("pe", _np(model.pe)), zero, S, axis0], ["x_pos"], "pos_embed")  # (S, D)
    mask = g.node("Cast", ["src_mask"], ["key_mask"], "key_mask", to=TensorProto.INT32)  # (B, S), 1: a real token

    layers = _layers(model.encoder_layers, EncoderLayer)
    sublayers = [
        (f"e{i}.{kind}", res.norm)
        for i, layer in enumerate(layers)
        for kind, res in (("norm_attn", layer.res_attn), ("norm_ffn", layer.res_ffn))
    ]
    stream = ResidualStream(g, cfg.pre_norm, sublayers, _final_norm(model.encoder_norm))
    y, resid = x, pe
    for i, layer in enumerate(layers):
        p = f"e{i}"
        h, resid = stream.join(y, resid)
        q, k, v = g.packed_qkv(p, h, layer.self_attn.qkv_proj)  # (B, S, D) each
        g.node(
            "MultiHeadAttention", [q, k, v, "", mask], [f"{p}.attn"], f"{p}.attn", MS, num_heads=cfg.n_heads
        )  # (B, S, D)
        a = g.module_linear(f"{p}.out", f"{p}.attn", layer.self_attn.out_proj)
        h, resid = stream.join(a, resid)
        y = g.feed_forward(p, h, layer.ffn, cfg.activation)
    memory, _ = stream.join(y, resid, out="memory")
    _cross_kv_outputs(g, model, memory)
    return _save(g, "fused_encoder", encoder_io(cfg), path)


def _cross_kv_outputs(g: GraphBuilder, model: Transformer, memory: str) -> None:
    """Every decoder layer's cross-attention keys and values from the memory: one MatMul
    (B, S, 2LD) -> (2L, B, H, S, d_k) -> 2L outputs."""
    cfg, L = model.cfg, model.cfg.n_decoder_layers
    cross = [layer.cross_attn.kv_proj for layer in _layers(model.decoder_layers, DecoderLayer)]
    kv_w = np.concatenate([_np(proj.weight).T for proj in cross], axis=1)
    kv_b = np.concatenate([_np(proj.bias) for proj in cross])
    kv = g.linear("cross_kv", memory, kv_w, kv_b)
    heads = g.init("kv_heads", np.array([0, 0, 2 * L, cfg.n_heads, cfg.d_k], np.int64))
    kv = g.node("Reshape", [kv, heads], ["cross_kv.heads"], "cross_kv.heads")  # (B, S, 2L, H, d_k)
    kv = g.node("Transpose", [kv], ["cross_kv.t"], "cross_kv.t", perm=[2, 0, 3, 1, 4])  # (2L, B, H, S, d_k)
    for i in range(L):
        for j, name in enumerate((f"cross_key_{i}", f"cross_value_{i}")):
            g.node("Gather", [kv, g.init(f"{name}.at", np.array(2 * i + j, np.int64))], [name], name, axis=0)


def _save(
    g: GraphBuilder,
    name: str,
    io: tuple[list[TensorSpec], list[TensorSpec]],
    path: str | Path,
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    """The graph of `g`'s nodes with the contract's inputs and outputs, checked and saved."""
    graph = helper.make_graph(g.nodes, name, [_value_info(t) for t in io[0]], [_value_info(t) for t in io[1]], g.inits)
    graph.value_info.extend(value_info)
    model_proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], producer_name="mtserve.export"
    )
    model_proto.ir_version = 9
    onnx.checker.check_model(model_proto)
    onnx.save(model_proto, str(path))
    return model_proto


def _value_info(t: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, DTYPES[t.dtype], t.shape)
