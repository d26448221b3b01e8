"""An engine process: the models and a Scheduler with one decode worker, served over a pipe.

`child_main` is the process's target (`service.parallel.pool.EngineProcess` spawns it). It loads
the models and answers Ready, or StartupError and exits; then `Child` serves the pipe until
Shutdown or until the parent is gone, and the scheduler is stopped.

`Child` makes a Sentence or an EncodeJob of each spec it receives, queues it on the scheduler and
answers from the future's callback (Done, Encoded or Failed; Tokens while a streamed sentence
decodes). It keeps the futures it has not answered yet so that Cancel can reach them. A message it
has no case for is ignored, as the parent's reader ignores one; one it cannot unpickle ends the
process, which the parent sees as a crash and replaces.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, TypeVar

from service.batching.jobs import EncodeJob, Sentence
from service.batching.scheduler import Scheduler
from service.errors import Internal, ServiceError
from service.metrics import Metrics, ModelMetrics
from service.parallel.messages import (
    Cancel,
    Done,
    Encode,
    Encoded,
    EncodeSpec,
    Failed,
    MetricsReply,
    MetricsRequest,
    Ready,
    SentenceSpec,
    Shutdown,
    StartupError,
    StopAccepting,
    SubmitSentences,
    ToChild,
    Tokens,
    ToParent,
)
from service.runtime.gil import set_switch_interval
from service.runtime.loading import load_models
from service.runtime.memory import freeze_loaded, keep_freed_memory
from service.settings import Settings

Job = TypeVar("Job", Sentence, EncodeJob)


def child_main(conn: Connection, settings_json: str, log_level: str, labels: tuple[str, str]) -> None:
    """The engine process: load the models, serve the pipe, stop the scheduler."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    keep_freed_memory()
    settings = Settings.model_validate_json(settings_json)
    set_switch_interval(settings.gil_switch_interval_ms)  # its decode worker and pipe reader share a GIL
    try:
        models = load_models(settings)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which exits with it
        conn.send(StartupError(str(e)))
        return
    metrics = Metrics().for_model(*labels)
    scheduler = Scheduler(models, settings, metrics)
    scheduler.start()
    freeze_loaded()
    child = Child(conn, scheduler, metrics)
    child.send(Ready(provider=models[0].provider, sessions=len({id(m) for m in models})))
    child.serve()
    scheduler.stop_accepting()
    scheduler.shutdown()


class Child:
    """The child's end of the pipe: turns messages into scheduler calls and futures into answers."""

    def __init__(self, conn: Connection, scheduler: Scheduler, metrics: ModelMetrics):
        self.conn = conn
        self.scheduler = scheduler
        self.metrics = metrics
        self._send_lock = threading.Lock()  # answers come from the decode worker and this thread
        self._live: dict[int, Sentence | EncodeJob] = {}  # queued or decoding, by key
        self._live_lock = threading.Lock()

    # -- receiving ----------------------------------------------------------------------------

    def serve(self) -> None:
        """Handle messages until Shutdown or until the parent is gone."""
        while True:
            try:
                msg = self.conn.recv()
            except (EOFError, OSError):  # the parent is gone: stop
                return
            if not self.handle(msg):
                return

    def handle(self, msg: ToChild) -> bool:
        """Act on one message; False when it asks the child to stop."""
        match msg:
            case SubmitSentences(sentences):
                self.submit_sentences(sentences)
            case Encode(jobs):
                self.submit_encode(jobs)
            case Cancel(keys):
                self.cancel(keys)
            case StopAccepting():
                self.scheduler.stop_accepting()
            case MetricsRequest(token):
                self.send(MetricsReply(token, list(self.metrics.registry.collect())))
            case Shutdown():
                return False
            case _:  # a message this side has no case for: ignored
                pass
        return True

    def submit_sentences(self, specs: list[SentenceSpec]) -> None:
        sentences = [
            spec.sentence(functools.partial(self._stream, spec.key) if spec.stream else None) for spec in specs
        ]
        self._queue([spec.key for spec in specs], sentences, self.scheduler.submit, Done)

    def submit_encode(self, specs: list[EncodeSpec]) -> None:
        jobs = [EncodeJob(src_ids=spec.src_ids) for spec in specs]
        self._queue([spec.key for spec in specs], jobs, self.scheduler.submit_encode, Encoded)

    def cancel(self, keys: list[int]) -> None:
        with self._live_lock:
            gone = [self._live.get(k) for k in keys]
        for item in gone:
            if item is not None:
                item.future.cancel()

    def _queue(
        self,
        keys: list[int],
        items: list[Job],
        submit: Callable[[list[Job]], None],
        answer: Callable[[int, Any], ToParent],
    ) -> None:
        """Submit `items` (keyed by `keys`) and answer each with `answer(key, result)` once done."""
        try:
            submit(items)
        except ServiceError as e:  # queue full, draining: all of them or none
            for key in keys:
                self.send(Failed(key, e))
            return
        with self._live_lock:
            self._live.update(zip(keys, items, strict=True))
        for key, item in zip(keys, items, strict=True):
            item.future.add_done_callback(functools.partial(self._report, key, answer))

    # -- answering ------------------------------------------------------------------------------

    def send(self, msg: ToParent) -> None:
        with self._send_lock:
            try:
                self.conn.send(msg)
            except (OSError, ValueError):  # the parent is gone
                pass

    def _stream(self, key: int, tokens: list[int]) -> None:
        self.send(Tokens(key, list(tokens)))

    def _report(self, key: int, answer: Callable[[int, Any], ToParent], future: Future) -> None:
        with self._live_lock:
            self._live.pop(key, None)
        if future.cancelled():  # by a Cancel: the parent has forgotten it
            return
        exc = future.exception()
        if exc is not None:
            self.send(Failed(key, exc if isinstance(exc, ServiceError) else Internal(str(exc))))
        else:
            self.send(answer(key, future.result()))
