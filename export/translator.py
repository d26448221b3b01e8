"""Translate text with the PyTorch reference model (the `torch` engine of `mtserve evaluate`)."""

from __future__ import annotations

from pathlib import Path

import torch

from export.checkpoint import TOKENIZER, load_model
from export.generate import beam_search
from export.tokenizer import decode_batch, encode_batch, load_tokenizer


class TorchTranslator:
    def __init__(self, model_dir: str | Path, device: str = "cpu", threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.model = load_model(model_dir, device)
        self.tokenizer = load_tokenizer(Path(model_dir) / TOKENIZER)
        self.cfg = self.model.cfg

    def source_ids(self, texts: list[str]) -> list[list[int]]:
        limit = self.cfg.max_positions - 1
        return [ids[: limit - 1] + [self.cfg.eos_id] for ids in encode_batch(self.tokenizer, texts)]

    def translate_ids(
        self,
        src: list[list[int]],
        beam: int = 4,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 64,
    ) -> list[list[int]]:
        """Sorted by length into batches to keep padding low; results come back in input order."""
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        out: list[list[int]] = [[] for _ in src]
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            hyps = beam_search(self.model, [src[i] for i in idx], beam, length_penalty, max_len_a, max_len_b)
            for i, h in zip(idx, hyps):
                out[i] = h.tokens
        return out

    def translate(self, texts: list[str], **kwargs) -> list[str]:
        return decode_batch(self.tokenizer, self.translate_ids(self.source_ids(texts), **kwargs))
