"""`EngineProcess`: one decode worker's child process and its pipe (`EnginePool` in
service/parallel/pool.py runs one per decode worker). Each Sentence and EncodeJob keeps its
future in this process, under a key; the child settles its own copy and sends the outcome back
under the same key, in the messages of service.parallel.messages. A reader thread settles the
futures. It survives a message it cannot handle (logged) and ignores one it has no case for; one
it cannot unpickle means the pipe can no longer be trusted, so the child is killed and replaced.
If the child dies, its unanswered sentences fail with INTERNAL and a new child is started.
"""

from __future__ import annotations

import functools
import itertools
import logging
import multiprocessing as mp
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from prometheus_client.metrics_core import Metric

from service.batching.jobs import EncodeJob, Sentence, settle
from service.errors import Internal, ModelLoadError, Unavailable
from service.parallel.child import child_main
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
from service.settings import Settings

log = logging.getLogger("mtserve.engine_process")


def _rows(item: Sentence | EncodeJob) -> int:
    return item.beam if isinstance(item, Sentence) else 1


class EngineProcess:
    """One child process and its pipe; `EnginePool` runs one per decode worker."""

    def __init__(self, settings: Settings, start_timeout: float = 300.0, labels: tuple[str, str] = ("", "")):
        self.settings = settings
        self.labels = labels  # the model version's (name, version), for the child's metrics
        self.start_timeout = start_timeout
        self.provider = "cpu"
        self.sessions = 0
        self._ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
        self._starting: tuple[Connection, BaseProcess] | None = None  # spawned, not ready yet
        self._conn: Connection | None = None
        self._proc: BaseProcess | None = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # _pending and _accepting
        self._pending: dict[int, Sentence | EncodeJob] = {}
        self.load = 0  # rows of _pending (a sentence counts its beams): what the pool balances on
        self._keys = itertools.count()
        self._accepting = True
        self._stopping = False
        self._idle = threading.Condition(self._lock)
        self._metric_replies: dict[int, list[Metric]] = {}
        self._metric_ready = threading.Condition()
        self._reader: threading.Thread | None = None

    # -- life cycle ---------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """Whether the child answered Ready (and has not died since)."""
        return self._conn is not None

    def start_process(self) -> None:
        """Start the child and wait until its models are loaded. ModelLoadError on failure."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=child_main,
            args=(child, self.settings.model_dump_json(), self.settings.log_level, self.labels),
            name="mtserve-engine",
            daemon=True,
        )
        proc.start()
        child.close()
        self._starting = (parent, proc)

    def wait_ready(self) -> None:
        """Wait for the child spawn() started to answer Ready; ModelLoadError if it does not."""
        if self._starting is None:
            raise RuntimeError("wait_ready() before spawn()")
        parent, proc = self._starting
        if not parent.poll(self.start_timeout):
            proc.kill()
            raise ModelLoadError(f"the engine process did not load the model within {self.start_timeout:.0f}s")
        try:
            msg = parent.recv()
        except EOFError:
            proc.join(5)
            raise ModelLoadError(f"the engine process exited during start-up (exit code {proc.exitcode})") from None
        match msg:
            case Ready(provider, sessions):
                self.provider, self.sessions = provider, sessions
            case StartupError(message):
                proc.join(5)
                raise ModelLoadError(message)
            case _:
                proc.kill()
                raise ModelLoadError(f"the engine process sent {type(msg).__name__} before Ready")
        self._conn, self._proc = parent, proc
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="engine-process-reader", daemon=True)
            self._reader.start()

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False
        self._send(StopAccepting())

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._pending

    @property
    def queue_depth(self) -> int:  # sentences sent to the child and not answered yet
        with self._lock:
            return len(self._pending)

    def request_shutdown(self) -> None:
        self._stopping = True
        self._send(Shutdown())

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the child (after request_shutdown, which lets a pool stop its children together)."""
        if not self._stopping:
            self.request_shutdown()
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout)
        self._fail_pending(Unavailable("server shut down before this sentence was answered"))

    # -- caller side ------------------------------------------------------------------------

    def submit(self, sentences: list[Sentence]) -> None:
        for s in sentences:
            s.key = next(self._keys)
        specs = [SentenceSpec.of(s) for s in sentences]
        self._enqueue([(s.key, s) for s in sentences], SubmitSentences(specs))

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        keyed = [(next(self._keys), j) for j in jobs]
        self._enqueue(keyed, Encode([EncodeSpec(key=key, src_ids=list(j.src_ids)) for key, j in keyed]))

    def _enqueue(self, keyed: Sequence[tuple[int, Sentence | EncodeJob]], msg: ToChild) -> None:
        with self._lock:
            if not self._accepting:
                raise Unavailable("server is draining; retry on another replica")
            if self._conn is None:
                raise Unavailable("the engine process is restarting; retry shortly")
            for key, item in keyed:
                self._pending[key] = item
                self.load += _rows(item)
        for key, item in keyed:
            item.future.add_done_callback(functools.partial(self._cancelled, key))
        self._send(msg)

    def _cancelled(self, key: int, future: Future) -> None:
        if future.cancelled():
            self._forget(key)
            self._send(Cancel([key]))

    def _forget(self, key: int) -> Sentence | EncodeJob | None:
        with self._lock:
            item = self._pending.pop(key, None)
            if item is not None:
                self.load -= _rows(item)
            if not self._pending:
                self._idle.notify_all()
        return item

    def _send(self, msg: ToChild) -> None:
        with self._send_lock:
            conn = self._conn
            if conn is None:
                return
            try:
                conn.send(msg)
            except (OSError, ValueError):
                pass  # the child died: the reader fails what was pending

    def fetch_metrics(self, timeout: float = 5.0) -> list[Metric]:
        token = next(self._keys)
        self._send(MetricsRequest(token))
        end = time.monotonic() + timeout
        with self._metric_ready:
            while token not in self._metric_replies:
                left = end - time.monotonic()
                if left <= 0 or self._conn is None:
                    return []
                self._metric_ready.wait(left)
            return self._metric_replies.pop(token)

    # -- the reader thread ------------------------------------------------------------------

    def _read(self) -> None:
        while True:
            conn = self._conn
            if conn is None:  # a restart gave up: shutting down
                return
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                if self._stopping:
                    return
                self._child_died()
                continue
            except Exception:
                log.exception("engine process: unreadable message from the child")
                if self._stopping:
                    return
                if self._proc is not None:
                    self._proc.kill()
                self._child_died()
                continue
            try:
                self._handle(msg)
            except Exception:
                log.exception("engine process reader: cannot handle %s", _describe(msg))

    def _handle(self, msg: ToParent) -> None:
        match msg:
            case Done(key, result) | Encoded(key, result):
                item = self._forget(key)
                if item is not None:
                    settle(item.future, result=result)
            case Failed(key, error):
                item = self._forget(key)
                if item is not None:
                    settle(item.future, error=error)
            case Tokens(key, ids):
                with self._lock:
                    item = self._pending.get(key)
                if isinstance(item, Sentence) and item.on_tokens is not None and not item.future.done():
                    item.on_tokens(ids)
            case MetricsReply(token, families):
                with self._metric_ready:
                    self._metric_replies[token] = families
                    self._metric_ready.notify_all()
            case _:  # Ready and StartupError come once, to wait_ready; anything else: ignored
                pass

    def _child_died(self) -> None:
        code = None
        if self._proc is not None:
            self._proc.join(1)
            code = self._proc.exitcode
        log.error("the engine process exited unexpectedly (exit code %s); restarting it", code)
        with self._send_lock:
            self._conn = None
        self._fail_pending(Internal("decoding failed: the engine process exited unexpectedly"))
        while not self._stopping:
            try:
                self.start_process()
                log.info("engine process restarted")
                return
            except ModelLoadError as e:
                log.error("engine process restart failed: %s; retrying in 5s", e)
                time.sleep(5)

    def _fail_pending(self, exc: Exception) -> None:
        with self._lock:
            items = list(self._pending.values())
            self._pending.clear()
            self.load = 0
            self._idle.notify_all()
        for item in items:
            settle(item.future, error=exc)


def _describe(msg: object) -> str:
    """A message for a log line: its type and key or token, not its payload."""
    name = type(msg).__name__
    for field in ("key", "token"):
        if hasattr(msg, field):
            return f"{name}({field}={getattr(msg, field)!r})"
    return name
