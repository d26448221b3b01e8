"""The translation engine of one model version: validation, tokenisation, the split of a request
into sentences for its backend, and the reassembly of their results in request order.
`Engine.translate` (Translate), `Engine.translate_stream` (TranslateStream, service.engine.streaming)
and `Engine.encode` (Encode); TranslateMany runs each of its items as a Translate call through
service.engine.many.translate_many. No gRPC here: callers get the domain objects of
service.engine.requests and `ServiceError`s."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator

import numpy as np

from contract.manifest import Manifest
from service import tracing
from service.batching.jobs import EncodeJob, Sentence
from service.decoding.generator import Finished, max_output_len
from service.engine.backend import Backend
from service.engine.inference import Inference
from service.engine.languages import LanguagePair, ModelLanguages, Prefixes
from service.engine.requests import Alignment, Chunk, EncodingResult, TranslateOptions, TranslationResult
from service.engine.streaming import translate_stream
from service.engine.text import normalize_text
from service.errors import Cancelled, DeadlineExceeded, Internal, InvalidArgument
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer
from service.settings import Settings


def model_names(name: str) -> tuple[str, str]:
    """The names a served model has in KServe, (translation model, encoder model): also the
    `model` label of the per-model inference metrics that ModelStatistics reports."""
    return name, f"{name}-encoder"


class Engine:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        tokenizer: TextTokenizer,
        scheduler: Backend,
        metrics: ModelMetrics,
        provider: str,
        graph: str = "portable",
    ):
        self.settings, self.manifest, self.tokenizer = settings, manifest, tokenizer
        self.scheduler, self.metrics, self.provider = scheduler, metrics, provider
        self.graph = graph  # the decoder step the backend runs: "fused", "portable" or a custom backend's
        self.eos_id = manifest.special_ids.eos_id
        self.languages = ModelLanguages(manifest.languages)
        self.notes: list[str] = []  # how this version is served where it differs from what was asked (GetModelInfo)
        self.name, self.version = metrics.name, metrics.version  # as served: the repository's NAME/VERSION
        self.model_name = f"{self.name}:{self.version}"
        self.translation_model, self.encoder_model = model_names(self.name)

    # -- validation and tokenisation --------------------------------------------------

    def _check_texts(self, texts: list[str]) -> None:
        if not texts:
            raise InvalidArgument("texts", "at least one text is required")
        if len(texts) > self.settings.max_texts_per_request:
            raise InvalidArgument(
                "texts", f"{len(texts)} texts exceed max_texts_per_request ({self.settings.max_texts_per_request})"
            )

    def source_ids(self, texts: list[str], field: str = "texts", prefixes: Prefixes = Prefixes()) -> list[list[int]]:
        """Each text's source row: [source language token] + its ids + [</s>], all of which count
        against max_input_tokens."""
        limit = min(self.settings.max_input_tokens, self.manifest.dims.max_positions - 1)
        lead = list(prefixes.source)
        clean = []
        for i, t in enumerate(texts):
            name = f"{field}[{i}]" if field == "texts" else field
            # The size limit first, on the text as sent: it bounds the normalisation's work too.
            if len(t.encode("utf-8", "surrogatepass")) > self.settings.max_text_bytes:
                raise InvalidArgument(name, f"text exceeds max_text_bytes ({self.settings.max_text_bytes})")
            c = normalize_text(t)
            if not c:
                raise InvalidArgument(name, "text is empty once whitespace, control and format characters are removed")
            clean.append(c)
        # One text at a time on this thread: `encode_batch` hands even one text to the tokenizers'
        # thread pool and blocks the event loop until a pool thread, competing with the decode
        # workers for the cores, has run it (a tenth of the loop's time at c64, docs/performance.md).
        ids = [lead + self.tokenizer.encode(c) for c in clean]
        for i, s in enumerate(ids):
            if len(s) + 1 > limit:
                name = f"{field}[{i}]" if field == "texts" else field
                raise InvalidArgument(name, f"{len(s) + 1} tokens exceed max_input_tokens ({limit})")
        return [s + [self.eos_id] for s in ids]

    def _mode(self, opts: TranslateOptions) -> tuple[int, float]:
        st, gen = self.settings, self.manifest.generation
        beam = opts.beam_size or st.default_beam_size
        if not 1 <= beam <= st.max_beam_size:
            raise InvalidArgument(
                "options.beam_size", f"{opts.beam_size} is outside 0..{st.max_beam_size} (0 = default)"
            )
        if not 0 <= opts.max_output_tokens <= st.max_output_tokens:
            raise InvalidArgument(
                "options.max_output_tokens",
                f"{opts.max_output_tokens} is outside 0..{st.max_output_tokens} (0 = default)",
            )
        lp = gen.length_penalty if opts.length_penalty is None else opts.length_penalty
        if not math.isfinite(lp) or not 0.0 <= lp <= 10.0:
            raise InvalidArgument("options.length_penalty", f"{opts.length_penalty} is outside 0..10")
        cap = self._cap(opts)
        if not 0 <= opts.min_output_tokens < cap:
            raise InvalidArgument(
                "options.min_output_tokens",
                f"{opts.min_output_tokens} is outside 0..{cap - 1} (below the cap of {cap} generated tokens, "
                "which counts the final </s>)",
            )
        return beam, float(lp)

    def _cap(self, opts: TranslateOptions) -> int:
        """Generated tokens a sentence may have at most, </s> included: the request's
        max_output_tokens, else the server's, within the position table."""
        cap = opts.max_output_tokens or self.settings.max_output_tokens
        return min(cap, self.manifest.dims.max_positions - 1)

    def sentences(
        self, src: list[list[int]], opts: TranslateOptions, timeout: float | None, prefixes: Prefixes = Prefixes()
    ) -> list[Sentence]:
        """The sentences of `src` to queue. A sentence's max_len (tokens it may emit) is the model's
        length rule, which counts the forced target prefix as the reference does, raised to fit
        min_output_tokens, within the request's cap; the cap and min_output_tokens count output
        tokens, without the prefix (which the decoder emits first and leaves out of the output)."""
        beam, lp = self._mode(opts)
        gen = self.manifest.generation
        cap = self._cap(opts)
        forced = list(prefixes.target)
        room = self.manifest.dims.max_positions - 1 - len(forced)  # the position table's room left
        if timeout is not None and timeout <= 0:
            raise DeadlineExceeded("deadline expired before the request was queued")
        deadline = time.monotonic() + timeout if timeout is not None else None
        return [
            Sentence(
                src_ids=s,
                beam=beam,
                length_penalty=lp,
                max_len=min(
                    cap + len(forced),
                    room + len(forced),
                    max(
                        opts.min_output_tokens + 1 + len(forced),
                        max_output_len(len(s), gen.max_len_a, gen.max_len_b, self.manifest.dims.max_positions),
                    ),
                ),
                min_len=opts.min_output_tokens,
                target_prefix=forced,
                want_alignment=opts.return_alignment,
                want_scores=opts.return_scores,
                deadline=deadline,
            )
            for s in src
        ]

    def _token_strings(self, ids: list[int]) -> list[str]:
        """The vocabulary entries of `ids`. Every id comes from this tokenizer or from the model
        exported with it, so one without an entry means the export and the tokenizer disagree."""
        tokens: list[str] = []
        for i in ids:
            token = self.tokenizer.id_to_token(i)
            if token is None:
                raise Internal(f"token id {i} is not in the tokenizer's vocabulary")
            tokens.append(token)
        return tokens

    def result(self, src: list[int], finished: Finished, opts: TranslateOptions) -> TranslationResult:
        ids = list(finished.tokens)
        # Token strings only when the caller asked for them: this runs for every sentence.
        tokens = self._token_strings(ids) if opts.return_tokens or opts.return_alignment else []
        result = TranslationResult(
            text=self.tokenizer.decode(ids).strip(),
            score=None if finished.score is None else float(finished.score),
            tokens=tokens,
            token_ids=ids,
            input_tokens=len(src),
            output_tokens=len(ids) + 1,
        )
        if opts.return_alignment and finished.alignment is not None:
            result.alignment = Alignment(
                source_tokens=self._token_strings(src),
                target_tokens=tokens + ["</s>"],
                weights=np.asarray(finished.alignment, dtype=np.float32)[: len(ids) + 1, : len(src)],
            )
        return result

    # -- the calls ------------------------------------------------------------------------

    async def translate(
        self,
        texts: list[str],
        opts: TranslateOptions,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
        field_prefix: str = "",
    ) -> list[TranslationResult]:
        """`pair`: the request's languages (a multilingual model needs them; `field_prefix` + the
        field names the one missing, "request." for a TranslateMany item)."""
        inference = Inference(self.metrics, self.translation_model)
        try:
            self._check_texts(texts)
            prefixes = self.languages.prefixes(pair, field_prefix)
            src = self.source_ids(texts, prefixes=prefixes)
            sentences = self.sentences(src, opts, timeout, prefixes)
            self.trace(self.translation_model, sentences)
            inference.submit()
            self.scheduler.submit(sentences)
            futures = [asyncio.wrap_future(s.future) for s in sentences]
            try:
                finished = await asyncio.gather(*futures)
            except BaseException:
                for f in futures:  # a failed or cancelled request frees all its rows
                    f.cancel()
                raise
            inference.compute_done(sentences)
            results = [self.result(s, f, opts) for s, f in zip(src, finished)]
        except BaseException:
            inference.failed()
            raise
        inference.succeeded(len(texts))
        return results

    def trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None:
        """The model on the current (RPC) span, and the sentences' spans under it, when traced."""
        if tracing.tracer is not None:
            tracing.annotate({"mtserve.model": model, "mtserve.texts": len(sentences) if sentences else texts})
            if sentences:
                tracing.follow(sentences)

    def translate_stream(
        self, text: str, opts: TranslateOptions, timeout: float | None = None, pair: LanguagePair = LanguagePair()
    ) -> AsyncIterator[Chunk | TranslationResult]:
        """Chunks of the translation of `text` as they are decoded, then its result."""
        return translate_stream(self, text, opts, timeout, pair)

    async def encode(
        self,
        texts: list[str],
        return_token_embeddings: bool,
        timeout: float | None = None,
        pair: LanguagePair = LanguagePair(),
    ) -> list[EncodingResult]:
        """`pair`: a multilingual model's source language token leads each source, when it has one
        (the target language plays no part in encoding)."""
        inference = Inference(self.metrics, self.encoder_model)
        try:
            self._check_texts(texts)
            src = self.source_ids(texts, prefixes=self.languages.prefixes(pair, need_target=False))
            self.trace(self.encoder_model, texts=len(src))
            jobs = [EncodeJob(src_ids=s) for s in src]
            inference.submit()
            self.scheduler.submit_encode(jobs)
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
                    tokens=self._token_strings(s),
                    token_embeddings=m if return_token_embeddings else None,
                )
                for s, m in zip(src, memories)
            ]
        except BaseException:
            inference.failed()
            raise
        inference.succeeded(len(texts))
        return results

    def model_info(self) -> dict:
        m, d, st = self.manifest, self.manifest.dims, self.settings
        return {
            "name": self.name,
            "version": self.version,
            "source_language": m.src_lang,
            "target_language": m.tgt_lang,
            "precision": st.precision,
            "execution_provider": self.provider,
            "decoder_graph": self.graph,
            "notes": list(self.notes),
            "vocab_size": d.vocab_size,
            "d_model": d.d_model,
            "n_heads": d.n_heads,
            "n_encoder_layers": d.n_encoder_layers,
            "n_decoder_layers": d.n_decoder_layers,
            "max_positions": d.max_positions,
            "opset": m.opset,
            "max_len_a": m.generation.max_len_a,
            "max_len_b": m.generation.max_len_b,
            "length_penalty": m.generation.length_penalty,
            "files_sha256": m.checksums(st.precision, self.graph) if m.has(st.precision, self.graph) else {},
            "tool_versions": dict(m.tool_versions),
            "limits": {
                "max_texts_per_request": st.max_texts_per_request,
                "max_input_tokens": st.max_input_tokens,
                "max_output_tokens": st.max_output_tokens,
                "max_beam_size": st.max_beam_size,
                "default_beam_size": st.default_beam_size,
                "max_batch_sentences": st.max_batch_sentences,
                "max_batch_tokens": st.max_batch_tokens,
                "max_queue_size": st.max_queue_size,
                "zero_means": self.zero_means(),
            },
        }

    def zero_means(self) -> dict[str, str]:
        """What each request option left at 0 (or unset) means here, with this server's numbers:
        GetModelInfo's `Limits.zero_means`, for clients that know the API from reflection alone."""
        st, gen = self.settings, self.manifest.generation
        return {
            "options.beam_size": f"the server default, default_beam_size ({st.default_beam_size}); "
            f"1 = greedy search; at most max_beam_size ({st.max_beam_size})",
            "options.max_output_tokens": "no cap but the model's length rule "
            f"(max_len_a * source tokens + max_len_b = {gen.max_len_a:g} * n + {gen.max_len_b}) "
            f"and the server's max_output_tokens ({st.max_output_tokens}); else a cap of 1..{st.max_output_tokens}",
            "options.min_output_tokens": "no minimum: </s> may end the translation at any step; "
            "else at least that many tokens before </s>, below the cap on generated tokens",
            "options.length_penalty": f"unset: the model's length_penalty ({gen.length_penalty:g}); "
            "0 is 0 (scores not normalised by length); at most 10",
            "timeout_ms": "no deadline of the item's own: only the stream's deadline applies",
        }
