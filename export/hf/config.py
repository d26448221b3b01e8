"""A Hugging Face config.json -> mtserve's `ModelConfig`, or an `HFImportError` naming the field
that mtserve cannot take.

Marian (`MarianMTModel`): post-norm layers, no final layer norms, static sinusoidal positions,
a final_logits_bias, decoding from <pad>. M2M100/NLLB (`M2M100ForConditionalGeneration`): pre-norm
layers with final layer norms, sinusoidal positions offset by padding_idx + 1, decoding from </s>.
Settings that transformers' code for the architecture ignores are refused when they say the
checkpoint was trained otherwise (e.g. `normalize_before` on a Marian model)."""

from __future__ import annotations

from dataclasses import dataclass
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


class HFImportError(ValueError):
    """A Hugging Face folder mtserve cannot import; the message names the field or file at fault."""


@dataclass
class HFModel:
    architecture: str
    cfg: ModelConfig
    suppressed: list[int]  # token ids transformers' generation never produces (bad_words_ids)


def _get(hf: dict[str, Any], key: str, kind: type = int) -> Any:
    if key not in hf or hf[key] is None:
        raise HFImportError(f"config.json: `{key}` is missing")
    value = hf[key]
    if kind is int and (not isinstance(value, int) or isinstance(value, bool)):
        raise HFImportError(f"config.json: `{key}` must be an integer, not {value!r}")
    return value


def _same(hf: dict[str, Any], enc: str, dec: str) -> int:
    a, b = _get(hf, enc), _get(hf, dec)
    if a != b:
        raise HFImportError(f"config.json: `{enc}` ({a}) != `{dec}` ({b}); mtserve needs them equal")
    return a


def architecture(hf: dict[str, Any]) -> str:
    archs = hf.get("architectures")
    if not isinstance(archs, list) or len(archs) != 1 or archs[0] not in ARCHITECTURES:
        raise HFImportError(f"config.json: `architectures` is {archs!r}; mtserve imports one of {list(ARCHITECTURES)}")
    return archs[0]


def _check_fixed(hf: dict[str, Any], arch: str) -> None:
    for key, value, meaning in FIXED[arch]:
        if key in hf and hf[key] is not None and bool(hf[key]) != value:
            raise HFImportError(f"config.json: `{key}` is {hf[key]!r} ({meaning}); {arch} in mtserve needs {value}")


def suppressed_tokens(bad_words_ids: Any) -> list[int]:
    """transformers' `bad_words_ids` as single tokens; longer sequences are refused."""
    if not bad_words_ids:
        return []
    if any(not isinstance(seq, list) or len(seq) != 1 for seq in bad_words_ids):
        raise HFImportError(f"`bad_words_ids` {bad_words_ids!r}: mtserve suppresses single tokens only")
    return sorted({seq[0] for seq in bad_words_ids})


def model_config(hf: dict[str, Any], unk_id: int, generation: dict[str, Any] | None = None) -> HFModel:
    """The ModelConfig of a checked HF config; `unk_id` comes from the tokenizer, `generation` is
    generation_config.json (its bad_words_ids, like config.json's, are folded into the logits bias)."""
    arch = architecture(hf)
    suppressed = suppressed_tokens((generation or {}).get("bad_words_ids") or hf.get("bad_words_ids"))
    _check_fixed(hf, arch)
    act = hf.get("activation_function", "gelu" if arch == MARIAN else "relu")
    if act not in ACTIVATIONS:
        raise HFImportError(f"config.json: `activation_function` {act!r} is not one of {sorted(ACTIVATIONS)}")
    d_model, heads = _get(hf, "d_model"), _same(hf, "encoder_attention_heads", "decoder_attention_heads")
    if d_model % heads:
        raise HFImportError(f"config.json: `d_model` ({d_model}) is not divisible by the attention heads ({heads})")
    pad, eos, start = _get(hf, "pad_token_id"), _get(hf, "eos_token_id"), _get(hf, "decoder_start_token_id")
    bos = hf.get("bos_token_id")
    vocab, src_vocab = _get(hf, "vocab_size"), None
    if arch == MARIAN and not hf.get("share_encoder_decoder_embeddings", True):
        vocab, src_vocab = hf.get("decoder_vocab_size") or vocab, vocab
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
        tie_embeddings=bool(hf.get("tie_word_embeddings", True)),
        pad_id=pad,
        bos_id=bos if isinstance(bos, int) else start,  # Marian has no <s>
        eos_id=eos,
        unk_id=unk_id,
        activation=ACTIVATIONS[act],
        scale_embedding=bool(hf.get("scale_embedding", arch == M2M100)),
        positions="table",
        logits_bias=arch == MARIAN or bool(suppressed),
        src_vocab_size=src_vocab,
        decoder_start_id=start,
    )
    return HFModel(arch, cfg, suppressed)
