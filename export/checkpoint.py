"""A model directory: `model.safetensors`, `config.json` (ModelConfig + special ids) and
`tokenizer.json` (mtserve's own models) or SentencePiece files (imported ones, `export/hf/`).
Also checkpoint averaging.

config.json carries a top-level `"format"`: 1 (absent) for the first model dirs, 2 since the
model config gained the settings of imported models. A newer format is refused, never read with
defaults filled in."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from export.model import ModelConfig, Transformer

WEIGHTS, CONFIG, TOKENIZER = "model.safetensors", "config.json", "tokenizer.json"
CONFIG_FORMAT = 2


class ConfigFormatError(ValueError):
    """A model dir written by a newer mtserve than this one."""


def save_model_dir(
    model: Transformer, out_dir: str | Path, tokenizer_path: str | Path | None = None, extra: dict | None = None
) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    # The shared embedding is stored once; safetensors refuses aliased tensors.
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    save_file(state, str(out / WEIGHTS), metadata={"format": "pt"})
    meta = {"format": CONFIG_FORMAT, "model": model.cfg.to_dict(), **(extra or {})}
    (out / CONFIG).write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer_path is not None and Path(tokenizer_path).resolve() != (out / TOKENIZER).resolve():
        (out / TOKENIZER).write_bytes(Path(tokenizer_path).read_bytes())
    return out


def read_meta(model_dir: str | Path) -> dict:
    """config.json of a model dir; ConfigFormatError when a newer mtserve wrote it."""
    path = Path(model_dir) / CONFIG
    meta = json.loads(path.read_text())
    found = meta.get("format", 1)
    if not isinstance(found, int) or found > CONFIG_FORMAT:
        raise ConfigFormatError(
            f"{path} has format {found!r}; this mtserve reads model dirs up to format {CONFIG_FORMAT}: "
            "upgrade mtserve to use this model"
        )
    return meta


def load_config(model_dir: str | Path) -> ModelConfig:
    return ModelConfig.from_dict(read_meta(model_dir)["model"])


def load_model(model_dir: str | Path, device: str | torch.device = "cpu") -> Transformer:
    cfg = load_config(model_dir)
    model = Transformer(cfg)
    model.load_state_dict(load_file(str(Path(model_dir) / WEIGHTS)))
    return model.to(device).eval()


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Element-wise mean of several checkpoints' parameters (Vaswani et al. average the last 5)."""
    avg = {}
    for k in states[0]:
        if states[0][k].is_floating_point():
            total = states[0][k].double()
            for s in states[1:]:
                total = total + s[k].double()
            avg[k] = total.div(len(states)).to(states[0][k].dtype)
        else:
            avg[k] = states[-1][k]
    return avg
