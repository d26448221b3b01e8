"""`mtserve serve` with `--replicas N`: N copies of the whole server on one gRPC port.

A server process shares one GIL between its event loop (gRPC, validation, tokenisation) and its
decode workers, and at high concurrency they wait for it rather than compute (docs/performance.md:
one process uses 1.4 of 2 cores at concurrency 64, greedy). Replicas are the way out that
uvicorn's and gunicorn's workers take: each replica is a whole `service.server.Server` in a process
of its own, so each has its own GIL, its own event loop and its own decode workers.

Each replica binds the same address with `SO_REUSEPORT` (Linux), and the kernel hands each new
connection to one of them by a hash of its addresses. So one client connection stays with one
replica, as it stays with one pod behind a Kubernetes Service; many clients, or a client with
several connections, spread over all of them.

This process is the supervisor. It serves no RPC. It
- checks that the address is free before the replicas bind it (with `SO_REUSEPORT` a second server
  on the port would otherwise share it silently), and picks the port when the address asks for 0;
- spawns the replicas and lets them bind the port once every one has loaded and warmed up its
  models, so that the first clients do not all connect to the replica that was ready first; if
  one cannot start, it stops the others and exits with that error (exit code 2, as a single
  server does);
- serves /metrics on `metrics_port`: every replica's metrics, fetched over its pipe at each
  scrape, with a `replica` label, and its own `mtserve_replicas_ready` and
  `mtserve_replica_restarts_total`;
- restarts a replica that exits or dies. Its requests in flight fail, as they would in a crashed
  single server; the other replicas serve on and new connections go to them meanwhile;
- on SIGTERM or SIGINT passes SIGTERM to every replica. Each drains as a single server does
  (NOT_SERVING, finishes what it accepted within the grace period) and exits.

What stays per replica: health (each answers for itself), KServe's model statistics (the
replica a call lands on reports its own), and the loaded models: loading and unloading over
KServe's repository API is refused with replicas, since it would change one replica only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from types import FrameType
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.metrics_core import Metric

from service.errors import StartupError
from service.parallel.messages import MetricsReply, MetricsRequest
from service.parallel.messages import StartupError as StartupFailed
from service.runtime.memory import keep_freed_memory
from service.server import Server, add_arguments, settings_from_args
from service.settings import Settings

log = logging.getLogger("mtserve.replicas")

__all__ = ["add_arguments", "run", "serve"]

ServerFactory = Callable[[Settings], Server]
"""Builds one replica's server from its settings. It crosses to the replica's process by pickling
(the process is spawned, not forked), so it is a module-level callable or a functools.partial of
one: `Server` itself, or benchmarks/ct2_server.py's server over CTranslate2."""

START_TIMEOUT_S = 600.0  # loading, verifying and warming up every model of a replica
SCRAPE_TIMEOUT_S = 5.0  # a replica that does not answer a scrape in time is left out of it
EXIT_MARGIN_S = 10.0  # after the grace period, for the replicas to close their sessions and exit
RESTART_DELAYS_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)  # a replica that keeps dying waits longer each time
STABLE_AFTER_S = 60.0  # a replica that served this long starts over from the first delay


@dataclass(frozen=True, slots=True)
class ReplicaWarm:
    """replica -> supervisor: the models are loaded and warmed up; the replica waits for Listen."""


@dataclass(frozen=True, slots=True)
class Listen:
    """supervisor -> replica: bind the port and serve. At start-up it goes out once every replica
    is warm, so that the first connections do not all land on the replica that was warm first (the
    kernel only spreads connections over the listeners it has); a restarted replica gets it at once."""


@dataclass(frozen=True, slots=True)
class ReplicaReady:
    """replica -> supervisor: it listens and its health reports SERVING."""

    port: int


def run(args: argparse.Namespace) -> None:
    """`mtserve serve`: one server in this process, or `replicas` of them under a supervisor."""
    try:
        settings = settings_from_args(args)
    except ValueError as e:  # pydantic's ValidationError: bad usage, one line at the CLI's boundary
        raise argparse.ArgumentTypeError(f"invalid settings: {e}") from None
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        serve(settings)
    except StartupError as e:  # ModelLoadError, bad TLS files, no tokens, a port in use
        log.error("cannot start: %s", e)
        sys.exit(2)


