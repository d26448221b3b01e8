"""OpenTelemetry traces (README "Tracing"), off by default.

`configure()` turns them on when OTEL_TRACES_EXPORTER names an exporter (`otlp`: OTLP over gRPC,
or `console`, or any installed `opentelemetry_traces_exporter` entry point); everything else is
the SDK's standard OTEL_* variables: OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT), headers
and certificates, OTEL_TRACES_SAMPLER(_ARG), OTEL_SERVICE_NAME (default `mtserve`),
OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_* (the batch span processor), OTEL_PROPAGATORS. Unset, or
`none`: no provider, no exporter, and `tracer` stays None, which every hook checks first.

What is traced:

    <service>/<method>      one SERVER span per RPC (not health or reflection), continuing the
                            caller's W3C `traceparent` from the gRPC metadata
      mtserve.queue         per sentence: from its submission to joining a decode batch
      mtserve.encoder       per sentence: the encoder run of the group it joined with (rows)
      mtserve.decode        per sentence: from joining its batch to its last token (steps,
                            tokens); linked to the batch's span
      mtserve.sentence      instead of the three above, a sentence decoded in an engine process
                            or one that never joined a batch (expired, cancelled, failed)
    mtserve.decode_batch    one root span per decode batch of a decode worker, from its first
                            encoder run to its last row leaving (steps, rows, sentences)

The scheduler's hooks (`joined`, `stepped`, `batch_ended`) run in its worker threads; a sentence
carries its trace through it as `Sentence.trace` (a `SentenceTrace`, set by the engine only for
a sampled RPC). The per-sentence spans are made with explicit start and end times taken from the
scheduler's own clocks, so tracing adds no timing calls to the decode loop.

Tracing is bounded against its callers and its collector (docs/security.md "Tracing";
service/trace_context.py): a `traceparent` or `tracestate` that is not valid W3C Trace Context (or a `tracestate` longer than
512 characters) is dropped before extraction, with at most one short log line a minute for all of
them; OpenTelemetry's own warnings are held to the same rate and cut short. The RPC span is made
current around each step of its handler (never across a stream's yields, which a cancelled call
may finish in another task). `shutdown(timeout_s)` stops waiting for the exporter at the time
given, which the drain takes from its grace period.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer

from service.errors import StartupError
from service.trace_context import carrier, limit_otel_logs

log = logging.getLogger("mtserve.tracing")

tracer: Tracer | None = None  # None: tracing is off
_provider: Any = None  # the SDK's TracerProvider, for shutdown()
_exporters: list[Any] = []  # its span exporters, stopped by shutdown() when time runs out

# Services whose RPCs get no span: probes and tooling, not work.
UNTRACED_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection")

# Clock offsets: the scheduler stamps time.monotonic() and time.perf_counter(); spans want Unix
# nanoseconds.
_MONOTONIC_TO_UNIX_NS = time.time_ns() - time.monotonic_ns()
_PERF_TO_UNIX_NS = time.time_ns() - time.perf_counter_ns()


def _mono_ns(t: float) -> int:
    return int(t * 1e9) + _MONOTONIC_TO_UNIX_NS


def _perf_ns(t: float) -> int:
    return int(t * 1e9) + _PERF_TO_UNIX_NS


# -- configuration --------------------------------------------------------------------------


def exporter_names(environ: Mapping[str, str] | None = None) -> list[str]:
    """The exporters OTEL_TRACES_EXPORTER asks for; empty = tracing off (unset, `none`, or
    OTEL_SDK_DISABLED=true)."""
    env: Mapping[str, str] = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    return [n for n in names if n and n != "none"]


def _exporter(name: str) -> Any:
    if name in ("otlp", "otlp_proto_grpc"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    found = {e.name: e for e in metadata.entry_points(group="opentelemetry_traces_exporter")}
    if name not in found:
        known = ", ".join(sorted({"otlp", *found}))
        raise StartupError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (installed: {known}, or none)")
    return found[name].load()()


def configure() -> bool:
    """Start tracing as the OTEL_* variables say; False (and nothing set up) when they do not ask
    for it. StartupError for an exporter that is not installed."""
    global tracer, _provider
    names = exporter_names()
    if not names:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "mtserve"}))
    # No shutdown at exit: the drain calls shutdown() with what is left of its grace period.
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)  # the sampler: OTEL_TRACES_SAMPLER
    exporters = [_exporter(name) for name in names]
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    limit_otel_logs()
    try:
        version = metadata.version("mtserve")
    except metadata.PackageNotFoundError:
        version = "0"
    _provider, tracer = provider, provider.get_tracer("mtserve", version)
    _exporters[:] = exporters
    return True


def shutdown(timeout_s: float = 30.0) -> bool:
    """Export what is buffered and stop (the drain after SIGTERM), waiting at most `timeout_s`:
    an exporter still busy then (a collector that is down, retried with backoff) is stopped and
    its spans are dropped. True when everything was exported in time (or tracing was off)."""
    global tracer, _provider
    provider, _provider, tracer = _provider, None, None
    exporters, _exporters[:] = list(_exporters), []
    if provider is None:
        return True
    # The SDK's BatchSpanProcessor waits up to 30 s for its worker and takes no timeout: run it
    # in a daemon thread and stop waiting when the time is up.
    stopping = threading.Thread(target=provider.shutdown, name="mtserve-tracing-shutdown", daemon=True)
    stopping.start()
    stopping.join(max(timeout_s, 0.0))
    if not stopping.is_alive():
        return True
    log.warning("tracing: spans not exported within %.1fs are dropped (is the collector reachable?)", timeout_s)
    for exporter in exporters:  # ends their retries: the worker thread exits instead of backing off
        exporter.shutdown()
    return False


# -- RPC spans --------------------------------------------------------------------------------


class RpcSpan:
    """The SERVER span of one RPC, current while its handler runs (the engine's spans become its
    children)."""

    def __init__(self, full_method: str, metadata: Iterable[tuple[str, Any]] | None):
        assert tracer is not None
        name = full_method.lstrip("/")
        service, _, method = name.rpartition("/")
        # gRPC metadata as the propagator's carrier: W3C traceparent/tracestate (OTEL_PROPAGATORS).
        self.span = tracer.start_span(
            name,
            context=propagate.extract(carrier(metadata, method)),
            kind=SpanKind.SERVER,
            attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
        )
        self._context = trace.set_span_in_context(self.span)

    @contextlib.contextmanager
    def current(self) -> Iterator[None]:
        """The span current in the block, which must not span a yield of a streaming handler:
        attach and detach happen in the same task, the one that runs the block."""
        token = otel_context.attach(self._context)
        try:
            yield
        finally:
            otel_context.detach(token)

    def end(self, code: str, code_number: int, error: BaseException | None, message: str = "") -> None:
        """End the span with the status the client saw."""
        self.span.set_attribute("rpc.grpc.status_code", code_number)
        if code != "OK":
            self.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}" if message else code))
            if error is not None and code in ("INTERNAL", "UNKNOWN"):
                self.span.record_exception(error)
        self.span.end()


def traced_method(full_method: str) -> bool:
    return tracer is not None and not full_method.lstrip("/").startswith(UNTRACED_SERVICES)


def annotate(attributes: dict[str, Any]) -> None:
    """Attributes on the current span (the RPC's), when it records."""
    span = trace.get_current_span()
    if span.is_recording():
        span.set_attributes(attributes)


@contextlib.contextmanager
def span(name: str, attributes: dict[str, Any]) -> Iterator[None]:
    """A child of the current span around the block (a TranslateMany item); nothing when off."""
    if tracer is None:
        yield
        return
    with tracer.start_as_current_span(name, attributes=attributes):
        yield


# -- sentences and decode batches ----------------------------------------------------------------


@dataclass
class BatchTrace:
    """A decode batch's span and what it counts while the batch lives."""

    span: Span
    steps: int = 0
    max_rows: int = 0
    sentences: int = 0
    joins: int = 0


@dataclass
class SentenceTrace:
    """A sampled sentence's place in its request's trace (`Sentence.trace`)."""

    parent: Context  # the RPC span's context
    index: int  # its text's index in the request
    decode: Span | None = None
    batch: BatchTrace | None = None
    steps_at_join: int = 0


# The live decode batches of every worker, by id() of the batch's members dict (the one object
# that lives exactly as long as the batch, concatenations included). Each worker thread touches
# only its own entries.
_batches: dict[int, BatchTrace] = {}


def follow(sentences: list[Any]) -> None:
    """Engine hook (event loop): trace `sentences` under the current span if it is sampled."""
    if tracer is None or not trace.get_current_span().is_recording():
        return
    parent = otel_context.get_current()
    for i, s in enumerate(sentences):
        s.trace = SentenceTrace(parent, i)
        s.future.add_done_callback(functools.partial(_sentence_done, s))


def joined(members: dict, group: list[Any], t0: float, t1: float) -> None:
    """Scheduler hook (worker thread): `group` ran the encoder from t0 to t1 (perf_counter) and
    joined the decode batch whose members dict is `members`."""
    assert tracer is not None
    batch = _batches.get(id(members))
    if batch is None:
        s0 = group[0]
        batch = _batches[id(members)] = BatchTrace(
            tracer.start_span(
                "mtserve.decode_batch",
                context=Context(),  # a root: the batch serves many requests' traces
                start_time=_perf_ns(t0),
                attributes={"mtserve.beam": s0.beam, "mtserve.length_penalty": s0.length_penalty},
            )
        )
    batch.sentences += len(group)
    batch.joins += 1
    link = Link(batch.span.get_span_context())
    for s in group:
        tr: SentenceTrace | None = s.trace
        if tr is None:
            continue
        common = {"mtserve.text_index": tr.index}
        if s.admitted is not None:
            _interval("mtserve.queue", tr.parent, _mono_ns(s.enqueued), _mono_ns(s.admitted), common)
        _interval(
            "mtserve.encoder",
            tr.parent,
            _perf_ns(t0),
            _perf_ns(t1),
            {**common, "mtserve.rows": len(group), "mtserve.input_tokens": len(s.src_ids)},
        )
        tr.decode = tracer.start_span(
            "mtserve.decode",
            context=tr.parent,
            start_time=_perf_ns(t1),
            links=[link],
            attributes={**common, "mtserve.rows": s.beam},
        )
        tr.batch, tr.steps_at_join = batch, batch.steps


def stepped(members: dict, rows: int) -> None:
    """Scheduler hook: the batch of `members` ran a decoder step over `rows` rows (before the
    sentences that finished at it are answered)."""
    batch = _batches.get(id(members))
    if batch is not None:
        batch.steps += 1
        batch.max_rows = max(batch.max_rows, rows)


def batch_ended(members: dict, error: BaseException | None = None) -> None:
    """Scheduler hook: the batch of `members` is gone (its last row left, or its step failed)."""
    batch = _batches.pop(id(members), None)
    if batch is None:
        return
    batch.span.set_attributes(
        {
            "mtserve.steps": batch.steps,
            "mtserve.max_rows": batch.max_rows,
            "mtserve.sentences": batch.sentences,
            "mtserve.joins": batch.joins,
        }
    )
    if error is not None:
        batch.span.set_status(Status(StatusCode.ERROR, type(error).__name__))
    batch.span.end()


def _interval(name: str, parent: Context, start_ns: int, end_ns: int, attributes: dict[str, Any]) -> None:
    assert tracer is not None
    tracer.start_span(name, context=parent, start_time=start_ns, attributes=attributes).end(end_time=end_ns)


def _outcome(span: Span, future: Future) -> None:
    """The sentence's result on its span: tokens, or the error status."""
    if future.cancelled():
        span.set_status(Status(StatusCode.ERROR, "CANCELLED"))
        return
    error = future.exception()
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, str(getattr(error, "code", type(error).__name__))))
        return
    span.set_attribute("mtserve.output_tokens", len(future.result().tokens) + 1)


def _sentence_done(sentence: Any, future: Future) -> None:
    """The sentence's future settled (in a decode worker, a reader thread, or the canceller)."""
    tr: SentenceTrace = sentence.trace
    if tr.decode is not None:
        assert tr.batch is not None
        tr.decode.set_attribute("mtserve.steps", tr.batch.steps - tr.steps_at_join)
        _outcome(tr.decode, future)
        tr.decode.end()
        return
    if tracer is None:
        return
    span = tracer.start_span(
        "mtserve.sentence",
        context=tr.parent,
        start_time=_mono_ns(sentence.enqueued),
        attributes={"mtserve.text_index": tr.index, "mtserve.rows": sentence.beam},
    )
    _outcome(span, future)
    span.end()
