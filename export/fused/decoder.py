"""The fused decoder step (`build_fused_decoder`, contract `contract.graphs.fused_decoder_io`): per
layer the self-attention over the in-place cache (DecoderMaskedMultiHeadAttention, beams
reordered through `cache_indirection`), the cross-attention with a sentence's beams folded into
one query, the feed-forward; then the search's ranking (export/fused/ranking.py) and the last
layer's cross-attention averaged over heads.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from contract.graphs import fused_decoder_io
from export.fused.builder import (
    MS,
    GraphBuilder,
    ResidualStream,
    as_array,
    final_norm,
    layers_of,
    save_graph,
    token_embedding,
)
from export.fused.ranking import shortlist_ranking, step_ranking
from export.model import DecoderLayer, MultiHeadAttention, Transformer


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
    pe = g.node("Gather", [g.init("pe", as_array(model.pe)), "positions"], ["x_pos"], "pos_embed")
    _beam_folding(g, cfg.d_model)

    layers = layers_of(model.decoder_layers, DecoderLayer)
    sublayers = [
        (f"l{i}.{kind}", res.norm)
        for i, layer in enumerate(layers)
        for kind, res in (("norm_self", layer.res_self), ("norm_cross", layer.res_cross), ("norm_ffn", layer.res_ffn))
    ]
    stream = ResidualStream(g, cfg.pre_norm, sublayers, final_norm(model.decoder_norm))
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
        step_ranking(g, model, h, scored, blocks)
    _cross_attention_output(g)

    # MultiHeadAttention's scores output has no type inference of its own
    scores_info = helper.make_tensor_value_info("cross_scores", TensorProto.FLOAT, None)
    name = "fused_decoder_step" if scored else "fused_decoder_step_unscored"
    name += "_shortlist" if shortlist else ""
    return save_graph(g, name, fused_decoder_io(cfg, scored, shortlist), path, [scores_info])


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
