"""The translation engine: validation, tokenisation, the split of a request into sentences for
the scheduler, and the reassembly of their results in request order. No gRPC here: callers get
domain objects and `ServiceError`s."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from contract.manifest import Manifest
from service.batching.jobs import EncodeJob, Sentence
from service.decoding.generator import max_output_len
from service.engine.backend import Backend
from service.errors import Cancelled, DeadlineExceeded, InvalidArgument, ServiceError
from service.metrics import Metrics
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
    score: float
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


_END = object()


@dataclass
class EncodingResult:
    pooled: np.ndarray  # (d_model,)
    tokens: list[str]
    token_embeddings: np.ndarray | None  # (tokens, d_model)


class Engine:
    def __init__(
        self,
        settings: Settings,
        manifest: Manifest,
        tokenizer: Tokenizer,
        scheduler: Backend,
        metrics: Metrics,
        provider: str,
    ):
        self.settings, self.manifest, self.tokenizer = settings, manifest, tokenizer
        self.scheduler, self.metrics, self.provider = scheduler, metrics, provider
        self.eos_id = manifest.special_ids.eos_id
        self.model_name = f"{manifest.name}:{manifest.version}"

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
        for i, t in enumerate(texts):
            name = f"{field}[{i}]" if field == "texts" else field
            if not t or not t.strip():
                raise InvalidArgument(name, "text is empty")
            if len(t.encode("utf-8", "surrogatepass")) > self.settings.max_text_bytes:
                raise InvalidArgument(name, f"text exceeds max_text_bytes ({self.settings.max_text_bytes})")
        ids = [e.ids for e in self.tokenizer.encode_batch([t.strip() for t in texts], add_special_tokens=False)]
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
        deadline = time.monotonic() + timeout if timeout is not None else None
        if deadline is not None and timeout <= 0:
            raise DeadlineExceeded("deadline expired before the request was queued")
        return [
            Sentence(
                src_ids=s,
                beam=beam,
                length_penalty=lp,
                max_len=min(
                    cap, max_output_len(len(s), gen.max_len_a, gen.max_len_b, self.manifest.dims.max_positions)
                ),
                want_alignment=opts.return_alignment,
                deadline=deadline,
            )
            for s in src
        ]

    def _result(self, src: list[int], finished, opts: TranslateOptions) -> TranslationResult:
        ids = list(finished.tokens)
        # Token strings only when the caller asked for them: this runs for every sentence.
        tokens = [self.tokenizer.id_to_token(i) for i in ids] if opts.return_tokens or opts.return_alignment else []
        result = TranslationResult(
            text=self.tokenizer.decode(ids, skip_special_tokens=True).strip(),
            score=float(finished.score),
            tokens=tokens,
            token_ids=ids,
            input_tokens=len(src),
            output_tokens=len(ids) + 1,
        )
        if opts.return_alignment and finished.alignment is not None:
            result.alignment = Alignment(
                source_tokens=[self.tokenizer.id_to_token(i) for i in src],
                target_tokens=tokens + ["</s>"],
                weights=np.asarray(finished.alignment, dtype=np.float32)[: len(ids) + 1, : len(src)],
            )
        return result

    # -- the calls ------------------------------------------------------------------------

    async def translate(
        self, texts: list[str], opts: TranslateOptions, timeout: float | None = None
    ) -> list[TranslationResult]:
        self._check_texts(texts)
        src = self._source_ids(texts)
        sentences = self._sentences(src, opts, timeout)
        self.scheduler.submit(sentences)
        futures = [asyncio.wrap_future(s.future) for s in sentences]
        try:
            finished = await asyncio.gather(*futures)
        except BaseException:
            for f in futures:  # a failed or cancelled request frees all its rows
                f.cancel()
            raise
        return [self._result(s, f, opts) for s, f in zip(src, finished)]

    async def translate_stream(
        self, text: str, opts: TranslateOptions, timeout: float | None = None
    ) -> AsyncIterator[Chunk | TranslationResult]:
        src = self._source_ids([text], field="text")
        (sentence,) = self._sentences(src, opts, timeout)
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[list[int]] = asyncio.Queue()
        sentence.on_tokens = lambda toks: loop.call_soon_threadsafe(steps.put_nowait, list(toks))
        start = time.perf_counter()
        self.scheduler.submit([sentence])
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
            result = self._result(src[0], finished, opts)
            if result.text != sent:  # beam search, or text held back at the end
                if first:
                    self.metrics.time_to_first_chunk.observe(time.perf_counter() - start)
                tail = result.text[len(sent) :] if result.text.startswith(sent) else result.text
                yield Chunk(text=tail, token_ids=[] if ids == result.token_ids else result.token_ids)
            yield result
        finally:
            done.cancel()

    async def translate_many(
        self, items: AsyncIterator[StreamItem], timeout: float | None = None
    ) -> AsyncIterator[tuple[StreamItem, list[TranslationResult] | Exception]]:
        """Items as they arrive, answers as they finish: (item, its results) or (item, the error of
        that item alone). At most `max_stream_in_flight` items are read ahead of the answers taken
        from this iterator. `timeout` is the whole stream's (seconds); an item's own comes with it.
        An error raised by `items` itself (a malformed message) ends the stream with that error."""
        loop = asyncio.get_running_loop()
        stream_deadline = None if timeout is None else loop.time() + timeout
        slots = asyncio.Semaphore(self.settings.max_stream_in_flight)
        answers: asyncio.Queue = asyncio.Queue()
        pending: set[asyncio.Task] = set()

        async def one(item: StreamItem) -> None:
            start = time.perf_counter()
            limits = [
                t
                for t in (item.timeout, None if stream_deadline is None else stream_deadline - loop.time())
                if t is not None
            ]
            limit = min(limits) if limits else None
            try:
                if limit is None:
                    outcome = await self.translate(item.texts, item.options)
                else:
                    try:
                        outcome = await asyncio.wait_for(
                            self.translate(item.texts, item.options, timeout=limit), max(limit, 0.0)
                        )
                    except asyncio.TimeoutError:
                        raise DeadlineExceeded("deadline expired before the translation finished") from None
            except Exception as e:  # noqa: BLE001 - every failure is this item's answer, never the stream's
                outcome = e
            code = (
                "OK"
                if not isinstance(outcome, Exception)
                else outcome.code
                if isinstance(outcome, ServiceError)
                else "INTERNAL"
            )
            self.metrics.requests.labels("TranslateMany.item", code).inc()
            self.metrics.request_latency.labels("TranslateMany.item", code).observe(time.perf_counter() - start)
            answers.put_nowait((item, outcome, True))

        unanswered: set[str] = set()

        async def read() -> None:
            try:
                async for item in items:
                    await slots.acquire()
                    if item.id in unanswered:  # its answer could not be told from the first one's
                        self.metrics.requests.labels("TranslateMany.item", "INVALID_ARGUMENT").inc()
                        answers.put_nowait(
                            (
                                item,
                                InvalidArgument(
                                    "id", f"{item.id!r} is the id of an item not answered yet on this stream"
                                ),
                                False,
                            )
                        )
                        continue
                    unanswered.add(item.id)
                    task = asyncio.ensure_future(one(item))
                    pending.add(task)
                    task.add_done_callback(pending.discard)
                while pending:
                    await asyncio.wait(set(pending))
                answers.put_nowait((_END, None, False))
            except Exception as e:  # noqa: BLE001 - the request stream itself failed
                answers.put_nowait((_END, e, False))

        reader = asyncio.ensure_future(read())
        try:
            while True:
                item, outcome, owns_id = await answers.get()  # owns_id: False for a refused duplicate
                if item is _END:
                    if outcome is not None:
                        raise outcome
                    return
                if owns_id:
                    unanswered.discard(item.id)
                yield item, outcome
                slots.release()  # the answer has been taken (written): one more item may be read
        finally:
            reader.cancel()
            for task in list(pending):  # the stream ended early (cancelled, failed): drop its items
                task.cancel()

    async def encode(
        self, texts: list[str], return_token_embeddings: bool, timeout: float | None = None
    ) -> list[EncodingResult]:
        self._check_texts(texts)
        src = self._source_ids(texts)
        jobs = [EncodeJob(src_ids=s) for s in src]
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
        return [
            EncodingResult(
                pooled=m.mean(axis=0),
                tokens=[self.tokenizer.id_to_token(i) for i in s],
                token_embeddings=m if return_token_embeddings else None,
            )
            for s, m in zip(src, memories)
        ]

    def model_info(self) -> dict:
        m, d, st = self.manifest, self.manifest.dims, self.settings
        return {
            "name": m.name,
            "version": m.version,
            "source_language": m.src_lang,
            "target_language": m.tgt_lang,
            "precision": st.precision,
            "execution_provider": self.provider,
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
            "files_sha256": m.checksums(st.precision),
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
            },
        }
