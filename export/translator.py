"""Translate text with the PyTorch reference model (the `torch` engine of `mtserve evaluate`).

Multilingual (imported M2M100/NLLB) models put the source language's token first on the source
and force the target language's token as the first generated one (config.json's `languages`)."""

from __future__ import annotations

from pathlib import Path

import torch

from export.checkpoint import load_model, read_meta
from export.generate import beam_search
from export.tokenizer import decode_batch, encode_batch, load_model_tokenizer


class TorchTranslator:
    def __init__(self, model_dir: str | Path, device: str = "cpu", threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.model = load_model(model_dir, device)
        self.tokenizer = load_model_tokenizer(model_dir)
        self.cfg = self.model.cfg
        meta = read_meta(model_dir)
        languages = meta.get("languages", {})
        self.src_lang, self.tgt_lang = meta.get("src_lang"), meta.get("tgt_lang")
        self.source_tokens: dict[str, int] = languages.get("source_tokens", {})
        self.target_tokens: dict[str, int] = languages.get("target_tokens", {})

    def source_ids(self, texts: list[str], src_lang: str | None = None) -> list[list[int]]:
        """[source-language token] + the text's ids + [</s>], cut to fit max_positions."""
        lang = src_lang or self.src_lang
        prefix = [self.source_tokens[lang]] if lang in self.source_tokens else []
        limit = self.cfg.max_positions - 1 - len(prefix)
        return [prefix + ids[: limit - 1] + [self.cfg.eos_id] for ids in encode_batch(self.tokenizer, texts)]

    def forced_token(self, tgt_lang: str | None = None) -> int | None:
        """The token forced first on the target, for a multilingual model."""
        return self.target_tokens.get(tgt_lang or self.tgt_lang or "")

    def translate_ids(
        self,
        src: list[list[int]],
        beam: int = 4,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 64,
        forced: int | None = None,
    ) -> list[list[int]]:
        """Sorted by length into batches to keep padding low; results come back in input order."""
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        out: list[list[int]] = [[] for _ in src]
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = [src[i] for i in idx]
            hyps = beam_search(self.model, batch, beam, length_penalty, max_len_a, max_len_b, forced=forced)
            for i, h in zip(idx, hyps):
                out[i] = h.tokens
        return out

    def translate(
        self, texts: list[str], src_lang: str | None = None, tgt_lang: str | None = None, **kwargs
    ) -> list[str]:
        src = self.source_ids(texts, src_lang)
        return decode_batch(self.tokenizer, self.translate_ids(src, forced=self.forced_token(tgt_lang), **kwargs))