def serve(settings: Settings, make_server: ServerFactory = Server) -> None:
    """Serve until SIGTERM or SIGINT: in this process when `settings.replicas` is 1, else as the
    supervisor of that many replica processes. StartupError when the server cannot start."""
    if settings.replicas == 1:
        keep_freed_memory()
        asyncio.run(make_server(settings).run())
    else:
        Supervisor(settings, make_server).run()


# ------------------------------------------------------------------------------- a replica


def replica_main(conn: Connection, index: int, settings: Settings, make_server: ServerFactory) -> None:
    """A replica's process: the server, and a thread that answers the supervisor's scrapes."""
    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s %(name)s[replica {index}]: %(message)s",
    )
    keep_freed_memory()
    try:
        server = make_server(settings)
        asyncio.run(
            server.run(
                before_listen=functools.partial(_warm, conn), on_serving=functools.partial(_serving, conn, server)
            )
        )
    except StartupError as e:
        conn.send(StartupFailed(str(e)))
        sys.exit(2)


async def _warm(conn: Connection) -> None:
    """Tell the supervisor the models are warm, and wait for its Listen."""
    conn.send(ReplicaWarm())
    try:
        msg = await asyncio.get_running_loop().run_in_executor(None, conn.recv)
    except (EOFError, OSError):
        raise StartupError("the supervisor is gone") from None
    if not isinstance(msg, Listen):
        raise StartupError(f"the supervisor sent {type(msg).__name__} instead of Listen")


def _serving(conn: Connection, server: Server) -> None:
    """The replica serves: tell the supervisor, then answer its scrapes from a thread."""
    assert server.port is not None
    conn.send(ReplicaReady(server.port))
    threading.Thread(target=_answer_scrapes, args=(conn, server), name="replica-scrapes", daemon=True).start()


def _answer_scrapes(conn: Connection, server: Server) -> None:
    """Send the server's metric families for each MetricsRequest. The pipe closes when the
    supervisor is gone: the replica then drains and exits, as on SIGTERM."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            log.warning("the supervisor is gone; draining")
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if isinstance(msg, MetricsRequest):
            conn.send(MetricsReply(msg.token, list(server.metrics.registry.collect())))
        else:
            log.warning("ignored a %s from the supervisor", type(msg).__name__)


# ------------------------------------------------------------------------------- the supervisor


class Replica:
    """One replica process, its pipe and its restarts; the supervisor's main thread owns the
    life cycle, the scrape threads share the pipe under `lock` once the replica serves."""

    def __init__(self, index: int):
        self.index = index
        self.proc: BaseProcess | None = None
        self.conn: Connection | None = None
        self.warm = False
        self.serving = False
        self.started_at = 0.0  # monotonic time of the last spawn
        self.restart_at: float | None = None  # when to spawn it again after it died
        self.failures = 0  # deaths in a row that came soon after a start
        self.lock = threading.Lock()

    def handles(self, starting: bool) -> list[Connection | int]:
        """What the main thread waits on: the process's sentinel, and while it starts its pipe."""
        if self.proc is None or self.conn is None:
            return []
        return [self.proc.sentinel, self.conn] if starting else [self.proc.sentinel]


