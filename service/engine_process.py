"""The scheduler and its decode workers in a child process, behind the Scheduler interface.

With `engine_process` the child process owns the ONNX Runtime sessions, the Scheduler and its
worker threads; the gRPC process keeps validation, tokenisation and the RPCs, and talks to the
child over a pipe, as vLLM's engine core runs apart from its API server. Two things follow: the
gRPC event loop and the decode workers no longer take turns on one GIL, and a crash in the engine
(a native fault in ONNX Runtime, the kernel's OOM killer) fails only the requests in flight there:
the child is restarted and the server keeps serving. It is off by default: on the 2-core
development machine it measured no throughput gain (docs/performance.md), and it costs a copy of
each sentence and result over the pipe.

`EngineProcess` is what `service.engine.Engine` and `service.server.Server` see: submit(),
submit_encode(), stop_accepting(), wait_idle(), shutdown(), idle. Each Sentence and EncodeJob
keeps its future in this process; the child settles its own copy and sends the outcome back:

    parent -> child: ("submit", [sentence fields]), ("encode", [(key, src_ids)]), ("cancel", [keys]),
                     ("stop_accepting",), ("metrics", token), ("shutdown",)
    child -> parent: ("ready", provider, session pairs) | ("startup_error", message) once, then
                     ("done", key, Finished), ("encoded", key, memory), ("error", key, class, message),
                     ("tokens", key, ids), ("metrics", token, families)

Errors cross as (class name, message) of service.errors. The child's metrics (queue, batches,
steps, sentences) are collected from it at each scrape. If the child dies, its unanswered
sentences fail with INTERNAL and a new child is started.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
import time
from multiprocessing.connection import Connection

from service import errors
from service.errors import Internal, ModelLoadError, Unavailable
from service.metrics import Metrics
from service.scheduler import EncodeJob, Sentence, _settle
from service.settings import Settings

log = logging.getLogger("mtserve.engine_process")

# Metrics the child updates; the parent's copies are unregistered and the child's served instead.
CHILD_METRICS = ("queue_wait", "queue_depth", "queue_capacity", "batch_rows", "encoder_latency",
                 "decoder_step_latency", "input_tokens", "generated_tokens", "decoded_rows", "padding_ratio",
                 "sentences")


# ----------------------------------------------------------------------------- the child


def _child_main(conn: Connection, settings_json: str, log_level: str) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
    from service.memory import keep_freed_memory
    from service.scheduler import Scheduler
    from service.server import load_models

    keep_freed_memory()
    settings = Settings.model_validate_json(settings_json)
    try:
        models = load_models(settings)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which exits with it
        conn.send(("startup_error", str(e)))
        return
    metrics = Metrics()
    gen = models[0].manifest.generation
    scheduler = Scheduler(models, settings, metrics, gen.max_len_a, gen.max_len_b)
    scheduler.start()
    send_lock = threading.Lock()

    def send(msg) -> None:
        with send_lock:
            try:
                conn.send(msg)
            except (OSError, ValueError):  # the parent is gone
                pass

    live: dict[int, Sentence | EncodeJob] = {}
    live_lock = threading.Lock()

    def report(key: int, kind: str, future) -> None:
        with live_lock:
            live.pop(key, None)
        if future.cancelled():
            return
        exc = future.exception()
        if exc is not None:
            name = type(exc).__name__ if isinstance(exc, errors.ServiceError) else "Internal"
            send(("error", key, name, getattr(exc, "message", str(exc))))
        else:
            send((kind, key, future.result()))

    def submit(items, encode: bool) -> None:
        made = []
        for fields in items:
            if encode:
                key, src_ids = fields
                made.append((key, EncodeJob(src_ids=src_ids)))
            else:
                key, src_ids, beam, lp, max_len, want_alignment, deadline, stream = fields
                s = Sentence(src_ids=src_ids, beam=beam, length_penalty=lp, max_len=max_len,
                             want_alignment=want_alignment, deadline=deadline, key=key)
                if stream:
                    s.on_tokens = lambda toks, k=key: send(("tokens", k, list(toks)))
                made.append((key, s))
        try:
            (scheduler.submit_encode if encode else scheduler.submit)([item for _, item in made])
        except errors.ServiceError as e:  # queue full, draining: all of them or none
            for key, _ in made:
                send(("error", key, type(e).__name__, e.message))
            return
        with live_lock:
            live.update(made)
        kind = "encoded" if encode else "done"
        for key, item in made:
            item.future.add_done_callback(lambda f, k=key: report(k, kind, f))

    sessions = len({id(m) for m in models})
    send(("ready", models[0].provider, sessions))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent is gone: stop
            break
        op = msg[0]
        if op == "submit":
            submit(msg[1], encode=False)
        elif op == "encode":
            submit(msg[1], encode=True)
        elif op == "cancel":
            with live_lock:
                gone = [live.get(k) for k in msg[1]]
            for item in gone:
                if item is not None:
                    item.future.cancel()
        elif op == "stop_accepting":
            scheduler.stop_accepting()
        elif op == "metrics":
            send(("metrics", msg[1], list(metrics.registry.collect())))
        elif op == "shutdown":
            break
    scheduler.stop_accepting()
    scheduler.shutdown()


# ----------------------------------------------------------------------------- the parent


class _ChildMetrics:
    """A Prometheus collector: the child's families, fetched at scrape time."""

    def __init__(self, owner: "EngineProcess", names: set[str]):
        self.owner, self.names = owner, names

    def describe(self):
        return []  # names are not known before the child answers; they never clash (unregistered above)

    def collect(self):
        return [f for f in self.owner.fetch_metrics() if f.name in self.names]


