"""The fused encoder (`build_fused_encoder`, contract `contract.graphs.encoder_io`): per layer
Add+LayerNorm, one packed QKV MatMul, MultiHeadAttention with the key padding mask, out proj,
Add+LayerNorm, the feed-forward; then every decoder layer's cross-attention keys and values from
one MatMul over the memory, laid out (B, H, S, d_k) by one Transpose.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from contract.graphs import encoder_io
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
from export.model import DecoderLayer, EncoderLayer, Transformer


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
    pe = g.node("Slice", [g.init("pe", as_array(model.pe)), zero, S, axis0], ["x_pos"], "pos_embed")  # (S, D)
    mask = g.node("Cast", ["src_mask"], ["key_mask"], "key_mask", to=TensorProto.INT32)  # (B, S), 1: a real token

    layers = layers_of(model.encoder_layers, EncoderLayer)
    sublayers = [
        (f"e{i}.{kind}", res.norm)
        for i, layer in enumerate(layers)
        for kind, res in (("norm_attn", layer.res_attn), ("norm_ffn", layer.res_ffn))
    ]
    stream = ResidualStream(g, cfg.pre_norm, sublayers, final_norm(model.encoder_norm))
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
    return save_graph(g, "fused_encoder", encoder_io(cfg), path)


def _cross_kv_outputs(g: GraphBuilder, model: Transformer, memory: str) -> None:
    """Every decoder layer's cross-attention keys and values from the memory: one MatMul
    (B, S, 2LD) -> (2L, B, H, S, d_k) -> 2L outputs."""
    cfg, L = model.cfg, model.cfg.n_decoder_layers
    cross = [layer.cross_attn.kv_proj for layer in layers_of(model.decoder_layers, DecoderLayer)]
    kv_w = np.concatenate([as_array(proj.weight).T for proj in cross], axis=1)
    kv_b = np.concatenate([as_array(proj.bias) for proj in cross])
    kv = g.linear("cross_kv", memory, kv_w, kv_b)
    heads = g.init("kv_heads", np.array([0, 0, 2 * L, cfg.n_heads, cfg.d_k], np.int64))
    kv = g.node("Reshape", [kv, heads], ["cross_kv.heads"], "cross_kv.heads")  # (B, S, 2L, H, d_k)
    kv = g.node("Transpose", [kv], ["cross_kv.t"], "cross_kv.t", perm=[2, 0, 3, 1, 4])  # (2L, B, H, S, d_k)
    for i in range(L):
        for j, name in enumerate((f"cross_key_{i}", f"cross_value_{i}")):
            g.node("Gather", [kv, g.init(f"{name}.at", np.array(2 * i + j, np.int64))], [name], name, axis=0)
