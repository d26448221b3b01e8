"""OpenTelemetry traces, against a real OTLP/gRPC receiver on loopback: this test implements the
collector's TraceService (opentelemetry-proto), starts `mtserve serve` with the standard OTEL_*
variables pointing at it, sends requests that carry a W3C `traceparent`, and checks what arrives:
trace ids continued, parents, span names, kinds, attributes, links to the decode batches, and no
spans for health checks. Tracing is off without OTEL_TRACES_EXPORTER."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2

from service import tracing
from service.api.inference import grpc_service_pb2 as kserve_pb
from service.api.inference import grpc_service_pb2_grpc as kserve_grpc
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.client import Client, healthcheck, pb
from tests.support import free_port, serve_command, wait_serving

REPO = Path(__file__).resolve().parents[2]
SENTENCES = ["Ein Hund rennt durch den Schnee.", "Zwei Männer sitzen auf einer Bank."]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"  # the caller's trace
SERVER = trace_pb2.Span.SPAN_KIND_SERVER


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver that keeps every span it is sent."""

    def __init__(self):
        self.spans: list[tuple[dict, trace_pb2.Span]] = []  # (resource attributes, span)
        self.lock = threading.Lock()

    def Export(self, request, context):
        with self.lock:
            for rs in request.resource_spans:
                resource = {a.key: value(a.value) for a in rs.resource.attributes}
                for ss in rs.scope_spans:
                    self.spans.extend((resource, s) for s in ss.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, predicate, timeout: float = 20.0) -> list[trace_pb2.Span]:
        end = time.time() + timeout
        while time.time() < end:
            with self.lock:
                spans = [s for _, s in self.spans]
            if predicate(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"spans not received in {timeout}s: {sorted({s.name for s in spans})}")


def value(v):
    return getattr(v, v.WhichOneof("value")) if v.WhichOneof("value") else None


def attrs(span: trace_pb2.Span) -> dict:
    return {a.key: value(a.value) for a in span.attributes}


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    c = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(c, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield c, port
    server.stop(0)


@pytest.fixture(scope="module")
def traced(tiny_onnx_dir, collector):
    """`mtserve serve` exporting every span to the collector (schedule delay 50 ms)."""
    c, otlp_port = collector
    port = free_port()
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp_port}",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
        "OTEL_SERVICE_NAME": "mtserve-under-test",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mtserve",
            "serve",
            "--model-dir",
            str(tiny_onnx_dir.parent),
            "--onnx-dir",
            str(tiny_onnx_dir),
            "--address",
            f"127.0.0.1:{port}",
            "--metrics-port",
            "0",
            "--decode-workers",
            "1",
            "--precision",
            "fp32",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
    )
    address = f"127.0.0.1:{port}"
    wait_serving(address, proc)
    yield address, c
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def traceparent(parent_span: str) -> tuple[tuple[str, str]]:
    return (("traceparent", f"00-{TRACE_ID}-{parent_span}-01"),)


def request_spans(spans: list[trace_pb2.Span], parent_span: str) -> tuple[trace_pb2.Span, list[trace_pb2.Span]]:
    """The server span continuing the caller's span `parent_span`, and its descendants."""
    (root,) = [s for s in spans if s.parent_span_id.hex() == parent_span]
    family, frontier = [], [root.span_id]
    while frontier:
        children = [s for s in spans if s.parent_span_id in frontier]
        family += children
        frontier = [s.span_id for s in children]
    return root, family


