"""A loaded transformers model (MarianMTModel or M2M100ForConditionalGeneration) -> the state dict
of mtserve's `Transformer`.

q/k/v projections are concatenated into `qkv_proj`, the cross-attention's k/v into `kv_proj`,
fc1/fc2 become `ffn.w1`/`ffn.w2`, each layer's norms the norms of its residual blocks; the position
table is HF's own, with row p the embedding of position p (M2M100's offset of padding_idx + 1
removed), and the tokens transformers never generates get NEG_INF in the logits bias."""

from __future__ import annotations

from typing import Any

import torch

from export.hf.config import M2M100, MARIAN
from export.model import NEG_INF, ModelConfig


def _linear(out: dict[str, torch.Tensor], name: str, *layers: Any) -> None:
    """`name`.weight/.bias from one HF linear layer, or several concatenated along the outputs."""
    out[f"{name}.weight"] = torch.cat([layer.weight for layer in layers], dim=0)
    out[f"{name}.bias"] = torch.cat([layer.bias for layer in layers], dim=0)


def _norm(out: dict[str, torch.Tensor], name: str, norm: Any) -> None:
    out[f"{name}.weight"], out[f"{name}.bias"] = norm.weight, norm.bias


def _encoder_layer(out: dict[str, torch.Tensor], prefix: str, layer: Any) -> None:
    a = layer.self_attn
    _linear(out, f"{prefix}.self_attn.qkv_proj", a.q_proj, a.k_proj, a.v_proj)
    _linear(out, f"{prefix}.self_attn.out_proj", a.out_proj)
    _linear(out, f"{prefix}.ffn.w1", layer.fc1)
    _linear(out, f"{prefix}.ffn.w2", layer.fc2)
    _norm(out, f"{prefix}.res_attn.norm", layer.self_attn_layer_norm)
    _norm(out, f"{prefix}.res_ffn.norm", layer.final_layer_norm)


def _decoder_layer(out: dict[str, torch.Tensor], prefix: str, layer: Any) -> None:
    a, c = layer.self_attn, layer.encoder_attn
    _linear(out, f"{prefix}.self_attn.qkv_proj", a.q_proj, a.k_proj, a.v_proj)
    _linear(out, f"{prefix}.self_attn.out_proj", a.out_proj)
    _linear(out, f"{prefix}.cross_attn.q_proj", c.q_proj)
    _linear(out, f"{prefix}.cross_attn.kv_proj", c.k_proj, c.v_proj)
    _linear(out, f"{prefix}.cross_attn.out_proj", c.out_proj)
    _linear(out, f"{prefix}.ffn.w1", layer.fc1)
    _linear(out, f"{prefix}.ffn.w2", layer.fc2)
    _norm(out, f"{prefix}.res_self.norm", layer.self_attn_layer_norm)
    _norm(out, f"{prefix}.res_cross.norm", layer.encoder_attn_layer_norm)
    _norm(out, f"{prefix}.res_ffn.norm", layer.final_layer_norm)


def position_table(hf_model: Any, arch: str, cfg: ModelConfig) -> torch.Tensor:
    """(max_positions, d_model): row p is what transformers adds at position p of a sequence
    without left padding."""
    positions = hf_model.model.decoder.embed_positions
    if arch == MARIAN:
        return positions.create_weight()[: cfg.max_positions]
    offset = positions.padding_idx + 1  # M2M100 numbers real tokens from padding_idx + 1
    table = positions.get_embedding(offset + cfg.max_positions, cfg.d_model, positions.padding_idx)
    return table[offset:]


def convert_state_dict(hf_model: Any, arch: str, cfg: ModelConfig, suppressed: list[int]) -> dict[str, torch.Tensor]:
    """Our state dict (float32, contiguous) from a transformers model of architecture `arch`."""
    enc, dec = hf_model.model.encoder, hf_model.model.decoder
    out: dict[str, torch.Tensor] = {"pe": position_table(hf_model, arch, cfg), "embed.weight": dec.embed_tokens.weight}
    if cfg.src_vocab_size is not None:
        out["src_embed.weight"] = enc.embed_tokens.weight
    if not cfg.tie_embeddings:
        out["generator.weight"] = hf_model.lm_head.weight
    if cfg.logits_bias:
        bias = hf_model.final_logits_bias[0].clone() if arch == MARIAN else torch.zeros(cfg.vocab_size)
        bias[suppressed] = NEG_INF
        out["final_logits_bias"] = bias
    for i, layer in enumerate(enc.layers):
        _encoder_layer(out, f"encoder_layers.{i}", layer)
    for i, layer in enumerate(dec.layers):
        _decoder_layer(out, f"decoder_layers.{i}", layer)
    if arch == M2M100:
        _norm(out, "encoder_norm", enc.layer_norm)
        _norm(out, "decoder_norm", dec.layer_norm)
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}
