"""The grpc.aio server: one process's whole server (`mtserve serve` runs it through
service.replicas, in this process or as one of several replicas).

Start-up: load and verify the export (manifest checksums), start the ONNX Runtime session pair
(one shared by the decode workers on the CPU, one per worker on CUDA), warm up, then report SERVING on `grpc.health.v1`. SIGTERM/SIGINT: report
NOT_SERVING, refuse new work with UNAVAILABLE, finish in-flight work within the grace period,
exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from wsgiref.simple_server import WSGIServer

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from service import tracing
from service.api.inference import grpc_service_pb2_grpc
from service.api.mtserve.v1 import translation_pb2, translation_pb2_grpc
from service.engine.backend import Backend
from service.engine.engine import Engine
from service.errors import ModelLoadError, ServiceError
from service.grpc.interceptors import ErrorAndMetricsInterceptor
from service.grpc.security import AuthInterceptor, load_tokens, server_credentials
from service.grpc.servicer import TranslationServicer
from service.kserve.codec import served_version
from service.kserve.servicer import SERVICE_NAME as KSERVE_SERVICE_NAME
from service.kserve.servicer import KServeServicer
from service.metrics import Metrics
from service.repository.layout import VersionDir, load_mode, parse_model_ref, scan, wanted
from service.repository.loader import BackendFactory, ModelLoader, read_export
from service.repository.registry import ModelRegistry
from service.repository.residency import MB, Residency
from service.runtime.gil import set_switch_interval
from service.settings import Settings

log = logging.getLogger("mtserve.server")
SERVICE_NAME = translation_pb2.DESCRIPTOR.services_by_name["TranslationService"].full_name


class Server:
    """The assembled server; `start()` / `drain()` for tests, `run()` for the CLI.

    `backend_factory`: decode with the backend it builds instead of the ONNX Runtime sessions
    (in-process scheduler or engine processes); the manifest, the tokenizer and everything in front
    of the backend stay the server's own (service.repository.loader loads the versions)."""

    def __init__(self, settings: Settings, backend_factory: BackendFactory | None = None):
        self.settings = settings
        self.backend_factory = backend_factory
        self.metrics = Metrics()
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        self.server: grpc.aio.Server | None = None
        self.rpcs = ErrorAndMetricsInterceptor(self.metrics, settings.max_request_bytes)
        self.port: int | None = None
        self.metrics_port: int | None = None
        self._metrics_http: WSGIServer | None = None
        self.ready = False  # health SERVING: KServe ServerReady/ModelReady report it
        self._health_wanted: int = health_pb2.HealthCheckResponse.NOT_SERVING  # SERVING once started, until the drain
        single = settings.model_dir is not None
        self.loader = ModelLoader(settings, self.metrics, backend_factory)
        residency = Residency(settings.memory_budget_mb * MB, self.loader.estimate)
        self.models = ModelRegistry(
            None if single else settings.model_repository,
            self.loader.load,
            self.metrics,
            settings.grace_period_s,
            residency,
        )
        self.models.on_change = self._models_changed
        self.tls: bool  # set by start()

    @property
    def engine(self) -> Engine:
        """The default model's engine."""
        return self.models.default().engine

    @property
    def scheduler(self) -> Backend:
        """The default model's backend."""
        return self.models.default().backend

    async def start(self, before_listen: Callable[[], Awaitable[None]] | None = None) -> None:
        """Load and warm up the models, then listen and report SERVING. `before_listen` runs in
        between (replicas wait there until all of them are warm, so that none gets the first
        connections alone)."""
        st = self.settings
        credentials = server_credentials(st)  # bad TLS files or tokens fail before the slow model load
        tokens = load_tokens(st)
        tracing.configure()  # OTEL_TRACES_EXPORTER: off unless it names an exporter
        try:
            await self._load_start_models()
            if st.default_model:
                self._set_default_model(st.default_model)
            if before_listen is not None:
                await before_listen()
        except BaseException:
            self.models.shutdown()  # the versions loaded before the one that failed (or all of them)
            raise
        self.server = self._grpc_server(tokens)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        await self._listen(self.server, credentials)
        self._serve_metrics()
        await self._set_health(health_pb2.HealthCheckResponse.SERVING)
        self._log_serving(tokens)

    async def _load_start_models(self) -> None:
        """Load the start models that are not on demand while they fit the memory budget; list
        the others as available (loaded on their first request)."""
        for source in self._start_models():
            if load_mode(source) == "on_demand" or not self.models.residency.fits(source, self.models.all()):
                self.models.offer(source)
                log.info("%s:%s is available, loaded on its first request", source.name, source.version)
            else:
                await self.models.add(source)

    def _set_default_model(self, ref: str) -> None:
        """MTSERVE_DEFAULT_MODEL: a loaded model, or one available on demand."""
        try:
            name, version = parse_model_ref(ref, "default_model")
            key = (name, version or self.models.default_versions.get(name, ""))
            if key in self.models.available and key not in self.models.served:
                self.models.set_default(self.models.available[key])
                return
            # NAME:VERSION names the default version too
            self.models.set_default(self.models.resolve(ref, "default_model"))
        except ServiceError as e:
            raise ModelLoadError(e.message) from None

    def _start_models(self) -> list[VersionDir]:
        """What to load at start: the one model dir, or the repository's models (MTSERVE_MODELS)."""
        st = self.settings
        if st.model_dir is not None:
            manifest, _ = read_export(st, None)
            return [VersionDir(manifest.name, served_version(manifest), st.model_dir, st.onnx_dir)]
        try:
            chosen = wanted(scan(st.model_repository), st.model_list)
        except ServiceError as e:
            raise ModelLoadError(e.message) from None
        if not chosen:
            raise ModelLoadError(f"model_repository: no model in {st.model_repository} (layout: NAME/VERSION/)")
        return chosen

    # -- the gRPC server, its servicers and its listener --------------------------------------

    def _grpc_server(self, tokens: list[str]) -> grpc.aio.Server:
        """The server with both APIs, health and reflection; not listening yet."""
        st = self.settings
        server = grpc.aio.server(
            # The error interceptor comes first (outermost) so that it maps the auth refusals too.
            interceptors=[self.rpcs] + ([AuthInterceptor(tokens)] if tokens else []),
            options=[
                ("grpc.max_receive_message_length", st.max_receive_message_bytes),
                ("grpc.max_send_message_length", 64 * 1024 * 1024),
                # Off for one server, so that a second one on the port fails to bind instead of
                # sharing it; on for replicas (service.replicas), which share the port by design.
                ("grpc.so_reuseport", 1 if st.replicas > 1 else 0),
            ],
        )
        translation_pb2_grpc.add_TranslationServiceServicer_to_server(
            TranslationServicer(self.models, st, self.metrics), server
        )
        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
            KServeServicer(self.models, st, ready=lambda: self.ready), server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [
                SERVICE_NAME,
                KSERVE_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
        )
        return server

    async def _listen(self, server: grpc.aio.Server, credentials: grpc.ServerCredentials | None) -> None:
        """Bind the address (TLS when there are credentials) and start serving RPCs."""
        address = self.settings.address
        self.port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
        self.tls = credentials is not None
        if self.port == 0:
            raise ModelLoadError(f"cannot listen on {address}")
        await server.start()

    def _serve_metrics(self) -> None:
        """The /metrics HTTP endpoint, when a port is configured."""
        st = self.settings
        if st.metrics_port:
            self._metrics_http, _ = self.metrics.serve(st.metrics_port, st.metrics_address)
            self.metrics_port = self._metrics_http.server_port

    def _log_serving(self, tokens: list[str]) -> None:
        st = self.settings
        for m in self.models.all():
            log.info(
                "serving %s%s (%s, %s, %s decoder step, %d decode workers x %d threads, %d session pair%s%s)",
                m.ref,
                " (default)" if m is self.models.default() else "",
                m.provider,
                st.precision,
                m.graph,
                st.decode_workers,
                st.intra_op_threads,
                m.sessions,
                "" if m.sessions == 1 else "s",
                ", each in an engine process" if st.engine_process else "",
            )
        log.info(
            "listening on %s%s; %s, %s",
            st.address,
            f", metrics on :{self.metrics_port}" if self.metrics_port else "",
            ("TLS with client certificates" if st.tls_client_ca_file else "TLS") if self.tls else "plaintext",
            f"bearer tokens required ({len(tokens)} accepted)" if tokens else "no authentication",
        )

    # -- health, warm-up, drain ------------------------------------------------------------------

    async def _set_health(self, status: int) -> None:
        """Report `status` (a HealthCheckResponse.ServingStatus) for the server and mtserve.v1;
        SERVING only while a model is loaded (`_models_changed` follows the loads and unloads)."""
        self._health_wanted = status
        if not self.models.served and not self.models.available:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
        self.ready = status == health_pb2.HealthCheckResponse.SERVING
        for name in ("", SERVICE_NAME):
            result = self.health.set(name, status)
            if asyncio.iscoroutine(result):
                await result

    async def _models_changed(self) -> None:
        """Health follows what can be served: NOT_SERVING with no model loaded, SERVING again once
        one is (between the start and the drain)."""
        if self._health_wanted == health_pb2.HealthCheckResponse.SERVING:
            await self._set_health(self._health_wanted)

    async def drain(self) -> None:
        """NOT_SERVING, refuse new work, finish what was accepted within the grace period, stop."""
        grace = self.settings.grace_period_s
        log.info("draining: finishing in-flight work (grace period %.1fs)", grace)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
        self.models.stop_accepting()
        loop = asyncio.get_running_loop()
        end = time.monotonic() + grace
        finished = await loop.run_in_executor(None, self.models.wait_idle, grace)
        # The engine is idle, but handlers may still be writing answers (a stream's last chunks), and
        # calls still arrive that our handlers refuse as UNAVAILABLE; gRPC would cancel those if
        # they reached it while the listener closes.
        finished = finished and await self.rpcs.activity.wait_quiet(self.settings.drain_quiet_s, end)
        if not finished:
            log.warning("grace period over with work in flight; stopping anyway")
        if self.server is not None:
            await self.server.stop(grace=max(end - time.monotonic(), 0.0) if finished else 0)
        self.models.shutdown()
        # Exports the spans still buffered in what is left of the grace period (a moment at least,
        # for the spans of the last calls), and stops waiting for a collector that does not answer.
        tracing.shutdown(timeout_s=max(end - time.monotonic(), 0.5))
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        log.info("drained; exiting")

    async def run(
        self,
        before_listen: Callable[[], Awaitable[None]] | None = None,
        on_serving: Callable[[], None] | None = None,
    ) -> None:
        """Serve until SIGTERM or SIGINT, then drain: the process's entry point (the settings
        that are the process's own, such as the GIL's switch interval, are applied here).
        `before_listen` as in start(); `on_serving` runs once the server reports SERVING (a
        replica tells its supervisor)."""
        set_switch_interval(self.settings.gil_switch_interval_ms)
        await self.start(before_listen)
        if on_serving is not None:
            on_serving()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await self.drain()


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every setting is a flag too; flags override MTSERVE_* environment variables."""
    for name, f in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        if f.annotation is bool:
            p.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=f.description)
        else:
            p.add_argument(flag, dest=name, default=None, help=f.description)


def settings_from_args(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if k in Settings.model_fields and v is not None}
    return Settings(**overrides)