class Supervisor:
    def __init__(self, settings: Settings, make_server: ServerFactory):
        self.settings = settings
        self.make_server = make_server
        self.ctx = mp.get_context("spawn")  # the replicas start clean: no threads, no sessions copied
        self.replicas = [Replica(i) for i in range(settings.replicas)]
        self.stopping = False
        self.tokens = itertools.count()
        self.registry = CollectorRegistry()
        self.ready_gauge = Gauge(
            "mtserve_replicas_ready", "replicas serving (replicas > 1: server processes on one port)", registry=None
        )
        self.restarts = Counter(
            "mtserve_replica_restarts", "replicas restarted after they exited or died", registry=None
        )
        self.registry.register(_ReplicaCollector(self))
        self._metrics_http: WSGIServer | None = None
        self.replica_settings: Settings  # set by run(): the address's port resolved, metrics off

    def run(self) -> None:
        st = self.settings
        address = claim_address(st.address)
        self.replica_settings = st.model_copy(update={"address": address, "metrics_port": 0})
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for r in self.replicas:
            self._spawn(r)
        try:
            self._wait_all_serving()
        except BaseException:
            self._stop_all(grace=0)
            raise
        if st.metrics_port:
            self._metrics_http, _ = start_http_server(st.metrics_port, addr=st.metrics_address, registry=self.registry)
        log.info(
            "%d replicas serving on %s (each: %d decode workers x %d threads)%s",
            len(self.replicas),
            address,
            st.decode_workers,
            st.intra_op_threads,
            f", metrics on :{self._metrics_http.server_port}" if self._metrics_http else "",
        )
        self._supervise()
        self._stop_all(grace=st.grace_period_s)
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("all replicas stopped; exiting")

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, r: Replica) -> None:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(
            target=replica_main,
            args=(child, r.index, self.replica_settings, self.make_server),
            name=f"mtserve-replica-{r.index}",
        )
        proc.start()
        child.close()
        r.proc, r.conn, r.warm, r.serving, r.restart_at = proc, parent, False, False, None
        r.started_at = time.monotonic()

    def _wait_all_serving(self) -> None:
        """Until every replica serves; StartupError with the first failure's message."""
        end = time.monotonic() + START_TIMEOUT_S
        listening = False
        while not all(r.serving for r in self.replicas):
            if self.stopping:
                raise StartupError("stopped by a signal during start-up")
            waiting = [r for r in self.replicas if not r.serving]
            if time.monotonic() > end:
                raise StartupError(f"replica {waiting[0].index} did not serve within {START_TIMEOUT_S:.0f}s")
            ready = wait([h for r in waiting for h in r.handles(starting=True)], timeout=0.5)
            for r in waiting:
                if any(h in ready for h in r.handles(starting=True)):
                    error = self._read_start(r, listen_now=False)
                    if error is not None:
                        raise StartupError(f"replica {r.index}: {error}")
            if all(r.warm for r in self.replicas) and not listening:
                for r in self.replicas:
                    r.conn.send(Listen())  # type: ignore[union-attr]
                listening = True

    def _read_start(self, r: Replica, listen_now: bool) -> str | None:
        """A starting replica's next message: None while it is on its way (warm: told to listen
        when `listen_now`) or once it serves, else why it did not start."""
        assert r.conn is not None and r.proc is not None
        try:
            msg = r.conn.recv() if r.conn.poll() else None
        except (EOFError, OSError):
            msg = None
        match msg:
            case ReplicaWarm():
                r.warm = True
                if listen_now:
                    r.conn.send(Listen())
                return None
            case ReplicaReady():
                r.serving = True
                self.ready_gauge.inc()
                log.info("replica %d serving (pid %d)", r.index, r.proc.pid)
                return None
            case StartupFailed(message):
                r.proc.join(5)
                return message
            case None:
                r.proc.join(5)
                return f"exited during start-up (exit code {r.proc.exitcode})"
            case _:
                r.proc.kill()
                return f"sent {type(msg).__name__} before it served"

    def _supervise(self) -> None:
        """Restart replicas that die, until a signal asks to stop."""
        while not self.stopping:
            ready = wait([h for r in self.replicas for h in r.handles(starting=not r.serving)], timeout=0.5)
            now = time.monotonic()
            for r in self.replicas:
                if r.proc is None:
                    if r.restart_at is not None and now >= r.restart_at and not self.stopping:
                        log.info("restarting replica %d", r.index)
                        self.restarts.inc()
                        self._spawn(r)
                    continue
                if not r.serving and r.conn in ready:
                    error = self._read_start(r, listen_now=True)
                    if error is not None:
                        log.error("replica %d did not start: %s", r.index, error)
                        self._died(r, now)
                elif r.proc.sentinel in ready:
                    r.proc.join()
                    if not self.stopping:
                        log.error(
                            "replica %d exited (exit code %s); its requests in flight failed", r.index, r.proc.exitcode
                        )
                    self._died(r, now)

    def _died(self, r: Replica, now: float) -> None:
        """Forget the process; schedule its restart, later each time it dies soon after a start."""
        with r.lock:
            if r.serving:
                self.ready_gauge.dec()
            if r.conn is not None:
                r.conn.close()
            r.proc, r.conn, r.warm, r.serving = None, None, False, False
        if now - r.started_at >= STABLE_AFTER_S:
            r.failures = 0
        r.restart_at = now + RESTART_DELAYS_S[min(r.failures, len(RESTART_DELAYS_S) - 1)]
        r.failures += 1

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if not self.stopping:
            log.info("%s: draining the replicas", signal.Signals(signum).name)
        self.stopping = True

    def _stop_all(self, grace: float) -> None:
        """SIGTERM to every replica (each drains within `grace`), then wait; kill what is left."""
        live = [r for r in self.replicas if r.proc is not None and r.proc.is_alive()]
        for r in live:
            r.proc.terminate()  # type: ignore[union-attr]
        end = time.monotonic() + grace + EXIT_MARGIN_S
        for r in live:
            r.proc.join(max(end - time.monotonic(), 0.1))  # type: ignore[union-attr]
            if r.proc.is_alive():  # type: ignore[union-attr]
                log.warning("replica %d still running after the grace period; killing it", r.index)
                r.proc.kill()  # type: ignore[union-attr]
                r.proc.join()  # type: ignore[union-attr]

    # -- metrics -----------------------------------------------------------------------------

    def scrape(self) -> Iterable[tuple[int, list[Metric]]]:
        """(replica index, its metric families) of every serving replica that answers in time."""
        for r in self.replicas:
            with r.lock:
                if not r.serving or r.conn is None:
                    continue
                token = next(self.tokens)
                try:
                    r.conn.send(MetricsRequest(token))
                    families = _reply(r.conn, token)
                except (EOFError, OSError):
                    continue  # it is dying: the main thread restarts it
                if families is None:
                    log.warning("replica %d did not answer a scrape within %.0fs", r.index, SCRAPE_TIMEOUT_S)
                    continue
            yield r.index, families


