"""The translation engine: validation, tokenisation, the split of a request into sentences for
the scheduler, and the reassembly of their results in request order. No gRPC here: callers get
domain objects and `ServiceError`s."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from contract.manifest import Manifest
from service import tracing
from service.batching.jobs import EncodeJob, Sentence
from service.decoding.generator import max_output_len
from service.engine.backend import Backend
from service.engine.text import normalize_text
from service.errors import Cancelled, DeadlineExceeded, Internal, InvalidArgument, ServiceError
from service.metrics import Metrics, ModelMetrics
from service.settings import Settings


@dataclass
class TranslateOptions:
    beam_size: int = 0  # 0 = default
    max_output_tokens: int = 0  # 0 = the model's length rule only
    length_penalty: float | None = None
    return_scores: bool = False
    return_tokens: bool = False
    return_alignment: bool = False


@dataclass
class Alignment:
    source_tokens: list[str]
    target_tokens: list[str]
    weights: np.ndarray  # (len(target_tokens), len(source_tokens))


@dataclass
class TranslationResult:
    text: str
    score: float | None  # None unless return_scores (greedy search then skips the log-softmax)
    tokens: list[str]
    token_ids: list[int]
    input_tokens: int
    output_tokens: int
    alignment: Alignment | None = None


@dataclass
class Chunk:
    text: str
    token_ids: list[int]


@dataclass
class StreamItem:
    """One item of a TranslateMany stream: a Translate call of its own."""

    id: str
    texts: list[str]
    options: TranslateOptions
    timeout: float | None = None  # seconds from arrival; None = only the stream's deadline
    model: str = ""  # NAME or NAME:VERSION; empty: the default model


ItemTranslator = Callable[[StreamItem, float | None], Awaitable[list[TranslationResult]]]
"""Translates one TranslateMany item within a time limit (seconds), on the model it names."""


@dataclass
class _Answer:
    """A TranslateMany item's answer, waiting to be taken from the stream."""

    item: StreamItem
    outcome: list[TranslationResult] | Exception
    owns_id: bool  # False for a refused duplicate: its answer leaves the first item's id in use


@dataclass
class _End:
    """The last entry of a TranslateMany stream's answers: every item answered, or the request
    stream itself failed with `error`."""

    error: Exception | None = None


@dataclass
class EncodingResult:
    pooled: np.ndarray  # (d_model,)
    tokens: list[str]
    token_embeddings: np.ndarray | None  # (tokens, d_model)


def model_names(name: str) -> tuple[str, str]:
    """The names a served model has in KServe, (translation model, encoder model): also the
    `model` label of the per-model inference metrics that ModelStatistics reports."""
    return name, f"{name}-encoder"


class _Inference:
    """One inference request's phases (monotonic clock), recorded in the per-model metrics that
    KServe ModelStatistics reads: once it succeeded, its duration and that of each phase, which
    add up to it (compute_input: validation and tokenisation; queue: until its last sentence
    joined a decode batch; compute_infer: until its last sentence finished; compute_output:
    detokenisation); once it failed, its duration."""

    def __init__(self, metrics: ModelMetrics, model: str):
        self.metrics, self.model = metrics.server, model
        self.version = metrics.version
        self.start = self.submitted = self.computed = time.monotonic()
        self.admitted: float | None = None
        self.recorded = False

    def submit(self) -> None:
        self.submitted = time.monotonic()

    def compute_done(self, sentences: list[Sentence] | None = None) -> None:
        """The backend answered. Without admission stamps (an Encode request, or sentences decoded
        in an engine process, whose stamps stay there) the queue counts as 0, its time as compute."""
        self.computed = time.monotonic()
        stamps = [s.admitted for s in sentences or ()]
        if stamps and all(t is not None for t in stamps):
            self.admitted = min(max(max(stamps), self.submitted), self.computed)  # type: ignore[type-var]

    def succeeded(self, texts: int) -> None:
        end, m, model = time.monotonic(), self.metrics, (self.model, self.version)
        queued = self.submitted if self.admitted is None else self.admitted
        for phase, seconds in (
            ("compute_input", self.submitted - self.start),
            ("queue", queued - self.submitted),
            ("compute_infer", self.computed - queued),
            ("compute_output", end - self.computed),
        ):
            m.inference_phase.labels(*model, phase).observe(seconds)
        m.inference_duration.labels(*model, "success").observe(end - self.start)
        m.inferences.labels(*model).inc(texts)
        m.last_inference.labels(*model).set(time.time())
        self.recorded = True

    def failed(self) -> None:
        if not self.recorded:
            model = (self.model, self.version)
            self.metrics.inference_duration.labels(*model, "failure").observe(time.monotonic() - self.start)
            self.metrics.last_inference.labels(*model).set(time.time())
            self.recorded = True


