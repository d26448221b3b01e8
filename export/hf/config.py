"""A Hugging Face config.json -> mtserve's `ModelConfig`, or an `HFImportError` naming the field
that mtserve cannot take.

What differs between model families (norm placement, defaults, vocabularies) comes in a
`ConfigRules`, each family's own (export/hf/families/). Settings that transformers' code for the
architecture ignores are refused when they say the checkpoint was trained otherwise (e.g.
`normalize_before` on a Marian model): the rules' `fixed` fields.

Every field read is checked before anything is allocated: integers within `BOUNDS` (each
dimension, layer count and the vocabulary), token ids within the vocabulary; a real checkpoint's
values are far inside them (NLLB-200 3.3B: d_model 2048, 24+24 layers, ffn 8192, 256,206 tokens)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from export.model import ModelConfig

# HF activation_function -> ModelConfig.activation ("gelu" is the exact erf GELU in transformers).
ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
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


@dataclass(frozen=True)
class ConfigRules:
    """What a model family's transformers code fixes or defaults in config.json."""

    # (field, value, what a different value would need): settings the family's code implements; a
    # field absent from config.json is fine.
    fixed: tuple[tuple[str, bool, str], ...]
    activation: str  # `activation_function` when config.json names none
    pre_norm: bool  # norm before each block, with final layer norms
    scale_embedding: bool  # `scale_embedding` when config.json names none
    separate_vocabs: bool  # `share_encoder_decoder_embeddings` false gives the encoder its own vocabulary
    logits_bias: bool  # the checkpoint has a final_logits_bias


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
        raise HFImportError(f"config.json: `{key}` must be an integer, not {short(value)}")
    low, high = BOUNDS.get(key, (0, 1 << 62))
    if not low <= value <= high:
        raise HFImportError(f"config.json: `{key}` is {value}; mtserve takes {low} to {high}")
    return value


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _token_id(hf: dict[str, Any], key: str, vocab: int) -> int:
    """A token id field: an integer in [0, vocab)."""
    value = hf.get(key)
    if value is None:
        raise HFImportError(f"config.json: `{key}` is missing")
    if not _is_int(value) or not 0 <= value < vocab:
        raise HFImportError(f"config.json: `{key}` is {short(value)}; a token id is an integer from 0 to {vocab - 1}")
    return value


def _flag(hf: dict[str, Any], key: str, default: bool) -> bool:
    value = hf.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise HFImportError(f"config.json: `{key}` must be true or false, not {short(value)}")
    return value


def _same(hf: dict[str, Any], enc: str, dec: str) -> int:
    a, b = _get(hf, enc), _get(hf, dec)
    if a != b:
        raise HFImportError(f"config.json: `{enc}` ({a}) != `{dec}` ({b}); mtserve needs them equal")
    return a


def _check_fixed(hf: dict[str, Any], arch: str, rules: ConfigRules) -> None:
    for key, value, meaning in rules.fixed:
        if key in hf and hf[key] is not None and bool(hf[key]) != value:
            raise HFImportError(f"config.json: `{key}` is {hf[key]!r} ({meaning}); {arch} in mtserve needs {value}")


def suppressed_tokens(bad_words_ids: Any, vocab: int = 1 << 62) -> list[int]:
    """transformers' `bad_words_ids` as single tokens of the vocabulary; longer sequences are refused."""
    if not bad_words_ids:
        return []
    if not isinstance(bad_words_ids, list) or any(not isinstance(seq, list) or len(seq) != 1 for seq in bad_words_ids):
        raise HFImportError(f"`bad_words_ids` {short(bad_words_ids)}: mtserve suppresses single tokens only")
    ids = [seq[0] for seq in bad_words_ids]
    if any(not _is_int(i) or not 0 <= i < vocab for i in ids):
        raise HFImportError(f"`bad_words_ids` {short(bad_words_ids)}: token ids are integers from 0 to {vocab - 1}")
    return sorted(set(ids))


def _vocab_sizes(hf: dict[str, Any], rules: ConfigRules) -> tuple[int, int | None]:
    """(target vocabulary, source vocabulary when the encoder has its own embedding)."""
    vocab = _get(hf, "vocab_size")
    if rules.separate_vocabs and not _flag(hf, "share_encoder_decoder_embeddings", True):
        target = _get(hf, "decoder_vocab_size") if hf.get("decoder_vocab_size") is not None else vocab
        return target, vocab
    return vocab, None


def _activation(hf: dict[str, Any], rules: ConfigRules) -> str:
    act = hf.get("activation_function", rules.activation)
    if not isinstance(act, str) or act not in ACTIVATIONS:
        raise HFImportError(f"config.json: `activation_function` {short(act)} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[act]


def _special_ids(hf: dict[str, Any], vocab: int, src_vocab: int | None) -> tuple[int, int, int, int | None]:
    """pad, eos, decoder start and bos (None: none) ids, each in both vocabularies."""
    smallest = min(vocab, src_vocab or vocab)
    pad, eos = _token_id(hf, "pad_token_id", smallest), _token_id(hf, "eos_token_id", smallest)
    start = _token_id(hf, "decoder_start_token_id", vocab)
    value = hf.get("bos_token_id")
    bos = value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab else None
    return pad, eos, start, bos  # bos None: Marian's configs name none, or one it lacks


def model_config(
    hf: dict[str, Any], arch: str, rules: ConfigRules, unk_id: int, generation: dict[str, Any] | None = None
) -> HFModel:
    """The ModelConfig of a checked HF config of architecture `arch`, whose family has `rules`;
    `unk_id` comes from the tokenizer, `generation` is generation_config.json (its bad_words_ids,
    like config.json's, are folded into the logits bias)."""
    _check_fixed(hf, arch, rules)
    act = _activation(hf, rules)
    d_model, heads = _get(hf, "d_model"), _same(hf, "encoder_attention_heads", "decoder_attention_heads")
    if d_model % heads:
        raise HFImportError(f"config.json: `d_model` ({d_model}) is not divisible by the attention heads ({heads})")
    vocab, src_vocab = _vocab_sizes(hf, rules)
    if not 0 <= unk_id < vocab:
        raise HFImportError(f"the tokenizer's <unk> id {unk_id} is not in the model's vocabulary ({vocab})")
    pad, eos, start, bos = _special_ids(hf, vocab, src_vocab)
    suppressed = suppressed_tokens((generation or {}).get("bad_words_ids") or hf.get("bad_words_ids"), vocab)
    flags = {key: _flag(hf, key, rules.scale_embedding if key == "scale_embedding" else True) for key in _BOOL_FIELDS}
    cfg = ModelConfig(
        vocab_size=vocab,
        d_model=d_model,
        n_heads=heads,
        n_encoder_layers=_get(hf, "encoder_layers"),
        n_decoder_layers=_get(hf, "decoder_layers"),
        d_ff=_same(hf, "encoder_ffn_dim", "decoder_ffn_dim"),
        dropout=0.0,
        max_positions=_get(hf, "max_position_embeddings"),
        pre_norm=rules.pre_norm,
        tie_embeddings=flags["tie_word_embeddings"],
        pad_id=pad,
        bos_id=bos if bos is not None else start,  # Marian has no <s>
        eos_id=eos,
        unk_id=unk_id,
        activation=act,
        scale_embedding=flags["scale_embedding"],
        positions="table",
        logits_bias=rules.logits_bias or bool(suppressed),
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
