"""The graphs' contract: the inputs and outputs of the two graphs every export dir holds per precision.

`mtserve export` (export/) writes graphs with exactly these inputs and outputs, in this order, and
records them in the manifest; the serving path (service/) feeds and reads them. Both sides import
these functions, so neither keeps its own copy of the names, dtypes and shapes.

Two graphs per precision, cut where the serving loop needs them:
- encoder:      src_ids, src_mask (B, S) -> memory (B, S, d_model) and every decoder layer's
                cross-attention keys/values cross_key_{i} / cross_value_{i} (B, H, S, d_k);
- decoder step: one incremental step of `Transformer.decode_step` with an explicit key/value
                cache over B rows of n sentences (each sentence's beams are consecutive rows; n == B
                for greedy search): tokens (B, 1), positions (B,), past_key_{i} / past_value_{i}
                (B, H, P, d_k), past_mask (B, P), cross_key_{i} / cross_value_{i} (n, H, S, d_k) and
                src_mask (n, S) once per sentence (the beams are folded into the cross-attention
                query, one attention per sentence and head instead of one per row), top_k (1,)
                -> log_probs (B, V); the search's inputs computed in the graph, so that the
                serving loop never scans the vocabulary in numpy: top_log_probs / top_ids (B, k),
                the k best tokens of each row best first, and eos_log_prob (B,); present_key_{i} /
                present_value_{i} (B, H, P + 1, d_k), the cache with this step appended (the
                attention builds it anyway; returning it spares the host a copy per step); and
                cross_attention (B, S), the last layer's cross-attention averaged over heads.
Axes batch, sentences, src_len and past_len are dynamic (past_len may be 0, the first step); rows of a call
may be at different positions, their past padded and masked by past_mask.

No torch here: the dims come from anything with the attributes of `GraphDims`, the export's
`ModelConfig` as well as the manifest's `Dims`.
"""

from __future__ import annotations

from typing import Protocol

from contract.manifest import TensorSpec

# ----------------------------------------------------------------------------- the names

# The encoder's inputs and first output.
SRC_IDS = "src_ids"
SRC_MASK = "src_mask"  # the encoder's input, and the decoder steps' once per sentence
MEMORY = "memory"

# The decoder steps' inputs (both graphs).
TOKENS = "tokens"
POSITIONS = "positions"
TOP_K = "top_k"
# The unscored fused steps': added to each row's </s> logit before the argmax.
EOS_BIAS = "eos_bias"
# The portable step's.
PAST_MASK = "past_mask"
# The fused step's.
PAST_SEQUENCE_LENGTH = "past_sequence_length"
SELF_MASK = "self_mask"
BEAM_WIDTH = "beam_width"
CACHE_INDIRECTION = "cache_indirection"
# The shortlist step's (`contract.shortlist`): the batch's candidate target ids (K,), ascending.
VOCAB_IDS = "vocab_ids"

# The decoder steps' outputs.
LOG_PROBS = "log_probs"
TOP_LOG_PROBS = "top_log_probs"
TOP_IDS = "top_ids"
EOS_LOG_PROB = "eos_log_prob"
CROSS_ATTENTION = "cross_attention"


def cross_key(layer: int) -> str:
    """Decoder layer `layer`'s cross-attention keys: the encoder's output, the decoder steps' input."""
    return f"cross_key_{layer}"


def cross_value(layer: int) -> str:
    return f"cross_value_{layer}"


def past_key(layer: int) -> str:
    """The portable step's self-attention cache of decoder layer `layer`, without this step."""
    return f"past_key_{layer}"


def past_value(layer: int) -> str:
    return f"past_value_{layer}"


def cache_key(layer: int) -> str:
    """The fused step's preallocated self-attention cache of decoder layer `layer` (an input)."""
    return f"cache_key_{layer}"


def cache_value(layer: int) -> str:
    return f"cache_value_{layer}"


def present_key(layer: int) -> str:
    """The self-attention cache of decoder layer `layer` with this step (both steps' output)."""
    return f"present_key_{layer}"


def present_value(layer: int) -> str:
    return f"present_value_{layer}"