def check_sentence_spans(spans, parent: trace_pb2.Span, children: list[trace_pb2.Span], texts: int, beam: int):
    """queue, encoder and decode spans per text under `parent`, in order in time, each decode span
    linked to a decode batch span that recorded its steps."""
    for name in ("mtserve.queue", "mtserve.encoder", "mtserve.decode"):
        mine = [s for s in children if s.name == name]
        assert len(mine) == texts, (name, [s.name for s in children])
        assert sorted(attrs(s)["mtserve.text_index"] for s in mine) == list(range(texts))
        for s in mine:
            assert s.trace_id == parent.trace_id and s.parent_span_id == parent.span_id
            assert parent.start_time_unix_nano <= s.start_time_unix_nano <= s.end_time_unix_nano
            assert s.end_time_unix_nano <= parent.end_time_unix_nano
    batches = {s.span_id: s for s in spans if s.name == "mtserve.decode_batch"}
    for i in range(texts):
        (q,) = [s for s in children if s.name == "mtserve.queue" and attrs(s)["mtserve.text_index"] == i]
        (e,) = [s for s in children if s.name == "mtserve.encoder" and attrs(s)["mtserve.text_index"] == i]
        (d,) = [s for s in children if s.name == "mtserve.decode" and attrs(s)["mtserve.text_index"] == i]
        assert q.end_time_unix_nano <= e.start_time_unix_nano + 1000  # clocks converted: within 1 us
        assert e.end_time_unix_nano <= d.start_time_unix_nano + 1000
        assert attrs(e)["mtserve.rows"] >= 1 and attrs(e)["mtserve.input_tokens"] >= 2
        a = attrs(d)
        assert a["mtserve.rows"] == beam and a["mtserve.steps"] >= 1 and a["mtserve.output_tokens"] >= 1
        (link,) = d.links
        batch = batches[link.span_id]
        assert link.trace_id == batch.trace_id != parent.trace_id  # the batch is a trace of its own
        assert batch.parent_span_id == b"" and batch.kind == trace_pb2.Span.SPAN_KIND_INTERNAL
        b = attrs(batch)
        assert b["mtserve.beam"] == beam and b["mtserve.steps"] >= a["mtserve.steps"] and b["mtserve.sentences"] >= 1
        assert batch.start_time_unix_nano <= d.start_time_unix_nano and d.end_time_unix_nano <= batch.end_time_unix_nano


def test_translate_continues_the_callers_trace(traced):
    address, c = traced
    parent = "00f067aa0ba902b7"
    with Client(address, timeout=60, metadata=traceparent(parent)) as client:
        client.translate(SENTENCES, beam_size=2)
    spans = c.wait_for(lambda spans: any(s.parent_span_id.hex() == parent for s in spans))
    spans = c.wait_for(lambda spans: len(request_spans(spans, parent)[1]) >= 6)
    root, children = request_spans(spans, parent)
    assert root.trace_id.hex() == TRACE_ID and root.kind == SERVER
    assert root.name == "mtserve.v1.TranslationService/Translate"
    a = attrs(root)
    assert a["rpc.system"] == "grpc" and a["rpc.service"] == "mtserve.v1.TranslationService"
    assert a["rpc.method"] == "Translate" and a["rpc.grpc.status_code"] == 0
    assert a["mtserve.texts"] == 2 and a["mtserve.model"]
    assert root.status.code != trace_pb2.Status.STATUS_CODE_ERROR
    check_sentence_spans(spans, root, children, texts=2, beam=2)
    resources = [r for r, s in c.spans if s.span_id == root.span_id]
    assert resources[0]["service.name"] == "mtserve-under-test"


