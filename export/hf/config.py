"""A Hugging Face config.json -> mtserve's `ModelConfig`, or an `HFImportError` naming the field
that mtserve cannot take.

Marian (`MarianMTModel`): post-norm layers, no final layer norms, static sinusoidal positions,
a final_logits_bias, decoding from <pad>. M2M100/NLLB (`M2M100ForConditionalGeneration`): pre-norm
layers with final layer norms, sinusoidal positions offset by padding_idx + 1, decoding from </s>.
Settings that transformers' code for the architecture ignores are refused when they say the
checkpoint was trained otherwise (e.g. `normalize_before` on a Marian model).

Every field read is checked before anything is allocated: integers within `BOUNDS` (each
dimension, layer count and the vocabulary), token ids within the vocabulary; a real checkpoint's
values are far inside them (NLLB-200 3.3B: d_model 2048, 24+24 layers, ffn 8192, 256,206 tokens)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.model import ModelConfig

MARIAN, M2M100 = "MarianMTModel", "M2M100ForConditionalGeneration"
ARCHITECTURES = (MARIAN, M2M100)
# HF activation_function -> ModelConfig.activation ("gelu" is the exact erf GELU in transformers).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# Norm placement and embedding settings each architecture's code implements: (field, value, what
# a different value would need). A field absent from config.json is fine.
FIXED = {
    MARIAN: (
        ("normalize_before", False, "pre-norm layers; Marian is post-norm"),
        ("add_final_layer_norm", False, "final layer norms; Marian has none"),
        ("normalize_embedding", False, "a layer norm on the embeddings"),
        ("layernorm_embedding", False, "a layer norm on the embeddings"),
        ("static_position_embeddings", True, "learned positions; Marian's are sinusoidal"),
        ("add_bias_logits", False, "a bias in the output projection"),
    ),
    M2M100: (
        ("normalize_before", True, "post-norm layers; M2M100 is pre-norm"),
        ("add_final_layer_norm", True, "no final layer norms; M2M100 has them"),
        ("normalize_embedding", False, "a layer norm on the embeddings"),
        ("layernorm_embedding", False, "a layer norm on the embeddings"),
    ),
}


# The integer fields read, with the smallest and largest value taken.
BOUNDS = {
    "vocab_size": (1, 1 << 20),
    "decoder_vocab_size": (1, 1 << 20),
    "d_model": (2, 8192),
    "encoder_attention_heads": (1, 128),
    "decoder_attention_heads": (1, 128),
    "encoder_layers": (1, 64),
    "decoder_layers": (1, 64),
    "encoder_ffn_dim": (1, 65536),
    "decoder_ffn_dim": (1, 65536),
    "max_position_embeddings": (2, 16384),
}
MAX_JSON_BYTES = 1 << 20  # config.json, generation_config.json, tokenizer_config.json
_BOOL_FIELDS = ("share_encoder_decoder_embeddings", "tie_word_embeddings", "scale_embedding")


class HFImportError(ValueError):
    """A Hugging Face folder mtserve cannot import; the message names the field or file at fault."""


@dataclass
class HFModel:
    architecture: str
    cfg: ModelConfig
    suppressed: list[int]  # token ids transformers' generation never produces (bad_words_ids)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(hf: dict[str, Any], key: str) -> int:
    """An integer field, within its BOUNDS."""
    if key not in hf or hf[key] is None:
        raise HFImportError(f"config.json: `{key}` is missing")
    value = hf[key]
    if not _is_int(value):
        raise HFImportError(f"config.json: `{key}` must be an integer, not {_short(value)}")
    low, high = BOUNDS.get(key, (0, 1 << 62))
    if not low <= value <= high:
        raise HFImportError(f"config.json: `{key}` is {value}; mtserve takes {low} to {high}")
    return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _token_id(hf: dict[str, Any], key: str, vocab: int) -> int:
    """A token id field: an integer in [0, vocab)."""
    value = hf.get(key)
    if value is None:
        raise HFImportError(f"config.json: `{key}` is missing")
    if not _is_int(value) or not 0 <= value < vocab:
        raise HFImportError(f"config.json: `{key}` is {_short(value)}; a token id is an integer from 0 to {vocab - 1}")
    return value


def _flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    value = hf.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HFImportError(f"config.json: `{key}` must be true or false, not {_short(value)}")
    return value


def _same(hf: dict[str, Any], enc: str, dec: str) -> int:
    a, b = _get(hf, enc), _get(hf, dec)
    if a != b:
        raise HFImportError(f"config.json: `{enc}` ({a}) != `{dec}` ({b}); mtserve needs them equal")
    return a


def architecture(hf: dict[str, Any]) -> str:
    archs = hf.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise HFImportError(
            f"config.json: `architectures` is {_short(archs)}; mtserve imports one of {list(ARCHITECTURES)}"
        )
    return archs[0]


def _check_fixed(hf: dict[str, Any], arch: str) -> None:
    for key, value, meaning in FIXED[arch]:
        if key in hf and hf[key] is not None and bool(hf[key]) != value:
            raise HFImportError(f"config.json: `{key}` is {hf[key]!r} ({meaning}); {arch} in mtserve needs {value}")


def suppressed_tokens(bad_words_ids: Any, vocab: int = 1 << 62) -> list[int]:
    """transformers' `bad_words_ids` as single tokens of the vocabulary; longer sequences are refused."""
    if not bad_words_ids:
        return []
    if not isinstance(bad_words_ids, list) or any(not isinstance(seq, list) or len(seq) != 1 for seq in bad_words_ids):
        raise HFImportError(f"`bad_words_ids` {_short(bad_words_ids)}: mtserve suppresses single tokens only")
    ids = [seq[0] for seq in bad_words_ids]
    if any(not _is_int(i) or not 0 <= i < vocab for i in ids):
        raise HFImportError(f"`bad_words_ids` {_short(bad_words_ids)}: token ids are integers from 0 to {vocab - 1}")
    return sorted(set(ids))


