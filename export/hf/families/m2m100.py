"""M2M100 and NLLB (`M2M100ForConditionalGeneration`): pre-norm layers with final layer norms,
sinusoidal positions offset by padding_idx + 1, decoding from </s>, ReLU and scaled embeddings
unless config.json says otherwise, no final_logits_bias. Its tokenizer is `M2M100Tokenizer`
(`tokenizer.import_m2m100`) or `NllbTokenizer` (`tokenizer.import_nllb`): every language of the
tokenizer, its token first on the source and forced first on the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from export.hf.config import ConfigRules
from export.hf.families.registry import Family, register_family
from export.hf.tokenizer import NLLB, ImportedTokenizer, import_m2m100, import_nllb, sentencepiece_bpe_files
from export.hf.weights import copy_norm
from export.model import ModelConfig


@register_family("M2M100ForConditionalGeneration")
class M2M100(Family):
    config_rules = ConfigRules(
        fixed=(
            ("normalize_before", True, "post-norm layers; M2M100 is pre-norm"),
            ("add_final_layer_norm", True, "no final layer norms; M2M100 has them"),
            ("normalize_embedding", False, "a layer norm on the embeddings"),
            ("layernorm_embedding", False, "a layer norm on the embeddings"),
        ),
        activation="relu",
        pre_norm=True,
        scale_embedding=True,
        separate_vocabs=False,
        logits_bias=False,
    )
    tokenizer_classes = ("M2M100Tokenizer", NLLB)

    def tokenizer_files(self, src: Path) -> list[str]:
        return sentencepiece_bpe_files(self.tokenizer_class(src))

    def import_tokenizer(
        self, src: Path, dst: Path, langs: tuple[str | None, str | None], texts: list[str], vocab_size: int
    ) -> ImportedTokenizer:
        if self.tokenizer_class(src) == NLLB:
            return import_nllb(src, dst, *langs, texts, vocab_size)
        return import_m2m100(src, dst, *langs, vocab_size)

    def model_class(self) -> Any:
        from transformers import M2M100ForConditionalGeneration

        return M2M100ForConditionalGeneration

    def position_table(self, hf_model: Any, cfg: ModelConfig) -> torch.Tensor:
        positions = hf_model.model.decoder.embed_positions
        offset = positions.padding_idx + 1  # M2M100 numbers real tokens from padding_idx + 1
        table = positions.get_embedding(offset + cfg.max_positions, cfg.d_model, positions.padding_idx)
        return table[offset:]

    def extra_weights(self, hf_model: Any, out: dict[str, torch.Tensor]) -> None:
        copy_norm(out, "encoder_norm", hf_model.model.encoder.layer_norm)
        copy_norm(out, "decoder_norm", hf_model.model.decoder.layer_norm)
