"""Decode workers in child processes, behind the Scheduler interface.

With `engine_process`, `EnginePool` starts one child process per decode worker. Each child owns
its ONNX Runtime sessions and a Scheduler with one worker thread. The gRPC process keeps
validation, tokenisation and the RPCs, and talks to each child over a pipe, as vLLM's engine core
runs apart from its API server.

Two things follow. No decode loop shares a GIL with another or with the gRPC event loop. And a
crash in a child (a native fault in ONNX Runtime, the kernel's OOM killer) fails only the
requests in flight there: that child is restarted and the server keeps serving.

It is off by default. On the 2-core development machine it measured no consistent throughput
gain (docs/performance.md), and it costs a copy of each sentence and result over a pipe and a
copy of the weights per child.

`EnginePool` (and each `EngineProcess`, one child) is what `service.engine.engine.Engine` and
`service.server.Server` see: submit(), submit_encode(), stop_accepting(), wait_idle(), shutdown(),
idle. Each Sentence and EncodeJob keeps its future in this process; the child settles its own
copy and sends the outcome back:

    parent -> child: ("submit", [sentence fields]), ("encode", [(key, src_ids)]), ("cancel", [keys]),
                     ("stop_accepting",), ("metrics", token), ("shutdown",)
    child -> parent: ("ready", provider, session pairs) | ("startup_error", message) once, then
                     ("done", key, Finished), ("encoded", key, memory), ("error", key, ServiceError),
                     ("tokens", key, ids), ("metrics", token, families)

Errors cross as the ServiceError itself (service.errors pickles them); anything else as Internal. The children's metrics (queue,
batches, steps, sentences) are fetched at each scrape and summed. If a child dies, its
unanswered sentences fail with INTERNAL and a new child is started.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import threading
import time
from multiprocessing.connection import Connection

from service import errors
from service.batching.jobs import EncodeJob, Sentence, settle
from service.batching.scheduler import Scheduler
from service.errors import Internal, ModelLoadError, Unavailable
from service.metrics import Metrics
from service.runtime.loading import load_models
from service.runtime.memory import keep_freed_memory
from service.settings import Settings

log = logging.getLogger("mtserve.engine_process")

# Metrics the child updates; the parent's copies are unregistered and the child's served instead.
CHILD_METRICS = (
    "queue_wait",
    "queue_depth",
    "queue_capacity",
    "batch_rows",
    "encoder_latency",
    "decoder_step_latency",
    "input_tokens",
    "generated_tokens",
    "decoded_rows",
    "padding_ratio",
    "sentences",
)


# ----------------------------------------------------------------------------- the child


def _child_main(conn: Connection, settings_json: str, log_level: str) -> None:
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s[engine]: %(message)s")
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
            send(("error", key, exc if isinstance(exc, errors.ServiceError) else Internal(str(exc))))
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
                s = Sentence(
                    src_ids=src_ids,
                    beam=beam,
                    length_penalty=lp,
                    max_len=max_len,
                    want_alignment=want_alignment,
                    deadline=deadline,
                    key=key,
                )
                if stream:
                    s.on_tokens = lambda toks, k=key: send(("tokens", k, list(toks)))
                made.append((key, s))
        try:
            (scheduler.submit_encode if encode else scheduler.submit)([item for _, item in made])
        except errors.ServiceError as e:  # queue full, draining: all of them or none
            for key, _ in made:
                send(("error", key, e))
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
    """A Prometheus collector: the children's families, fetched at scrape time and summed sample by
    sample (each child counts its own sentences, steps and queue)."""

    def __init__(self, children: list[EngineProcess], names: set[str]):
        self.children, self.names = children, names

    def describe(self):
        return []  # names are not known before the children answer; they never clash (unregistered)

    def collect(self):
        merged: dict[str, object] = {}
        for child in self.children:
            for fam in child.fetch_metrics():
                if fam.name not in self.names:
                    continue
                if fam.name not in merged:
                    merged[fam.name] = fam
                    continue
                into = merged[fam.name]
                index = {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(into.samples)}
                for smp in fam.samples:
                    i = index.get((smp.name, tuple(sorted(smp.labels.items()))))
                    if i is None:
                        into.samples.append(smp)
                    elif not smp.name.endswith("_created"):
                        into.samples[i] = into.samples[i]._replace(value=into.samples[i].value + smp.value)
        return list(merged.values())


def serve_child_metrics(metrics: Metrics, children: list[EngineProcess]) -> None:
    """Unregister the parent's copies of the metrics the children update; serve the children's."""
    names = set()
    for attr in CHILD_METRICS:
        m = getattr(metrics, attr)
        names |= {f.name for f in m.collect()}
        metrics.registry.unregister(m)
    metrics.registry.register(_ChildMetrics(children, names))


def _rows(item: Sentence | EncodeJob) -> int:
    return item.beam if isinstance(item, Sentence) else 1


class EngineProcess:
    """One child process and its pipe; `EnginePool` runs one per decode worker."""

    def __init__(self, settings: Settings, start_timeout: float = 300.0):
        self.settings = settings
        self.start_timeout = start_timeout
        self.provider = "cpu"
        self.sessions = 0
        self._ctx = mp.get_context("spawn")  # never fork a process that runs gRPC threads
        self._conn: Connection | None = None
        self._proc = None
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()  # _pending and _accepting
        self._pending: dict[int, Sentence | EncodeJob] = {}
        self.load = 0  # rows of _pending (a sentence counts its beams): what the pool balances on
        self._keys = itertools.count()
        self._accepting = True
        self._stopping = False
        self._idle = threading.Condition(self._lock)
        self._metric_replies: dict[int, list] = {}
        self._metric_ready = threading.Condition()
        self._reader: threading.Thread | None = None

    # -- life cycle ---------------------------------------------------------------------

    def start_process(self) -> None:
        """Start the child and wait until its models are loaded. ModelLoadError on failure."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(
            target=_child_main,
            args=(child, self.settings.model_dump_json(), self.settings.log_level),
            name="mtserve-engine",
            daemon=True,
        )
        proc.start()
        child.close()
        self._starting = (parent, proc)

    def wait_ready(self) -> None:
        parent, proc = self._starting
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

    def request_shutdown(self) -> None:
        self._stopping = True
        self._send(("shutdown",))

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
        fields = []
        for s in sentences:
            s.key = next(self._keys)
            fields.append(
                (
                    s.key,
                    list(s.src_ids),
                    s.beam,
                    s.length_penalty,
                    s.max_len,
                    s.want_alignment,
                    s.deadline,
                    s.on_tokens is not None,
                )
            )
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
                self.load += _rows(item)
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
            if item is not None:
                self.load -= _rows(item)
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
            except Exception:
                log.exception("engine process: unreadable message from the child")
                if self._stopping:
                    return
                self._proc.kill()
                self._child_died()
                continue
            try:
                self._handle(msg)
            except Exception:
                log.exception("engine process reader: cannot handle %r", msg[:2] if isinstance(msg, tuple) else msg)

    def _handle(self, msg) -> None:
        op = msg[0]
        if op == "done" or op == "encoded":
            item = self._forget(msg[1])
            if item is not None:
                settle(item.future, result=msg[2])
        elif op == "error":
            item = self._forget(msg[1])
            if item is not None:
                settle(item.future, error=msg[2])
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