def _vocab_sizes(hf: dict[str, Any], arch: str) -> tuple[int, int | None]:
    """(target vocabulary, source vocabulary when the encoder has its own embedding)."""
    vocab = _get(hf, "vocab_size")
    if arch == MARIAN and not _flag(hf, "share_encoder_decoder_embeddings", True):
        target = _get(hf, "decoder_vocab_size") if hf.get("decoder_vocab_size") is not None else vocab
        return target, vocab
    return vocab, None


def _activation(hf: dict[str, Any], arch: str) -> str:
    act = hf.get("activation_function", "gelu" if arch == MARIAN else "relu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise HFImportError(f"config.json: `activation_function` {_short(act)} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def _special_ids(hf: dict[str, Any], vocab: int, src_vocab: int | None) -> tuple[int, int, int, int | None]:
    """pad, eos, decoder start and bos (None: none) ids, each in both vocabularies."""
    smallest = min(vocab, src_vocab or vocab)
    pad, eos = _token_id(hf, "pad_token_id", smallest), _token_id(hf, "eos_token_id", smallest)
    start = _token_id(hf, "decoder_start_token_id", vocab)
    value = hf.get("bos_token_id")
    bos = value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab else None
    return pad, eos, start, bos  # bos None: Marian's configs name none, or one it lacks


def model_config(hf: dict[str, Any], unk_id: int, generation: dict[str, Any] | None = None) -> HFModel:
    """The ModelConfig of a checked HF config; `unk_id` comes from the tokenizer, `generation` is
    generation_config.json (its bad_words_ids, like config.json's, are folded into the logits bias)."""
    arch = architecture(hf)
    _check_fixed(hf, arch)
    act = _activation(hf, arch)
    d_model, heads = _get(hf, "d_model"), _same(hf, "encoder_attention_heads", "decoder_attention_heads")
    if d_model % heads:
        raise HFImportError(f"config.json: `d_model` ({d_model}) is not divisible by the attention heads ({heads})")
    vocab, src_vocab = _vocab_sizes(hf, arch)
    if not 0 <= unk_id < vocab:
        raise HFImportError(f"the tokenizer's <unk> id {unk_id} is not in the model's vocabulary ({vocab})")
    pad, eos, start, bos = _special_ids(hf, vocab, src_vocab)
    suppressed = suppressed_tokens((generation or {}).get("bad_words_ids") or hf.get("bad_words_ids"), vocab)
    flags = {key: _flag(hf, key, arch == M2M100 or key != "scale_embedding") for key in _BOOL_FIELDS}
    cfg = ModelConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=heads,
        n_encoder_layers=_get(hf, "encoder_layers"),
        n_decoder_layers=_get(hf, "decoder_layers"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        dropout=0.0,
        max_positions=_get(hf, "max_position_embeddings"),
        pre_norm=arch == M2M100,
        tie_embeddings=flags["tie_word_embeddings"],
        pad_id=pad,
        bos_id=bos if bos is not None else start,  # Marian has no <s>
        eos_id=eos,
        unk_id=unk_id,
        activation=act,
        scale_embedding=flags["scale_embedding"],
        positions="table",
        logits_bias=arch == MARIAN or bool(suppressed),
        src_vocab_size=src_vocab,
        decoder_start_id=start,
    )
    return HFModel(arch, cfg, suppressed)


def read_json(path: Path, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON in `path` (a regular file of at most `limit` bytes, UTF-8); HFImportError naming
    the file otherwise."""
    if not path.is_file():
        raise HFImportError(f"{path.name}: not a regular file")
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise HFImportError(f"{path.name}: larger than {limit} bytes; mtserve reads at most that")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise HFImportError(f"{path.name}: not UTF-8 JSON ({e})") from None


def read_json_object(path: Path, limit: int = MAX_JSON_BYTES) -> dict[str, Any]:
    value = read_json(path, limit)
    if not isinstance(value, dict):
        raise HFImportError(f"{path.name}: must hold a JSON object, not {type(value).__name__}")
    return value
