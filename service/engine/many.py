"""TranslateMany: a stream of items, each a Translate call of its own, answered in completion
order with at most `max_stream_in_flight` items in flight. Each item runs on the model it names
through the caller's `ItemTranslator`; a failed item is that item's answer, not the stream's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from service import tracing
from service.engine.requests import StreamItem, TranslationResult
from service.errors import DeadlineExceeded, InvalidArgument, ServiceError, quote
from service.metrics import Metrics
from service.settings import Settings

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
        await _stop([reader, *stream.pending])  # the stream ended early (cancelled, failed): drop its items


async def _stop(tasks: list[asyncio.Task]) -> None:
    """Cancel `tasks` and wait until they have ended, so that none outlives its stream (their
    sentences leave the scheduler's queue and nothing is left pending when the call ends)."""
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)


class _ManyStream:
    """One TranslateMany stream: reads its items, translates each as a task of its own within its
    limit, and queues the answers for `translate_many` to hand out in completion order."""

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
        error = InvalidArgument("id", f"{quote(item.id)} is the id of an item not answered yet on this stream")
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
            except TimeoutError:
                raise DeadlineExceeded("deadline expired before the translation finished") from None
        except Exception as e:  # noqa: BLE001 - every failure is this item's answer, never the stream's
            return e
