"""Marian (OPUS-MT, `MarianMTModel`): post-norm layers, no final layer norms, static sinusoidal
positions, a final_logits_bias, decoding from <pad>, GELU and unscaled embeddings unless
config.json says otherwise, a separate source vocabulary when the embeddings are not shared.
Its tokenizer is `MarianTokenizer` (`tokenizer.import_marian`): one language pair, no language
tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from export.hf.config import ConfigRules
from export.hf.families.registry import Family, register_family
from export.hf.tokenizer import ImportedTokenizer, import_marian, marian_files
from export.model import ModelConfig


@register_family("MarianMTModel")
class Marian(Family):
    config_rules = ConfigRules(
        fixed=(
            ("normalize_before", False, "pre-norm layers; Marian is post-norm"),
            ("add_final_layer_norm", False, "final layer norms; Marian has none"),
            ("normalize_embedding", False, "a layer norm on the embeddings"),
            ("layernorm_embedding", False, "a layer norm on the embeddings"),
            ("static_position_embeddings", True, "learned positions; Marian's are sinusoidal"),
            ("add_bias_logits", False, "a bias in the output projection"),
        ),
        activation="gelu",
        pre_norm=False,
        scale_embedding=False,
        separate_vocabs=True,
        logits_bias=True,
    )
    tokenizer_classes = ("MarianTokenizer",)

    def tokenizer_files(self, src: Path) -> list[str]:
        self.tokenizer_class(src)
        return marian_files(src)

    def import_tokenizer(
        self, src: Path, dst: Path, langs: tuple[str | None, str | None], texts: list[str], vocab_size: int
    ) -> ImportedTokenizer:
        return import_marian(src, dst, *langs, vocab_size)

    def model_class(self) -> Any:
        from transformers import MarianMTModel

        return MarianMTModel

    def position_table(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        return hf_model.model.decoder.embed_positions.create_weight()[: cfg.max_positions]

    def logits_bias(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        return hf_model.final_logits_bias[0]