def test_every_api_is_traced_the_same_way(traced):
    address, c = traced
    parents = {"stream": "1000000000000001", "many": "1000000000000002", "infer": "1000000000000003"}
    parents |= {"encode": "1000000000000004", "refused": "1000000000000005"}

    def client(name: str) -> Client:
        return Client(address, timeout=60, metadata=traceparent(parents[name]))

    with client("stream") as cl:
        assert list(cl.translate_stream(SENTENCES[0], beam_size=1))
    with client("encode") as cl:
        cl.encode(SENTENCES)
    with client("refused") as cl, pytest.raises(grpc.RpcError) as e:
        cl.translate(["\x00\x00"])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with Client(address, timeout=60) as cl:
        model = cl.model_info().name
    with grpc.insecure_channel(address) as ch:
        many = ch.stream_stream(
            "/mtserve.v1.TranslationService/TranslateMany",
            request_serializer=pb.TranslateManyRequest.SerializeToString,
            response_deserializer=pb.TranslateManyResponse.FromString,
        )
        items = [
            pb.TranslateManyRequest(
                id=f"item-{i}", request=pb.TranslateRequest(texts=[t], options=pb.TranslationOptions(beam_size=1))
            )
            for i, t in enumerate(SENTENCES)
        ]
        answers = list(many(iter(items), metadata=traceparent(parents["many"]), timeout=60))
        assert sorted(a.id for a in answers) == ["item-0", "item-1"]
        req = kserve_pb.ModelInferRequest(
            model_name=model, parameters={"beam_size": kserve_pb.InferParameter(int64_param=1)}
        )
        req.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
            s.encode() for s in SENTENCES
        )
        kserve_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, metadata=traceparent(parents["infer"]), timeout=60)

    def arrived(spans):
        have = {s.parent_span_id.hex() for s in spans}
        if not set(parents.values()) <= have:
            return False
        return (
            len(request_spans(spans, parents["many"])[1]) >= 8 and len(request_spans(spans, parents["infer"])[1]) >= 6
        )

    spans = c.wait_for(arrived)

    root, children = request_spans(spans, parents["stream"])
    assert root.name == "mtserve.v1.TranslationService/TranslateStream" and root.trace_id.hex() == TRACE_ID
    check_sentence_spans(spans, root, children, texts=1, beam=1)

    root, children = request_spans(spans, parents["infer"])
    assert root.name == "inference.GRPCInferenceService/ModelInfer" and root.kind == SERVER
    assert attrs(root)["mtserve.model"] == model and attrs(root)["mtserve.texts"] == 2
    check_sentence_spans(spans, root, children, texts=2, beam=1)

    root, children = request_spans(spans, parents["many"])
    assert root.name == "mtserve.v1.TranslationService/TranslateMany"
    item_spans = [s for s in children if s.name == "mtserve.TranslateMany.item"]
    assert sorted(attrs(s)["mtserve.item_id"] for s in item_spans) == ["item-0", "item-1"]
    for item in item_spans:
        assert item.parent_span_id == root.span_id
        check_sentence_spans(spans, item, [s for s in children if s.parent_span_id == item.span_id], texts=1, beam=1)

    root, children = request_spans(spans, parents["encode"])
    assert root.name == "mtserve.v1.TranslationService/Encode"
    assert attrs(root)["mtserve.model"].endswith("-encoder") and attrs(root)["mtserve.texts"] == 2

    root, children = request_spans(spans, parents["refused"])
    assert root.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    assert attrs(root)["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert root.status.message.startswith("INVALID_ARGUMENT: texts[0]:") and not children

    # Probes are not traced (wait_serving polled health before any of this).
    assert not [s for s in spans if s.name.startswith("grpc.health")]


def test_a_call_without_traceparent_starts_a_trace(traced):
    address, c = traced
    with Client(address, timeout=60) as client:
        client.translate(["Ein Kind lacht."], beam_size=1)
    spans = c.wait_for(
        lambda spans: any(s.kind == SERVER and not s.parent_span_id and s.name.endswith("/Translate") for s in spans)
    )
    (root,) = [s for s in spans if s.kind == SERVER and not s.parent_span_id and s.name.endswith("/Translate")]
    assert root.trace_id.hex() != TRACE_ID


def test_tracing_is_off_without_otel_traces_exporter(server):
    assert tracing.tracer is None  # the in-process test servers: no OTEL_TRACES_EXPORTER
    assert tracing.exporter_names({}) == []
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}) == []
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": "otlp, console"}) == ["otlp", "console"]


