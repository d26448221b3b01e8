"""The search's ranking at the end of a fused decoder step: the output projection and its logits
bias, then LogSoftmax and the k best of each row (`block_top_k`: two passes over blocks of the
vocabulary, where ONNX Runtime's TopK keeps a heap over the whole row), or, for the unscored step
(greedy search when nobody asks for a score, as CTranslate2 skips its log-softmax then), the
input eos_bias added to </s>'s logit and the argmax of the logits (`block_argmax`; rows under
their minimum length ban </s> with -inf, so that a minimum needs no scores either). Its output
layer is padded to a multiple of `ARGMAX_BLOCK` where no block divides the vocabulary (OPUS-MT's
58,101; `padded_output`). `shortlist_ranking` is the same over the batch's `vocab_ids` of a
vocabulary shortlist.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from contract.graphs import EOS_BIAS, VOCAB_IDS
from export.fused.builder import MS, GraphBuilder, as_array, quantize_per_channel
from export.model import Transformer


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


def step_ranking(g: GraphBuilder, model: Transformer, h: str, scored: bool, blocks: bool) -> None:
    """The output projection (its own copy of the tied embedding, so that it is quantised too), plus
    the stored logits bias where the model has one, and the search's outputs from the logits. The
    unscored step adds eos_bias to each row's </s> logit before its argmax; where it ranks in
    blocks and the vocabulary has no block that divides it, its output layer has padding columns
    up to a multiple of `ARGMAX_BLOCK`, which no row can win (`padded_output`)."""
    cfg = model.cfg
    h = g.node("Reshape", [h, g.init("flat_shape", np.array([-1, cfg.d_model], np.int64))], ["hidden"], "hidden")
    table, bias = _output_table(model)  # (V, D), (V,) or None
    block = rank_block(cfg.vocab_size) if blocks else 0
    if blocks and not scored:
        block = block or ARGMAX_BLOCK
        table, bias = padded_output(table, bias, block)
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


def padded_output(table: np.ndarray, bias: np.ndarray | None, block: int) -> tuple[np.ndarray, np.ndarray | None]:
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
    return as_array(out_w), as_array(model.final_logits_bias) if model.cfg.logits_bias else None


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
    """`step_ranking` over the batch's candidates `vocab_ids` (K,) (`contract.graphs.fused_decoder_io`
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