class Engine:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        tokenizer: Tokenizer,
        scheduler: Backend,
        metrics: ModelMetrics,
        provider: str,
        graph: str = "portable",
    ):
        self.settings, self.manifest, self.tokenizer = settings, manifest, tokenizer
        self.scheduler, self.metrics, self.provider = scheduler, metrics, provider
        self.graph = graph  # the decoder step the backend runs: "fused", "portable" or a custom backend's
        self.eos_id = manifest.special_ids.eos_id
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

    def _source_ids(self, texts: list[str], field: str = "texts") -> list[list[int]]:
        limit = min(self.settings.max_input_tokens, self.manifest.dims.max_positions - 1)
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
        ids = [self.tokenizer.encode(c, add_special_tokens=False).ids for c in clean]
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
        return beam, float(lp)

    def _sentences(self, src: list[list[int]], opts: TranslateOptions, timeout: float | None) -> list[Sentence]:
        beam, lp = self._mode(opts)
        gen = self.manifest.generation
        cap = opts.max_output_tokens or self.settings.max_output_tokens
        if timeout is not None and timeout <= 0:
            raise DeadlineExceeded("deadline expired before the request was queued")
        deadline = time.monotonic() + timeout if timeout is not None else None
        return [
            Sentence(
                src_ids=s,
                beam=beam,
                length_penalty=lp,
                max_len=min(
                    cap, max_output_len(len(s), gen.max_len_a, gen.max_len_b, self.manifest.dims.max_positions)
                ),
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

    def _result(self, src: list[int], finished, opts: TranslateOptions) -> TranslationResult:
        ids = list(finished.tokens)
        # Token strings only when the caller asked for them: this runs for every sentence.
        tokens = self._token_strings(ids) if opts.return_tokens or opts.return_alignment else []
        result = TranslationResult(
            text=self.tokenizer.decode(ids, skip_special_tokens=True).strip(),
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
        self, texts: list[str], opts: TranslateOptions, timeout: float | None = None
    ) -> list[TranslationResult]:
        inference = _Inference(self.metrics, self.translation_model)
        try:
            self._check_texts(texts)
            src = self._source_ids(texts)
            sentences = self._sentences(src, opts, timeout)
            self._trace(self.translation_model, sentences)
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
            results = [self._result(s, f, opts) for s, f in zip(src, finished)]
        except BaseException:
            inference.failed()
            raise
        inference.succeeded(len(texts))
        return results

    def _trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None:
        """The model on the current (RPC) span, and the sentences' spans under it, when traced."""
        if tracing.tracer is not None:
            tracing.annotate({"mtserve.model": model, "mtserve.texts": len(sentences) if sentences else texts})
            if sentences:
                tracing.follow(sentences)

    async def translate_stream(
        self, text: str, opts: TranslateOptions, timeout: float | None = None
    ) -> AsyncIterator[Chunk | TranslationResult]:
        inference = _Inference(self.metrics, self.translation_model)
        try:
            src = self._source_ids([text], field="text")
            (sentence,) = self._sentences(src, opts, timeout)
            self._trace(self.translation_model, [sentence])
        except BaseException:
            inference.failed()
            raise
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[list[int]] = asyncio.Queue()

        def on_tokens(toks: list[int]) -> None:  # called from a decode worker's thread
            loop.call_soon_threadsafe(steps.put_nowait, list(toks))

        sentence.on_tokens = on_tokens
        start = time.perf_counter()
        inference.submit()
        try:
            self.scheduler.submit([sentence])
        except BaseException:
            inference.failed()
            raise
        done = asyncio.wrap_future(sentence.future)
        ids: list[int] = []
        sent = ""
        first = True
        try:
            while True:
                getter = asyncio.ensure_future(steps.get())
                await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    new = [t for t in getter.result() if t != self.eos_id]
                else:
                    getter.cancel()
                    break
                if not new:
                    continue
                ids += new
                text_now = self.tokenizer.decode(ids, skip_special_tokens=True).lstrip()
                if text_now.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for more bytes
                    continue
                delta, sent = text_now[len(sent) :], text_now
                if first:
                    self.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
                    first = False
                yield Chunk(text=delta, token_ids=new)
            finished = done.result()
            inference.compute_done([sentence])
            result = self._result(src[0], finished, opts)
            if result.text != sent:  # beam search, or text held back at the end
                if first:
                    self.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
                tail = result.text[len(sent) :] if result.text.startswith(sent) else result.text
                yield Chunk(text=tail, token_ids=[] if ids == result.token_ids else result.token_ids)
            inference.succeeded(1)
            yield result
        except BaseException:
            inference.failed()  # no-op once succeeded: the client may go away after the result
            raise
        finally:
            done.cancel()

    async def encode(
        self, texts: list[str], return_token_embeddings: bool, timeout: float | None = None
    ) -> list[EncodingResult]:
        inference = _Inference(self.metrics, self.encoder_model)
        try:
            self._check_texts(texts)
            src = self._source_ids(texts)
            self._trace(self.encoder_model, texts=len(src))
            jobs = [EncodeJob(src_ids=s) for s in src]
            inference.submit()
            self.scheduler.submit_encode(jobs)
            futures = [asyncio.wrap_future(j.future) for j in jobs]
            try:
                memories = await asyncio.wait_for(asyncio.gather(*futures), timeout)
            except asyncio.TimeoutError:
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
            "options.length_penalty": f"unset: the model's length_penalty ({gen.length_penalty:g}); "
            "0 is 0 (scores not normalised by length); at most 10",
            "timeout_ms": "no deadline of the item's own: only the stream's deadline applies",
        }


async def translate_many(
    items: AsyncIterator[StreamItem],
    translate: ItemTranslator,
    settings: Settings,
    metrics: Metrics,
    timeout: float | None = None,
) -> AsyncIterator[tuple[StreamItem, list[TranslationResult] | Exception]]:
    """Items as they arrive, answers as they finish: (item, its results) or (item, the error of
    that item alone). At most `max_stream_in_flight` items are read ahead of the answers taken
    from this iterator. `timeout` is the whole stream's (seconds); an item's own comes with it.
    An error raised by `items` itself (a malformed message) ends the stream with that error.
    `translate` runs one item on the model it names."""
    stream = _ManyStream(translate, settings, metrics, items, timeout)
    reader = asyncio.ensure_future(stream.read())
    try:
        while True:
            answer = await stream.answers.get()
            if isinstance(answer, _End):
                if answer.error is not None:
                    raise answer.error
                return
            if answer.owns_id:
                stream.unanswered.discard(answer.item.id)
            yield answer.item, answer.outcome
            stream.slots.release()  # the answer has been taken (written): one more item may be read
    finally:
        reader.cancel()
        for task in list(stream.pending):  # the stream ended early (cancelled, failed): drop its items
            task.cancel()


class _ManyStream:
    """One TranslateMany stream: reads its items, translates each as a task of its own within its
    limit, and queues the answers for `Engine.translate_many` to hand out in completion order."""

    def __init__(
        self,
        translate: ItemTranslator,
        settings: Settings,
        metrics: Metrics,
        items: AsyncIterator[StreamItem],
        timeout: float | None,
    ):
        self.translate, self.metrics, self.items = translate, metrics, items
        self.loop = asyncio.get_running_loop()
        self.deadline = None if timeout is None else self.loop.time() + timeout
        self.slots = asyncio.Semaphore(settings.max_stream_in_flight)
        self.answers: asyncio.Queue[_Answer | _End] = asyncio.Queue()
        self.pending: set[asyncio.Task] = set()
        self.unanswered: set[str] = set()  # ids of the items read and not answered yet

    async def read(self) -> None:
        """Start a task per item as slots free up; end the answers when all are answered, or
        with the error of the request stream itself."""
        try:
            async for item in self.items:
                await self.slots.acquire()
                if item.id in self.unanswered:  # its answer could not be told from the first one's
                    self._refuse_duplicate(item)
                    continue
                self.unanswered.add(item.id)
                task = asyncio.ensure_future(self.answer(item))
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
            while self.pending:
                await asyncio.wait(set(self.pending))
            self.answers.put_nowait(_End())
        except Exception as e:  # noqa: BLE001 - the request stream itself failed: it ends the stream
            self.answers.put_nowait(_End(e))

    def _refuse_duplicate(self, item: StreamItem) -> None:
        self.metrics.requests.labels("TranslateMany.item", "INVALID_ARGUMENT").inc()
        error = InvalidArgument("id", f"{item.id!r} is the id of an item not answered yet on this stream")
        self.answers.put_nowait(_Answer(item, error, owns_id=False))

    async def answer(self, item: StreamItem) -> None:
        """Translate one item, count it under its own status, and queue its answer."""
        start = time.perf_counter()
        with tracing.span("mtserve.TranslateMany.item", {"mtserve.item_id": item.id}):
            outcome = await self._outcome(item, self._limit(item))
        code = (
            "OK"
            if not isinstance(outcome, Exception)
            else outcome.code
            if isinstance(outcome, ServiceError)
            else "INTERNAL"
        )
        metrics = self.metrics
        metrics.requests.labels("TranslateMany.item", code).inc()
        metrics.request_latency.labels("TranslateMany.item", code).observe(time.perf_counter() - start)
        self.answers.put_nowait(_Answer(item, outcome, owns_id=True))

    def _limit(self, item: StreamItem) -> float | None:
        """Seconds the item may take: the sooner of its own timeout and the stream's deadline."""
        limits = [
            t
            for t in (item.timeout, None if self.deadline is None else self.deadline - self.loop.time())
            if t is not None
        ]
        return min(limits) if limits else None

    async def _outcome(self, item: StreamItem, limit: float | None) -> list[TranslationResult] | Exception:
        try:
            if limit is None:
                return await self.translate(item, None)
            try:
                return await asyncio.wait_for(self.translate(item, limit), max(limit, 0.0))
            except asyncio.TimeoutError:
                raise DeadlineExceeded("deadline expired before the translation finished") from None
        except Exception as e:  # noqa: BLE001 - every failure is this item's answer, never the stream's
            return e
