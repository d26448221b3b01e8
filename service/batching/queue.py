"""The bounded queue of sentences in front of a backend's decode workers, and its lifecycle:
accept or refuse a group of sentences, stop accepting (the drain), wait until idle, shut down.
`Scheduler` (ONNX Runtime) and the benchmarks' CTranslate2 backend build their workers on it.
Knows nothing of gRPC."""

from __future__ import annotations

import concurrent.futures
import threading
import time

from service.batching.jobs import Sentence, settle
from service.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from service.metrics import ModelMetrics
from service.settings import Settings


class SentenceQueue:
    """Subclasses start `_threads`, take from `_queue` under `_cond`, and say when they are `idle`."""

    def __init__(self, settings: Settings, metrics: ModelMetrics):
        self.settings, self.metrics = settings, metrics
        self._queue: list[Sentence] = []
        self._cond = threading.Condition()
        self._accepting = True
        self._stopping = False
        self._threads: list[threading.Thread] = []
        metrics.queue_capacity.set(settings.max_queue_size)

    @property
    def idle(self) -> bool:
        raise NotImplementedError

    def submit(self, sentences: list[Sentence]) -> None:
        """Queue all of them or none: RESOURCE_EXHAUSTED when the queue cannot take them all."""
        with self._cond:
            if not self._accepting:
                raise Unavailable("server is draining; retry on another replica")
            if len(self._queue) + len(sentences) > self.settings.max_queue_size:
                raise ResourceExhausted(
                    f"queue full: {len(self._queue)} sentences waiting, max_queue_size is {self.settings.max_queue_size}"
                )
            self._queue.extend(sentences)
            self.metrics.queue_depth.set(len(self._queue))
            self._arrived(sentences)
            self._cond.notify_all()

    def _arrived(self, sentences: list[Sentence]) -> None:
        """`sentences` joined the queue (lock held): for subclasses that count arrivals."""

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    def stop_accepting(self) -> None:
        with self._cond:
            self._accepting = False

    def wait_idle(self, timeout: float) -> bool:
        """Block until every accepted sentence is answered (or the timeout passes)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.idle:
                return True
            time.sleep(0.01)
        return self.idle

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the workers (a call under way finishes first); whatever is still queued is answered
        UNAVAILABLE."""
        with self._cond:
            self._accepting = False
            self._stopping = True
            left = self._take_queued()
            self.metrics.queue_depth.set(0)
            self._cond.notify_all()
        for future, message in left:
            settle(future, error=Unavailable(message))
        for t in self._threads:
            t.join(timeout)

    def _live(self, now: float) -> list[Sentence]:
        """Drop the cancelled and the expired sentences from the queue (lock held), each counted
        and the expired answered DEADLINE_EXCEEDED; the rest, oldest first."""
        live = []
        for s in self._queue:
            if s.future.cancelled():
                self.metrics.sentences.labels("cancelled").inc()
            elif s.deadline is not None and now > s.deadline:
                self.metrics.sentences.labels("deadline_exceeded").inc()
                settle(s.future, error=DeadlineExceeded("deadline expired while queued"))
            else:
                live.append(s)
        self._queue = live
        self.metrics.queue_depth.set(len(live))  # also when the dropped ones were the last
        return live

    def _pop(self, chosen: list[Sentence], now: float) -> list[Sentence]:
        """Take `chosen` off the queue (lock held), with their queue wait recorded."""
        taken = set(map(id, chosen))
        self._queue = [s for s in self._queue if id(s) not in taken]
        self.metrics.queue_depth.set(len(self._queue))
        for s in chosen:
            self.metrics.queue_wait.observe(now - s.enqueued)
            s.admitted = now
        return chosen

    def _take_queued(self) -> list[tuple[concurrent.futures.Future, str]]:
        """Empty the queues (lock held): each waiting future with the reason it fails."""
        left, self._queue = self._queue, []
        return [(s.future, "server shut down before this sentence was scheduled") for s in left]