# The decoder step's search input and outputs: added to the exported graph after the torch export
# (a data-dependent k does not go through torch.export).
SEARCH_INPUT = TOP_K
SEARCH_OUTPUTS = (TOP_LOG_PROBS, TOP_IDS, EOS_LOG_PROB)


class GraphDims(Protocol):
    """The model dims the graphs' shapes depend on."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def d_model(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def d_k(self) -> int: ...

    @property
    def n_decoder_layers(self) -> int: ...


def encoder_io(dims: GraphDims) -> tuple[list[TensorSpec], list[TensorSpec]]:
    kv: list[int | str] = ["batch", dims.n_heads, "src_len", dims.d_k]
    inputs = [
        TensorSpec(name=SRC_IDS, dtype="int64", shape=["batch", "src_len"]),
        TensorSpec(name=SRC_MASK, dtype="int64", shape=["batch", "src_len"]),
    ]
    outputs = [TensorSpec(name=MEMORY, dtype="float32", shape=["batch", "src_len", dims.d_model])]
    for i in range(dims.n_decoder_layers):
        outputs += [
            TensorSpec(name=cross_key(i), dtype="float32", shape=kv),
            TensorSpec(name=cross_value(i), dtype="float32", shape=kv),
        ]
    return inputs, outputs


def decoder_io(dims: GraphDims) -> tuple[list[TensorSpec], list[TensorSpec]]:
    L, H, dk = dims.n_decoder_layers, dims.n_heads, dims.d_k
    past: list[int | str] = ["batch", H, "past_len", dk]
    cross: list[int | str] = ["sentences", H, "src_len", dk]  # once per sentence; its beams are consecutive rows
    inputs = [
        TensorSpec(name=TOKENS, dtype="int64", shape=["batch", 1]),
        TensorSpec(name=POSITIONS, dtype="int64", shape=["batch"]),
    ]
    for i in range(L):
        inputs += [
            TensorSpec(name=past_key(i), dtype="float32", shape=past),
            TensorSpec(name=past_value(i), dtype="float32", shape=past),
        ]
    inputs.append(TensorSpec(name=PAST_MASK, dtype="float32", shape=["batch", "past_len"]))
    for i in range(L):
        inputs += [
            TensorSpec(name=cross_key(i), dtype="float32", shape=cross),
            TensorSpec(name=cross_value(i), dtype="float32", shape=cross),
        ]
    inputs.append(TensorSpec(name=SRC_MASK, dtype="int64", shape=["sentences", "src_len"]))
    inputs.append(TensorSpec(name=TOP_K, dtype="int64", shape=[1]))
    outputs = [
        TensorSpec(name=LOG_PROBS, dtype="float32", shape=["batch", dims.vocab_size]),
        TensorSpec(name=TOP_LOG_PROBS, dtype="float32", shape=["batch", "top_k"]),
        TensorSpec(name=TOP_IDS, dtype="int64", shape=["batch", "top_k"]),
        TensorSpec(name=EOS_LOG_PROB, dtype="float32", shape=["batch"]),
    ]
    present: list[int | str] = ["batch", H, "present_len", dk]
    for i in range(L):
        outputs += [
            TensorSpec(name=present_key(i), dtype="float32", shape=present),
            TensorSpec(name=present_value(i), dtype="float32", shape=present),
        ]
    outputs.append(TensorSpec(name=CROSS_ATTENTION, dtype="float32", shape=["batch", "src_len"]))
    return inputs, outputs


# ----------------------------------------------------------------------------- the fused step

# How the fused step's linear layers multiply: fp32 MatMul, DynamicQuantizeMatMul (int8 weights
# per output channel) or MatMulNBits (8 bits in blocks; the faster of the two for one row only).
FUSED_LINEAR_KINDS = ("fp32", "int8", "nbits8")


def fused_decoder_io(
    dims: GraphDims, scored: bool = True, shortlist: bool = False
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The fused decoder step (export/fused/): the same step as `decoder_io`'s over a
    preallocated cache of max_len slots that the graph updates in place.

    `scored=False` is the step for greedy search when no sentence of the batch asks for its score:
    it takes no top_k and returns top_ids (B, 1), each row's most likely token (the argmax of the
    logits, the lower id on ties), without log-probabilities; the rest is the same. In top_k's
    place it takes eos_bias (B, 1) float32, added to each row's </s> logit before the argmax: 0,
    or -inf for a row that may not end yet (a sentence under its minimum length), so that a
    minimum costs greedy search no scores. Exports from before it lack the input; the server then
    runs the scored step for rows that may not end.

    tokens (B, 1), positions (B, 1): each row's newest token and its position; past_sequence_length
    (1,) int32: the slot P this step writes, the same for every row; self_mask (B, max_len) int32:
    1 where a row's slot holds one of its tokens (a row that joined the batch later starts at a
    later slot), only [:, :P + 1] is read; cache_key_{i} / cache_value_{i} (B, H, max_len, d_k):
    bound as the same buffers as present_key_{i} / present_value_{i}, so that the step writes slot
    P in place; cross_key_{i} / cross_value_{i} (sentences, H, S, d_k) and src_mask (sentences, S)
    once per sentence; beam_width (1,) int32 (K, 1 for greedy search) and cache_indirection
    (sentences, K, max_len) int32: which beam of the sentence holds each slot of a beam's history,
    so that a beam reorder never moves the cache.

    `shortlist=True`: the step over a vocabulary shortlist (`contract.shortlist`): one more input,
    vocab_ids (K,) int64, the batch's candidate target ids ascending (</s> among them); the
    output layer ranks those K tokens only: log_probs (B, K) normalised over them, top_ids still
    vocabulary ids, eos_log_prob that of </s> among them."""
    L, H, dk = dims.n_decoder_layers, dims.n_heads, dims.d_k
    cache: list[int | str] = ["batch", H, "max_len", dk]
    cross: list[int | str] = ["sentences", H, "src_len", dk]
    inputs = [
        TensorSpec(name=TOKENS, dtype="int64", shape=["batch", 1]),
        TensorSpec(name=POSITIONS, dtype="int64", shape=["batch", 1]),
        TensorSpec(name=PAST_SEQUENCE_LENGTH, dtype="int32", shape=[1]),
        TensorSpec(name=SELF_MASK, dtype="int32", shape=["batch", "max_len"]),
    ]
    for i in range(L):
        inputs += [
            TensorSpec(name=cache_key(i), dtype="float32", shape=cache),
            TensorSpec(name=cache_value(i), dtype="float32", shape=cache),
        ]
    for i in range(L):
        inputs += [
            TensorSpec(name=cross_key(i), dtype="float32", shape=cross),
            TensorSpec(name=cross_value(i), dtype="float32", shape=cross),
        ]
    inputs += [
        TensorSpec(name=SRC_MASK, dtype="int32", shape=["sentences", "src_len"]),
        TensorSpec(name=TOP_K, dtype="int64", shape=[1])
        if scored
        else TensorSpec(name=EOS_BIAS, dtype="float32", shape=["batch", 1]),
        TensorSpec(name=BEAM_WIDTH, dtype="int32", shape=[1]),
        TensorSpec(name=CACHE_INDIRECTION, dtype="int32", shape=["sentences", "beam", "max_len"]),
        *([TensorSpec(name=VOCAB_IDS, dtype="int64", shape=["vocab"])] if shortlist else []),
    ]
    if scored:
        outputs = [
            TensorSpec(name=LOG_PROBS, dtype="float32", shape=["batch", "vocab" if shortlist else dims.vocab_size]),
            TensorSpec(name=TOP_LOG_PROBS, dtype="float32", shape=["batch", "top_k"]),
            TensorSpec(name=TOP_IDS, dtype="int64", shape=["batch", "top_k"]),
            TensorSpec(name=EOS_LOG_PROB, dtype="float32", shape=["batch"]),
        ]
    else:
        outputs = [TensorSpec(name=TOP_IDS, dtype="int64", shape=["batch", 1])]
    for i in range(L):
        outputs += [
            TensorSpec(name=present_key(i), dtype="float32", shape=cache),
            TensorSpec(name=present_value(i), dtype="float32", shape=cache),
        ]
    outputs.append(TensorSpec(name=CROSS_ATTENTION, dtype="float32", shape=["batch", "src_len"]))
    return inputs, outputs
