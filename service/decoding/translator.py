"""Translate text with the ONNX graphs (the `onnx` engine of `mtserve evaluate`); no torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.decoding.generator import generate
from service.runtime.onnx_model import OnnxSeq2Seq


class OnnxTranslator:
    """Same interface as export.translator.TorchTranslator, over an ONNX export dir (or a model dir
    with an `onnx/` subdir)."""

    def __init__(
        self,
        model_dir: str | Path,
        precision: str = "fp32",
        device: str = "cpu",
        threads: int = 0,
        strict: bool = False,
        graph: str = "auto",
    ):
        self.model = OnnxSeq2Seq(
            model_dir,
            precision=precision,
            provider=device,
            intra_op_threads=threads,
            inter_op_threads=1,
            strict=strict,
            graph=graph,
        )
        self.tokenizer = self.model.tokenizer

    def source_ids(self, texts: list[str], src_lang: str | None = None) -> list[list[int]]:
        """[source-language token, for a multilingual model] + the text's ids + [</s>]; the
        manifest's src_lang by default."""
        return self.model.source_ids(texts, src_lang or "")

    def forced_token(self, tgt_lang: str | None = None) -> int | None:
        """The token forced first on the target, for a multilingual model (the manifest's tgt_lang
        by default); None for one-pair models."""
        forced = self.model.prefixes(target_language=tgt_lang or "")[1]
        return forced[0] if forced else None

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
        hyps = generate(
            self.model,
            src,
            beam=beam,
            length_penalty=length_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            batch_size=batch_size,
            want_scores=False,  # tokens only: greedy search skips the log-softmax
            target_prefixes=None if forced is None else [[forced]] * len(src),
        )
        return [h.tokens for h in hyps]

    def translate(
        self, texts: list[str], src_lang: str | None = None, tgt_lang: str | None = None, **kwargs: Any
    ) -> list[str]:
        src = self.source_ids(texts, src_lang)
        return self.model.detokenize(self.translate_ids(src, forced=self.forced_token(tgt_lang), **kwargs))