def _reply(conn: Connection, token: int) -> list[Metric] | None:
    """The families answering `token`; replies to earlier scrapes that timed out are skipped."""
    end = time.monotonic() + SCRAPE_TIMEOUT_S
    while conn.poll(max(end - time.monotonic(), 0)):
        msg = conn.recv()
        if isinstance(msg, MetricsReply) and msg.token == token:
            return msg.families
    return None


class _ReplicaCollector:
    """The replicas' metric families merged by name, each sample labelled with its replica."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def collect(self) -> Iterable[Metric]:
        s = self.supervisor
        yield from s.ready_gauge.collect()
        yield from s.restarts.collect()
        merged: dict[str, Metric] = {}
        for index, families in s.scrape():
            for f in families:
                m = merged.setdefault(f.name, Metric(f.name, f.documentation, f.type, f.unit))
                for sample in f.samples:
                    labels = {**sample.labels, "replica": str(index)}
                    m.add_sample(sample.name, labels, sample.value, sample.timestamp, sample.exemplar)
        yield from merged.values()


# ------------------------------------------------------------------------------- the address


def claim_address(address: str) -> str:
    """`address` with its port resolved, once no other socket listens there. The replicas bind it
    with SO_REUSEPORT, which would otherwise share the port with another server of the same user
    instead of failing; port 0 asks for a free port, the same one for every replica."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not port_text.isdigit() or host.startswith("unix"):
        raise StartupError(f"address: replicas need host:port to share (got {address!r})")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        infos = socket.getaddrinfo(bare or None, int(port_text), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"address: cannot resolve {host!r}: {e}") from None
    port = int(port_text)
    for family, kind, proto, _, sockaddr in infos:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed server's TIME_WAIT is no clash
            try:
                s.bind((sockaddr[0], port, *sockaddr[2:]))
                s.listen(1)  # a listener elsewhere on the port makes this fail, not just a bound socket
            except OSError as e:
                raise StartupError(f"address: cannot listen on {address}: {e.strerror}") from None
            port = port or s.getsockname()[1]
    return f"{host}:{port}"