class EngineProcess:
    def __init__(self, settings: Settings, metrics: Metrics, start_timeout: float = 300.0):
        self.settings, self.metrics = settings, metrics
        self.start_timeout = start_timeout
        self.provider = "cpu"
        self.sessions = 0
        self._ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
        self._conn: Connection | None = None
        self._proc = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # _pending and _accepting
        self._pending: dict[int, Sentence | EncodeJob] = {}
        self._keys = itertools.count()
        self._accepting = True
        self._stopping = False
        self._idle = threading.Condition(self._lock)
        self._metric_replies: dict[int, list] = {}
        self._metric_ready = threading.Condition()
        self._reader: threading.Thread | None = None
        names = set()
        for attr in CHILD_METRICS:
            m = getattr(metrics, attr)
            names |= {f.name for f in m.collect()}
            metrics.registry.unregister(m)
        metrics.registry.register(_ChildMetrics(self, names))

    # -- life cycle ---------------------------------------------------------------------

    def start_process(self) -> None:
        """Start the child and wait until its models are loaded. ModelLoadError on failure."""
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_child_main, args=(child, self.settings.model_dump_json(),
                                                            self.settings.log_level),
                                 name="mtserve-engine", daemon=True)
        proc.start()
        child.close()
        if not parent.poll(self.start_timeout):
            proc.kill()
            raise ModelLoadError(f"the engine process did not load the model within {self.start_timeout:.0f}s")
        try:
            msg = parent.recv()
        except EOFError:
            proc.join(5)
            raise ModelLoadError(f"the engine process exited during start-up (exit code {proc.exitcode})") from None
        if msg[0] == "startup_error":
            proc.join(5)
            raise ModelLoadError(msg[1])
        _, self.provider, self.sessions = msg
        self._conn, self._proc = parent, proc
        if self._reader is None:
            self._reader = threading.Thread(target=self._read, name="engine-process-reader", daemon=True)
            self._reader.start()

    def start(self) -> None:
        """The Scheduler interface: the child's workers started with it (start_process)."""
        if self._conn is None:
            self.start_process()

    def stop_accepting(self) -> None:
        with self._lock:
            self._accepting = False
        self._send(("stop_accepting",))

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

    def shutdown(self, timeout: float = 5.0) -> None:
        self._stopping = True
        self._send(("shutdown",))
        if self._proc is not None:
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.kill()
                self._proc.join(timeout)
        self._fail_pending(Unavailable("server shut down before this sentence was answered"))

    # -- caller side ------------------------------------------------------------------------

    def submit(self, sentences: list[Sentence]) -> None:
        fields = []
        for s in sentences:
            s.key = next(self._keys)
            fields.append((s.key, list(s.src_ids), s.beam, s.length_penalty, s.max_len, s.want_alignment,
                           s.deadline, s.on_tokens is not None))
        self._enqueue(sentences, ("submit", fields))

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        keyed = [(next(self._keys), j) for j in jobs]
        for key, j in keyed:
            j.key = key
        self._enqueue(jobs, ("encode", [(key, list(j.src_ids)) for key, j in keyed]))

    def _enqueue(self, items, msg) -> None:
        with self._lock:
            if not self._accepting:
                raise Unavailable("server is draining; retry on another replica")
            if self._conn is None:
                raise Unavailable("the engine process is restarting; retry shortly")
            for item in items:
                self._pending[item.key] = item
        for item in items:
            item.future.add_done_callback(lambda f, k=item.key: self._cancelled(k, f))
        self._send(msg)

    def _cancelled(self, key: int, future) -> None:
        if future.cancelled():
            self._forget(key)
            self._send(("cancel", [key]))

    def _forget(self, key: int):
        with self._lock:
            item = self._pending.pop(key, None)
            if not self._pending:
                self._idle.notify_all()
        return item

    def _send(self, msg) -> None:
        with self._send_lock:
            conn = self._conn
            if conn is None:
                return
            try:
                conn.send(msg)
            except (OSError, ValueError):
                pass  # the child died: the reader fails what was pending

    def fetch_metrics(self, timeout: float = 5.0) -> list:
        token = next(self._keys)
        self._send(("metrics", token))
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
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                if self._stopping:
                    return
                self._child_died()
                continue
            except Exception:  # noqa: BLE001 - an unreadable message: the pipe cannot be trusted any more
                log.exception("engine process: unreadable message from the child")
                if self._stopping:
                    return
                self._proc.kill()
                self._child_died()
                continue
            try:
                self._handle(msg)
            except Exception:  # noqa: BLE001 - one bad message must not stop the reader
                log.exception("engine process reader: cannot handle %r", msg[:2] if isinstance(msg, tuple) else msg)

    def _handle(self, msg) -> None:
        op = msg[0]
        if op == "done" or op == "encoded":
            item = self._forget(msg[1])
            if item is not None:
                _settle(item.future, result=msg[2])
        elif op == "error":
            item = self._forget(msg[1])
            if item is not None:
                cls = getattr(errors, msg[2], None)
                exc = cls(msg[3]) if isinstance(cls, type) and issubclass(cls, errors.ServiceError) \
                    and cls is not errors.InvalidArgument else Internal(msg[3])
                _settle(item.future, error=exc)
        elif op == "tokens":
            with self._lock:
                item = self._pending.get(msg[1])
            if item is not None and item.on_tokens is not None and not item.future.done():
                item.on_tokens(msg[2])
        elif op == "metrics":
            with self._metric_ready:
                self._metric_replies[msg[1]] = msg[2]
                self._metric_ready.notify_all()

    def _child_died(self) -> None:
        code = self._proc.exitcode if self._proc is not None else None
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
            self._idle.notify_all()
        for item in items:
            _settle(item.future, error=exc)
