"""Encode: a request's texts through the model's encoder, each text's mean-pooled vector (and
its per-token vectors when asked)."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from contract.manifest import Manifest
from service.batching.jobs import EncodeJob, Sentence
from service.engine.backend import Backend
from service.engine.inference import Inference
from service.engine.languages import LanguagePair, ModelLanguages, Prefixes
from service.engine.requests import EncodingResult
from service.engine.row_results import token_strings
from service.engine.work import NO_CHECK, Checkpoint, TextWork
from service.errors import Cancelled, DeadlineExceeded
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer


class EncodingEngine(Protocol):
    """What `encode` needs of service.engine.engine.Engine."""

    metrics: ModelMetrics
    encoder_model: str
    languages: ModelLanguages
    work: TextWork
    scheduler: Backend
    manifest: Manifest
    tokenizer: TextTokenizer

    def check_texts(self, texts: list[str]) -> None: ...

    def check_sizes(
        self, texts: list[str], field: str = "texts", prefixes: list[str] | None = None, prefix_field: str = ""
    ) -> int: ...

    def source_ids(
        self, texts: list[str], field: str = "texts", prefixes: Prefixes = Prefixes(), point: Checkpoint = NO_CHECK
    ) -> list[list[int]]: ...

    def trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None: ...


async def encode(
    engine: EncodingEngine,
    texts: list[str],
    return_token_embeddings: bool,
    timeout: float | None = None,
    pair: LanguagePair = LanguagePair(),
) -> list[EncodingResult]:
    """`pair`: a multilingual model's source language token leads each source, when it has one
    (the target language plays no part in encoding)."""
    inference = Inference(engine.metrics, engine.encoder_model)
    try:
        engine.check_texts(texts)
        lead = engine.languages.prefixes(pair, need_target=False)
        size = engine.check_sizes(texts)
        started = time.monotonic()
        src = await engine.work.run(lambda point: engine.source_ids(texts, prefixes=lead, point=point), size, timeout)
        if timeout is not None:
            timeout -= time.monotonic() - started
        engine.trace(engine.encoder_model, texts=len(src))
        jobs = [EncodeJob(src_ids=s) for s in src]
        inference.submit()
        engine.scheduler.submit_encode(jobs)
        futures = [asyncio.wrap_future(j.future) for j in jobs]
        try:
            memories = await asyncio.wait_for(asyncio.gather(*futures), timeout)
        except TimeoutError:
            raise DeadlineExceeded("deadline expired before the texts were encoded") from None
        except asyncio.CancelledError:
            for f in futures:
                f.cancel()
            raise Cancelled("request cancelled") from None
        inference.compute_done()
        results = [
            EncodingResult(
                pooled=m.mean(axis=0),
                tokens=token_strings(engine.tokenizer, engine.manifest.dims.vocab_size, s),
                token_embeddings=m if return_token_embeddings else None,
            )
            for s, m in zip(src, memories)
        ]
    except BaseException:
        inference.failed()
        raise
    inference.succeeded(len(texts))
    return results