def test_an_unknown_exporter_stops_the_server_at_start_up(tiny_onnx_dir):
    proc = subprocess.run(
        [sys.executable, "-m", "mtserve", "serve", "--model-dir", str(tiny_onnx_dir.parent), "--metrics-port", "0"],
        env={**os.environ, "OTEL_TRACES_EXPORTER": "zipkin-nope"},
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "OTEL_TRACES_EXPORTER: unknown exporter 'zipkin-nope'" in proc.stdout + proc.stderr


# -- bounded against callers and an absent collector ---------------------------------------------

BAD_TRACESTATE = "Vendor=" + "x" * 7000  # 7 kB, and an upper-case key: not W3C tracestate


def start_toward_absent_collector(onnx_dir: Path, log_path: Path, *extra: str) -> tuple[subprocess.Popen, str]:
    """`mtserve serve` exporting to an OTLP endpoint nobody listens on; its log in `log_path`."""
    port = free_port()
    env = {
        **os.environ,
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",  # a closed port
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
    }
    address = f"127.0.0.1:{port}"
    command = serve_command(onnx_dir, address, "--metrics-port", "0", "--decode-workers", "1", *extra)
    with log_path.open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=env)
    healthcheck.wait_serving(address, 90, alive=lambda: proc.poll() is None)
    return proc, address


@pytest.fixture(scope="module")
def collector_down(tiny_onnx_dir, tmp_path_factory) -> Iterator[tuple[str, Path]]:
    log_path = tmp_path_factory.mktemp("collector-down") / "serve.log"
    proc, address = start_toward_absent_collector(tiny_onnx_dir, log_path)
    yield address, log_path
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_invalid_trace_headers_are_dropped_with_one_short_log_line(collector_down):
    address, log_path = collector_down
    before = log_path.stat().st_size
    metadata = (("traceparent", f"00-{TRACE_ID}-00f067aa0ba902b7-01"), ("tracestate", BAD_TRACESTATE))
    with Client(address, timeout=60, metadata=metadata) as client:
        for i in range(100):
            assert client.translate([f"Ein Hund Nummer {i}."], beam_size=1)[0].text
    with Client(address, timeout=60, metadata=(("traceparent", "00-" + "z" * 5000),)) as client:
        client.translate(["Ein Kind lacht."], beam_size=1)
    grown = log_path.read_text()[before:]
    assert len(grown) < 50_000, len(grown)
    header_lines = [line for line in grown.splitlines() if "trace" in line.lower()]
    assert len(header_lines) <= 1, header_lines  # one a minute at most
    assert all(len(line) < 1000 for line in header_lines)


def test_cancelled_streams_leave_nothing_pending(collector_down):
    address, log_path = collector_down
    before = log_path.stat().st_size
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)
        request = pb.TranslateStreamRequest(text=SENTENCES[1] * 3, options=pb.TranslationOptions(beam_size=1))
        for i in range(200):
            call = stub.TranslateStream(request, timeout=60, metadata=traceparent(f"{i + 1:016x}"))
            next(call)  # the first chunk
            call.cancel()
        with Client(address, timeout=60) as client:  # the server is still well
            assert client.translate(["Ein Kind lacht."], beam_size=1)[0].text
    time.sleep(1.0)
    grown = log_path.read_text()[before:]
    errors = ("Task was destroyed but it is pending", "Failed to detach context", "Traceback")
    assert not any(e in grown for e in errors), ({e: grown.count(e) for e in errors}, grown[-2000:])


def test_sigterm_under_load_exits_within_the_grace_period(tiny_onnx_dir, tmp_path):
    grace = 3.0
    proc, address = start_toward_absent_collector(tiny_onnx_dir, tmp_path / "serve.log", "--grace-period-s", str(grace))
    stop = threading.Event()
    answered = threading.Event()

    def load(i: int) -> None:
        with Client(address, timeout=30, metadata=traceparent(f"{i + 1:016x}")) as client:
            while not stop.is_set():
                try:
                    client.translate([f"{SENTENCES[0]} Nummer {i}."], beam_size=2)
                    answered.set()
                except grpc.RpcError:
                    return  # refused (UNAVAILABLE) or cut off as the server stops

    with futures.ThreadPoolExecutor(8) as pool:
        for i in range(8):
            pool.submit(load, i)
        assert answered.wait(60)
        time.sleep(1.0)  # spans buffered for the collector that is not there
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        rc = proc.wait(60)
        took = time.monotonic() - signalled
        stop.set()
    log = (tmp_path / "serve.log").read_text()
    assert rc == 0, log[-3000:]
    assert took < grace + 2.5, (took, log[-3000:])  # the grace period, plus the interpreter's exit
    assert "drained" in log
