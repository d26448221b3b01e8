"""Translate text with the ONNX graphs (the `onnx` engine of `mtserve evaluate`); no torch."""

from __future__ import annotations

from pathlib import Path

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

    def source_ids(self, texts: list[str]) -> list[list[int]]:
        return self.model.source_ids(texts)

    def translate_ids(
        self,
        src: list[list[int]],
        beam: int = 4,
        length_penalty: float = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        batch_size: int = 64,
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
        )
        return [h.tokens for h in hyps]

    def translate(self, texts: list[str], **kwargs) -> list[str]:
        return self.model.detokenize(self.translate_ids(self.source_ids(texts), **kwargs))
