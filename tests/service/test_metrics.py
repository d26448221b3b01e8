"""Prometheus metrics, scraped over HTTP from a real server after real traffic: every metric of
docs/metrics.md is populated, RPCs carry the status code the client saw (cancelled and
deadline-exceeded included), and the token counters agree with the responses."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.client import pb
from tests.support import free_port

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen.",
    "Ein Kind lacht.",
]
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def scrape(srv) -> dict[str, list]:
    """{sample name: [(labels, value), ...]} from the server's /metrics endpoint."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{srv.server.metrics_port}/metrics", timeout=10).read().decode()
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def value(samples, name, **labels) -> float:
    return sum(v for lab, v in samples.get(name, []) if all(lab.get(k) == x for k, x in labels.items()))


@pytest.fixture(scope="module")
def server(make_server):
    return make_server(metrics_port=free_port(), metrics_address="127.0.0.1", decode_workers=1)


def test_every_metric_is_populated_by_traffic(server):
    before = scrape(server)
    with server.client(timeout=30) as c:
        results = c.translate(SENTENCES, beam_size=2)
        results += c.translate(SENTENCES[:2], beam_size=1)
        stream = list(c.translate_stream(SENTENCES[2], beam_size=1))
        c.encode(SENTENCES[:2])
        c.model_info()
        with pytest.raises(grpc.RpcError) as e:
            c.translate([" "])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    def delta(name, **labels):
        return value(m, name, **labels) - value(before, name, **labels)

    # An aborted RPC's status reaches the client before the interceptor's `finally` records it:
    # give the server a moment (bounded) to count the last call.
    deadline = time.monotonic() + 5
    m = scrape(server)
    while (
        delta("mtserve_requests_total", method="Translate", code="INVALID_ARGUMENT") < 1 and time.monotonic() < deadline
    ):
        time.sleep(0.01)
        m = scrape(server)

    assert delta("mtserve_requests_total", method="Translate", code="OK") == 2
    assert delta("mtserve_requests_total", method="Translate", code="INVALID_ARGUMENT") == 1
    assert delta("mtserve_requests_total", method="TranslateStream", code="OK") == 1
    assert delta("mtserve_requests_total", method="Encode", code="OK") == 1
    assert delta("mtserve_requests_total", method="GetModelInfo", code="OK") == 1
    assert delta("mtserve_request_duration_seconds_count", method="Translate", code="OK") == 2
    assert delta("mtserve_request_duration_seconds_sum", method="Translate", code="OK") > 0
    # Histograms: one observation per sentence / step / encoder pass.
    assert delta("mtserve_queue_wait_seconds_count") == len(SENTENCES) + 2 + 1
    assert delta("mtserve_time_to_first_chunk_seconds_count") == 1
    steps = delta("mtserve_decoder_step_duration_seconds_count")
    assert steps >= max(r.output_tokens for r in results)
    assert delta("mtserve_decode_batch_rows_count") == steps == delta("mtserve_padding_ratio_count")
    assert delta("mtserve_decode_batch_rows_sum") >= 2 * len(SENTENCES)  # beam 2 rows
    assert delta("mtserve_decoded_rows_total") == delta("mtserve_decode_batch_rows_sum")
    assert delta("mtserve_encoder_duration_seconds_count") >= 4  # 3 translate admissions + 1 encode, at least
    # Token counters agree exactly with what the responses report.
    final = stream[-1].final
    assert delta("mtserve_input_tokens_total") == sum(r.input_tokens for r in results) + final.input_tokens
    assert delta("mtserve_generated_tokens_total") == sum(r.output_tokens for r in results) + final.output_tokens
    assert delta("mtserve_sentences_total", outcome="ok") == len(results) + 1
    # Per model, whichever API: 2 Translate and 1 TranslateStream succeeded, the " " one failed;
    # 1 Encode. Each phase once per successful request; they add up to its duration.
    model = server.server.engine.translation_model
    encoder = server.server.engine.encoder_model
    assert delta("mtserve_inference_request_duration_seconds_count", model=model, outcome="success") == 3
    assert delta("mtserve_inference_request_duration_seconds_count", model=model, outcome="failure") == 1
    assert delta("mtserve_inference_request_duration_seconds_count", model=encoder, outcome="success") == 1
    assert delta("mtserve_inferences_total", model=model) == len(results) + 1
    assert delta("mtserve_inferences_total", model=encoder) == 2
    phases = ("queue", "compute_input", "compute_infer", "compute_output")
    for phase in phases:
        assert delta("mtserve_inference_phase_duration_seconds_count", model=model, phase=phase) == 3
    total = sum(delta("mtserve_inference_phase_duration_seconds_sum", model=model, phase=p) for p in phases)
    success = delta("mtserve_inference_request_duration_seconds_sum", model=model, outcome="success")
    assert total == pytest.approx(success, abs=1e-6)
    assert value(m, "mtserve_last_inference_timestamp_seconds", model=model) > time.time() - 60
    # Gauges back at rest; capacity and model info as configured.
    assert value(m, "mtserve_requests_in_flight", method="Translate") == 0
    assert value(m, "mtserve_queue_depth") == 0
    assert value(m, "mtserve_queue_capacity") == server.server.settings.max_queue_size
    (info,) = m["mtserve_model_info"]
    labels = info[0]
    assert labels["provider"] == server.server.engine.provider == "cpu" and labels["precision"] == "fp32"
    assert (labels["model"], labels["version"]) == (server.server.engine.name, server.server.engine.version)
    # Every metric with a model in play carries the model's name and version.
    scoped = [
        "mtserve_queue_wait_seconds_count",
        "mtserve_queue_depth",
        "mtserve_queue_capacity",
        "mtserve_time_to_first_chunk_seconds_count",
        "mtserve_decode_batch_rows_count",
        "mtserve_encoder_duration_seconds_count",
        "mtserve_decoder_step_duration_seconds_count",
        "mtserve_input_tokens_total",
        "mtserve_generated_tokens_total",
        "mtserve_decoded_rows_total",
        "mtserve_padding_ratio_count",
        "mtserve_sentences_total",
        "mtserve_inference_request_duration_seconds_count",
        "mtserve_inferences_total",
    ]
    for name in scoped:
        assert m[name], name
        for lab, _ in m[name]:
            assert lab["model"] in (model, encoder) and lab["version"] == server.server.engine.version, (name, lab)


