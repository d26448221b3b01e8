"""A loaded transformers encoder-decoder (the BART layout: MarianMTModel, M2M100ForConditionalGeneration)
-> the state dict of mtserve's `Transformer`.

q/k/v projections are concatenated into `qkv_proj`, the cross-attention's k/v into `kv_proj`,
fc1/fc2 become `ffn.w1`/`ffn.w2`, each layer's norms the norms of its residual blocks, and the
tokens transformers never generates get NEG_INF in the logits bias. What a model family does its
own way (`WeightHooks`: the position table, the logits bias, weights only it has, such as final
layer norms) comes from its module in export/hf/families/.

`weight_shapes` and `check_weights` compare the weights file with the config before any of it is
loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Protocol

import torch

from export.hf.config import HFImportError
from export.model import NEG_INF, ModelConfig


def _linear(out: dict[str, torch.Tensor], name: str, *layers: Any) -> None:
    """`name`.weight/.bias from one HF linear layer, or several concatenated along the outputs."""
    out[f"{name}.weight"] = torch.cat([layer.weight for layer in layers], dim=0)
    out[f"{name}.bias"] = torch.cat([layer.bias for layer in layers], dim=0)


class WeightHooks(Protocol):
    """A model family's part of the weights mapping."""

    def position_table(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        """(max_positions, d_model): row p is what transformers adds at position p of a sequence
        without left padding."""
        ...

    def logits_bias(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        """The checkpoint's (vocab_size,) logits bias, before the suppressed tokens are added."""
        ...

    def extra_weights(self, hf_model: Any, out: dict[str, torch.Tensor]) -> None:
        """Add the family's own weights (e.g. final layer norms) to `out`."""
        ...


def copy_norm(out: dict[str, torch.Tensor], name: str, norm: Any) -> None:
    out[f"{name}.weight"], out[f"{name}.bias"] = norm.weight, norm.bias


def _encoder_layer(out: dict[str, torch.Tensor], prefix: str, layer: Any) -> None:
    a = layer.self_attn
    _linear(out, f"{prefix}.self_attn.qkv_proj", a.q_proj, a.k_proj, a.v_proj)
    _linear(out, f"{prefix}.self_attn.out_proj", a.out_proj)
    _linear(out, f"{prefix}.ffn.w1", layer.fc1)
    _linear(out, f"{prefix}.ffn.w2", layer.fc2)
    copy_norm(out, f"{prefix}.res_attn.norm", layer.self_attn_layer_norm)
    copy_norm(out, f"{prefix}.res_ffn.norm", layer.final_layer_norm)


def _decoder_layer(out: dict[str, torch.Tensor], prefix: str, layer: Any) -> None:
    a, c = layer.self_attn, layer.encoder_attn
    _linear(out, f"{prefix}.self_attn.qkv_proj", a.q_proj, a.k_proj, a.v_proj)
    _linear(out, f"{prefix}.self_attn.out_proj", a.out_proj)
    _linear(out, f"{prefix}.cross_attn.q_proj", c.q_proj)
    _linear(out, f"{prefix}.cross_attn.kv_proj", c.k_proj, c.v_proj)
    _linear(out, f"{prefix}.cross_attn.out_proj", c.out_proj)
    _linear(out, f"{prefix}.ffn.w1", layer.fc1)
    _linear(out, f"{prefix}.ffn.w2", layer.fc2)
    copy_norm(out, f"{prefix}.res_self.norm", layer.self_attn_layer_norm)
    copy_norm(out, f"{prefix}.res_cross.norm", layer.encoder_attn_layer_norm)
    copy_norm(out, f"{prefix}.res_ffn.norm", layer.final_layer_norm)


def convert_state_dict(
    hf_model: Any, hooks: WeightHooks, cfg: ModelConfig, suppressed: list[int]
) -> dict[str, torch.Tensor]:
    """Our state dict (float32, contiguous) from a transformers model of the family of `hooks`."""
    enc, dec = hf_model.model.encoder, hf_model.model.decoder
    out: dict[str, torch.Tensor] = {"pe": hooks.position_table(hf_model, cfg), "embed.weight": dec.embed_tokens.weight}
    if cfg.src_vocab_size is not None:
        out["src_embed.weight"] = enc.embed_tokens.weight
    if not cfg.tie_embeddings:
        out["generator.weight"] = hf_model.lm_head.weight
    if cfg.logits_bias:
        bias = hooks.logits_bias(hf_model, cfg).clone()
        bias[suppressed] = NEG_INF
        out["final_logits_bias"] = bias
    for i, layer in enumerate(enc.layers):
        _encoder_layer(out, f"encoder_layers.{i}", layer)
    for i, layer in enumerate(dec.layers):
        _decoder_layer(out, f"decoder_layers.{i}", layer)
    hooks.extra_weights(hf_model, out)
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in out.items()}


MAX_HEADER_BYTES = 100 << 20  # a safetensors header (JSON): a real checkpoint's is well under 1 MB
_LAYER = re.compile(r"(?:^|\.)(encoder|decoder)\.layers\.(\d+)\.")


def weight_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} of a weights file, read without loading the tensors (a safetensors
    header, or a PyTorch zip checkpoint memory-mapped onto the meta device)."""
    if path.suffix == ".safetensors":
        return _safetensors_shapes(path)
    state = None
    for mmap in (True, False):  # the zip format maps; a legacy (pre-1.6) checkpoint is read onto meta
        try:
            state = torch.load(str(path), map_location="meta", weights_only=True, mmap=mmap)
            break
        except Exception as e:  # noqa: BLE001 - pickle, zip and torch errors alike: not a checkpoint
            error = e
    if state is None:
        raise HFImportError(f"{path.name}: not a PyTorch checkpoint mtserve can read ({type(error).__name__})")
    if not isinstance(state, dict):
        raise HFImportError(f"{path.name}: does not hold a state dict")
    return {str(k): list(v.shape) for k, v in state.items() if isinstance(v, torch.Tensor)}


def _safetensors_shapes(path: Path) -> dict[str, list[int]]:
    with open(path, "rb") as f:
        head = f.read(8)
        size = int.from_bytes(head, "little") if len(head) == 8 else -1
        if not 2 <= size <= MAX_HEADER_BYTES:
            raise HFImportError(f"{path.name}: not a safetensors file (header of {size} bytes)")
        header = f.read(size)
    try:
        meta = json.loads(header.decode("utf-8"))
        return {k: [int(n) for n in v["shape"]] for k, v in meta.items() if k != "__metadata__"}
    except (UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        raise HFImportError(f"{path.name}: not a safetensors file (its header is not a tensor index)") from None


def _layers(shapes: dict[str, list[int]], side: str) -> int:
    found = [int(m.group(2)) for k in shapes if (m := _LAYER.search(k)) and m.group(1) == side]
    return max(found, default=-1) + 1


def _find(shapes: dict[str, list[int]], *suffixes: str) -> tuple[str, list[int]] | None:
    for suffix in suffixes:
        for name, shape in shapes.items():
            if name == suffix or name.endswith("." + suffix):
                return name, shape
    return None


def check_weights(shapes: dict[str, list[int]], cfg: ModelConfig, where: str) -> None:
    """The weights must be of the config's size: its layer counts, d_model, ffn dims and target
    vocabulary; HFImportError naming the config.json field otherwise. Checked before transformers
    builds the model, so that a config larger than its weights never allocates."""
    for side, field, want in (
        ("encoder", "encoder_layers", cfg.n_encoder_layers),
        ("decoder", "decoder_layers", cfg.n_decoder_layers),
    ):
        got = _layers(shapes, side)
        if got != want:
            raise HFImportError(f"config.json: `{field}` is {want}; {where} holds {got} {side} layers")
    checks = (
        (("encoder.layers.0.fc1.weight",), [cfg.d_ff, cfg.d_model], "`encoder_ffn_dim` and `d_model`"),
        (("encoder.layers.0.self_attn.q_proj.weight",), [cfg.d_model, cfg.d_model], "`d_model`"),
        (("decoder.embed_tokens.weight", "shared.weight"), [cfg.vocab_size, cfg.d_model], "`vocab_size` and `d_model`"),
    )
    for names, want_shape, fields in checks:
        found = _find(shapes, *names)
        if found is None:
            raise HFImportError(f"{where}: no {names[0]} tensor; not a checkpoint of this architecture")
        if found[1] != want_shape:
            raise HFImportError(f"config.json: {fields} say {found[0]} is {want_shape}; {where} holds {found[1]}")