class EnginePool:
    """`decode_workers` engine processes with one decode worker each, behind the Scheduler
    interface: no two decode loops share a GIL. Each request goes to the child with the fewest
    unanswered rows; each child has 1/N of max_queue_size."""

    def __init__(self, settings: Settings, metrics: Metrics, start_timeout: float = 300.0):
        n = settings.decode_workers
        per_child = settings.model_copy(
            update={"decode_workers": 1, "max_queue_size": max(1, -(-settings.max_queue_size // n))}
        )
        self.settings = settings
        self.children = [EngineProcess(per_child, start_timeout) for _ in range(n)]
        serve_child_metrics(metrics, self.children)
        self.provider, self.sessions = "cpu", 0

    def start_process(self) -> None:
        for c in self.children:
            c.spawn()
        errors_seen = []
        for c in self.children:
            try:
                c.wait_ready()
            except ModelLoadError as e:
                errors_seen.append(e)
        if errors_seen:
            self.shutdown()
            raise errors_seen[0]
        self.provider = self.children[0].provider
        self.sessions = sum(c.sessions for c in self.children)

    def start(self) -> None:
        if any(c._conn is None for c in self.children):
            self.start_process()

    def _least_loaded(self) -> EngineProcess:
        return min(self.children, key=lambda c: c.load)

    def submit(self, sentences: list[Sentence]) -> None:
        self._least_loaded().submit(sentences)

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        self._least_loaded().submit_encode(jobs)

    def stop_accepting(self) -> None:
        for c in self.children:
            c.stop_accepting()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(c.wait_idle(max(0.0, end - time.monotonic())) for c in self.children)

    @property
    def idle(self) -> bool:
        return all(c.idle for c in self.children)

    @property
    def queue_depth(self) -> int:
        return sum(c.queue_depth for c in self.children)

    def shutdown(self, timeout: float = 5.0) -> None:
        for c in self.children:  # all children stop at once, then each is joined
            c.request_shutdown()
        for c in self.children:
            c.shutdown(timeout)