def test_no_created_series(server):
    """prometheus-client's `*_created` series are off: they roughly doubled a scrape, and no
    dashboard or alert reads them."""
    with server.client(timeout=30) as c:
        c.translate(SENTENCES[:1], beam_size=1)
    names = scrape(server)
    assert "mtserve_requests_total" in names and "mtserve_inference_request_duration_seconds_count" in names
    assert not [n for n in names if n.endswith("_created")]


def test_in_flight_and_queue_depth_while_busy(make_server):
    # An idle worker waits max_queue_delay_ms for company: requests sit queued meanwhile.
    srv = make_server(metrics_port=free_port(), metrics_address="127.0.0.1", max_queue_delay_ms=1500)
    with srv.client(timeout=30) as c:
        fut = c.stub.Translate.future(pb.TranslateRequest(texts=SENTENCES[:3]), timeout=30)
        time.sleep(0.5)
        busy = scrape(srv)
        assert len(fut.result().translations) == 3
    assert value(busy, "mtserve_requests_in_flight", method="Translate") == 1
    assert value(busy, "mtserve_queue_depth") == 3
    rest = scrape(srv)
    assert value(rest, "mtserve_requests_in_flight", method="Translate") == 0
    assert value(rest, "mtserve_queue_depth") == 0
    assert value(rest, "mtserve_queue_wait_seconds_sum") >= 3 * 0.5


def test_cancelled_and_deadline_exceeded_rpcs_are_labelled(make_server):
    # Each request arrives at an idle worker, which then waits 2 s for company: long enough to
    # cancel it, or for its deadline to pass, while it is queued.
    delay = 2.0
    srv = make_server(metrics_port=free_port(), metrics_address="127.0.0.1", max_queue_delay_ms=delay * 1000)
    with srv.client(timeout=30) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.stub.Translate(pb.TranslateRequest(texts=[SENTENCES[1]]), timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(delay)
        fut = c.stub.Translate.future(pb.TranslateRequest(texts=[SENTENCES[0]]), timeout=30)
        time.sleep(0.3)
        fut.cancel()
        time.sleep(delay)
        stream = c.stub.TranslateStream(pb.TranslateStreamRequest(text=SENTENCES[2]), timeout=30)
        time.sleep(0.3)
        stream.cancel()
    end = time.time() + 10
    while time.time() < end:  # the server notices cancellations asynchronously
        m = scrape(srv)
        if value(m, "mtserve_requests_total", code="CANCELLED") >= 2:
            break
        time.sleep(0.1)
    assert value(m, "mtserve_requests_total", method="Translate", code="DEADLINE_EXCEEDED") == 1
    assert value(m, "mtserve_requests_total", method="Translate", code="CANCELLED") == 1
    assert value(m, "mtserve_requests_total", method="TranslateStream", code="CANCELLED") == 1
    assert value(m, "mtserve_requests_total", code="OK") == 0
    assert value(m, "mtserve_requests_in_flight") == 0


def test_every_metric_is_documented():
    from service.metrics import Metrics

    doc = DOC.read_text()
    documented = set(re.findall(r"`(mtserve_[a-z_]+)`", doc))
    names = set()
    for fam in Metrics().registry.collect():
        names.add(fam.name + ("_total" if fam.type == "counter" else "_info" if fam.type == "info" else ""))
    assert names <= documented, names - documented
