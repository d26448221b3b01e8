"""The gRPC server, for real: grpc.aio on a loopback port, the tiny model exported to ONNX, the
generated client stubs. Every RPC, batching behaviour, streaming, cancellation, deadlines,
health, reflection and each INVALID_ARGUMENT case."""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from service.client import Client, alignment_matrix
from service.server import Server
from service.settings import Settings

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen.",
    "Ein Kind lacht.",
]


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


# ----------------------------------------------------------------------------- every RPC


def test_translate_many_texts_in_order(client):
    single = [client.translate([s], beam_size=1)[0].text for s in SENTENCES]
    together = [t.text for t in client.translate(SENTENCES, beam_size=1)]
    assert together == single  # rows batched independently, reassembled in order
    assert all(isinstance(t, str) and t for t in together)


def test_translate_scores_tokens_and_alignment(client):
    (t,) = client.translate([SENTENCES[0]], beam_size=2, return_scores=True, return_tokens=True, return_alignment=True)
    assert t.score < 0
    assert len(t.tokens) == len(t.token_ids) == t.output_tokens - 1
    a = alignment_matrix(t)
    assert a.shape == (len(t.tokens) + 1, t.input_tokens)
    assert list(t.alignment.target_tokens[:-1]) == list(t.tokens)
    np.testing.assert_allclose(a.sum(axis=1), 1.0, atol=1e-4)
    (plain,) = client.translate([SENTENCES[0]], beam_size=2)
    assert plain.text == t.text and plain.score == 0 and not plain.tokens and not plain.HasField("alignment")


def test_greedy_scores_come_when_asked_and_change_nothing_else(client):
    """Greedy batches skip the log-softmax while no sentence in them asks for its score: requests
    with and without scores, sent together so that they share batches, get the same texts."""
    with ThreadPoolExecutor(8) as pool:
        calls = [
            pool.submit(client.translate, [s], beam_size=1, return_scores=i % 2 == 1)
            for i, s in enumerate(SENTENCES * 4)
        ]
        got = [c.result()[0] for c in calls]
    for i, t in enumerate(got):
        assert t.text == got[i % len(SENTENCES)].text
        if i % 2:
            assert math.isfinite(t.score) and t.score < 0
            assert t.score == pytest.approx(got[(i + len(SENTENCES)) % len(got)].score, abs=1e-4)
        else:
            assert t.score == 0  # not set


def test_stream_arrives_in_order_and_ends_with_the_full_result(client):
    (expected,) = client.translate([SENTENCES[2]], beam_size=1, return_tokens=True)
    msgs = list(client.translate_stream(SENTENCES[2], beam_size=1, return_tokens=True))
    chunks, final = msgs[:-1], msgs[-1]
    assert all(m.HasField("chunk") for m in chunks) and final.HasField("final")
    assert len(chunks) >= 2
    assert "".join(m.chunk.text for m in chunks).strip() == final.final.text == expected.text
    assert [i for m in chunks for i in m.chunk.token_ids] == list(expected.token_ids)


def test_stream_with_beam_search(client):
    msgs = list(client.translate_stream(SENTENCES[0], beam_size=3))
    (expected,) = client.translate([SENTENCES[0]], beam_size=3)
    assert msgs[-1].final.text == expected.text
    assert "".join(m.chunk.text for m in msgs[:-1]).strip() == expected.text


def test_encode(client, server):
    d_model = server.server.engine.manifest.dims.d_model
    out = client.encode(SENTENCES[:2], return_token_embeddings=True)
    assert len(out) == 2
    for e in out:
        assert e["pooled"].shape == (d_model,)
        assert e["token_embeddings"].shape == (len(e["tokens"]), d_model)
        np.testing.assert_allclose(e["pooled"], e["token_embeddings"].mean(axis=0), atol=1e-5)
    alone = client.encode([SENTENCES[1]])[0]
    np.testing.assert_allclose(alone["pooled"], out[1]["pooled"], atol=1e-4)  # padding changes nothing
    assert "token_embeddings" not in alone


def test_model_info(client, server):
    info = client.model_info()
    m = server.server.engine.manifest
    assert info.name == m.name and info.source_language == "de" and info.target_language == "en"
    assert info.d_model == m.dims.d_model and info.execution_provider == "cpu" and info.precision == "fp32"
    assert info.limits.max_texts_per_request == 64 and info.limits.default_beam_size == 4
    assert any(name.endswith(".onnx") for name in info.files_sha256)
    # The default decoder step on the CPU is the fused one, and the files are the ones it runs.
    assert info.decoder_graph == "fused" and "decoder.fused.fp32.onnx" in info.files_sha256
    assert "decoder.fp32.onnx" not in info.files_sha256


def test_the_portable_decoder_step_serves_the_same_translations(make_server, client):
    """MTSERVE_GRAPH=portable: the torch export's decoder step, named in GetModelInfo, translating as
    the fused default does (fp32: the same tokens)."""
    texts = ["Ein Hund rennt durch den Schnee.", "Zwei Männer sitzen auf einer Bank."]
    srv = make_server(graph="portable")
    with srv.client() as portable:
        assert portable.model_info().decoder_graph == "portable"
        for beam in (1, 3):
            got = [t.text for t in portable.translate(texts, beam_size=beam)]
            assert got == [t.text for t in client.translate(texts, beam_size=beam)]


def test_model_info_says_what_zero_means_to_a_reflection_only_client(client, server):
    """Reflection carries no comments: Limits.zero_means, a field a client finds by reflection,
    says what each option left at 0 (or unset) means, with this server's numbers."""
    with grpc.insecure_channel(server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        limits = next(m for m in db.FindFileContainingSymbol("mtserve.v1.Limits").message_type if m.name == "Limits")
        assert "zero_means" in {f.name for f in limits.field}
    zero = dict(client.model_info().limits.zero_means)
    assert set(zero) == {
        "options.beam_size",
        "options.max_output_tokens",
        "options.min_output_tokens",
        "options.length_penalty",
        "options.num_hypotheses",
        "options.sampling_topk",
        "options.sampling_topp",
        "options.sampling_temperature",
        "options.seed",
        "target_prefixes",
        "timeout_ms",
        "options.split",
    }
    st, gen = server.server.settings, server.server.engine.manifest.generation
    assert f"default_beam_size ({st.default_beam_size})" in zero["options.beam_size"]
    assert f"max_beam_size ({st.max_beam_size})" in zero["options.beam_size"]
    assert f"max_output_tokens ({st.max_output_tokens})" in zero["options.max_output_tokens"]
    assert f"({gen.length_penalty:g})" in zero["options.length_penalty"]
    assert "stream's deadline" in zero["timeout_ms"]
    assert "no minimum" in zero["options.min_output_tokens"]


# ----------------------------------------------------------------------------- batching


def test_concurrent_clients_share_batches_and_short_ones_return_first(make_server):
    srv = make_server(decode_workers=1, max_queue_delay_ms=20)
    long_text = " ".join(SENTENCES)
    with srv.client(timeout=60) as c:
        done_at = {}

        def go(name, text, cap):
            r = c.translate([text], beam_size=1, max_output_tokens=cap, split="none")[0]  # the long text: one row
            done_at[name] = (time.perf_counter(), r.output_tokens)

        with ThreadPoolExecutor(8) as pool:
            futs = [pool.submit(go, "long", long_text, 0)]
            futs += [pool.submit(go, f"short{i}", SENTENCES[3], 2) for i in range(6)]
            for f in futs:
                f.result()
    rows = srv.server.metrics.batch_rows
    samples = {s.name: s.value for s in rows.collect()[0].samples}
    assert samples["mtserve_decode_batch_rows_count"] > 0
    # Some decode step held more than one row: not every observation fell in the <=1 bucket.
    le1 = next(s.value for s in rows.collect()[0].samples if s.name.endswith("_bucket") and s.labels["le"] == "1.0")
    assert le1 < samples["mtserve_decode_batch_rows_count"]
    assert done_at["long"][1] > 5
    assert all(done_at[f"short{i}"][0] < done_at["long"][0] for i in range(6))


def test_static_batching_setting_still_answers_everything(make_server):
    srv = make_server(continuous_batching=False)
    with srv.client() as c, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda s: c.translate([s], beam_size=1)[0].text, SENTENCES * 3))
    assert len(results) == 12 and all(results)


def test_cpu_workers_share_one_session_pair_unless_told_not_to(make_server):
    """Decode workers on the CPU run one session pair concurrently; with share_sessions off each
    has its own. Both translate the same under concurrent requests."""
    shared = make_server(decode_workers=3)
    own = make_server(decode_workers=2, share_sessions=False)
    models = shared.server.scheduler.models
    assert len(models) == 3 and all(m is models[0] for m in models)
    assert own.server.scheduler.models[0] is not own.server.scheduler.models[1]
    texts = [s for s in SENTENCES for _ in range(4)]
    answers = {}
    for name, srv in (("shared", shared), ("own", own)):
        steps = srv.server.metrics.decoder_step_latency
        with srv.client(timeout=60) as c, ThreadPoolExecutor(len(texts)) as pool:
            answers[name] = list(pool.map(lambda t: c.translate([t], beam_size=2)[0].text, texts))
        assert sum(s.value for s in steps.collect()[0].samples if s.name.endswith("_count")) > 0
    assert answers["shared"] == answers["own"] and all(answers["shared"])


def test_the_server_process_takes_its_gil_switch_interval_from_the_settings(monkeypatch, tiny_onnx_dir):
    """`Server.run()`, the process's entry point, sets Python's switch interval from
    gil_switch_interval_ms before it serves (a process-wide setting: `start()` alone, as the tests
    use it, leaves it alone)."""

    class Started(Exception):
        pass

    async def start(self, before_listen=None):
        raise Started

    monkeypatch.setattr(Server, "start", start)
    before = sys.getswitchinterval()
    try:
        sys.setswitchinterval(0.005)
        settings = Settings(model_dir=tiny_onnx_dir.parent, onnx_dir=tiny_onnx_dir, gil_switch_interval_ms=0.7)
        with pytest.raises(Started):
            asyncio.run(Server(settings).run())
        assert sys.getswitchinterval() == pytest.approx(0.0007)
        with pytest.raises(ValueError, match="gil_switch_interval_ms"):
            Settings(gil_switch_interval_ms=0)
    finally:
        sys.setswitchinterval(before)


# ----------------------------------------------------------------------------- cancellation and deadlines


def test_cancelled_stream_frees_its_rows(make_server):
    srv = make_server()
    srv.slow_down(0.02)
    with srv.client() as c:
        call = c.translate_stream(" ".join(SENTENCES), beam_size=1)
        next(call)  # the first chunk arrived: the sentence is in a batch
        call.cancel()
        assert srv.wait_idle(5)
        assert c.translate([SENTENCES[0]], beam_size=1)[0].text


def test_deadline_expired_while_queued_is_dropped(make_server):
    srv = make_server(max_batch_sentences=1)
    srv.slow_down(0.05)
    with srv.client(timeout=30) as c, ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(c.translate, [" ".join(SENTENCES)], beam_size=1, split="none")  # one long row
        time.sleep(0.2)
        with Client(srv.address, timeout=0.3) as hurried:
            code, _ = code_of(lambda: hurried.translate([SENTENCES[0]], beam_size=1))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        blocker.result()
        time.sleep(0.2)
    outcomes = {
        s.labels.get("outcome"): s.value
        for s in srv.server.metrics.sentences.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert outcomes.get("deadline_exceeded", 0) + outcomes.get("cancelled", 0) >= 1
    assert srv.server.scheduler.idle


def test_queue_full_is_resource_exhausted(make_server):
    srv = make_server(max_batch_sentences=1, max_queue_size=2)
    srv.slow_down(0.05)
    with srv.client(timeout=30) as c, ThreadPoolExecutor(4) as pool:
        blocker = pool.submit(c.translate, [" ".join(SENTENCES)], beam_size=1, split="none")  # one long row
        time.sleep(0.2)
        waiting = pool.submit(c.translate, SENTENCES[:2], beam_size=1)  # fills the queue
        time.sleep(0.2)
        code, details = code_of(lambda: c.translate(SENTENCES[:1], beam_size=1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queue_size" in details
        # More rows than the queue holds could never be queued: not "retry", but INVALID_ARGUMENT.
        code, details = code_of(lambda: c.translate(SENTENCES[:3], beam_size=1))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_queue_size (2)" in details, details
        blocker.result()
        waiting.result()


def test_unexpected_error_fails_only_that_step_and_server_keeps_serving(make_server):
    srv = make_server()
    calls = []

    def broken(rows):
        if not calls:
            calls.append(1)
            raise RuntimeError("injected fault")

    srv.intercept_steps(broken)
    with srv.client() as c:
        code, details = code_of(lambda: c.translate([SENTENCES[0]], beam_size=1))
        assert code == grpc.StatusCode.INTERNAL and "decoding failed" in details and "request id" in details
        assert c.translate([SENTENCES[0]], beam_size=1)[0].text


def test_a_failing_step_leaves_the_other_batches_and_requests_unaffected(make_server):
    """One decode worker runs two batches side by side, greedy (a stream, then a second request
    joining it) and beam 3. Only the beam batch's step fails: only its request gets INTERNAL; the
    greedy rows, decoded in the same worker at the same time, finish with exactly the fault-free
    output, and the scheduler goes on serving."""
    srv = make_server(decode_workers=1)
    long_text = " ".join(SENTENCES)
    with srv.client(timeout=60) as c:
        want_long = c.translate([long_text], beam_size=1)[0].text
        want_short = c.translate([SENTENCES[1]], beam_size=1)[0].text
        want_beam = c.translate([SENTENCES[0]], beam_size=3)[0].text
        failed, rows_seen = [], set()

        def faulty(rows):
            rows_seen.add(rows)
            time.sleep(0.01)  # keep the greedy stream running while the others arrive
            if rows == 3 and not failed:  # the beam-3 batch: 1 sentence x 3 beams
                failed.append(1)
                raise RuntimeError("injected fault in one decode step")

        srv.intercept_steps(faulty)
        stream = c.translate_stream(long_text, beam_size=1)
        first = next(stream)  # the greedy batch is decoding
        with ThreadPoolExecutor(2) as pool:
            beam = pool.submit(lambda: code_of(lambda: c.translate([SENTENCES[0]], beam_size=3)))
            joiner = pool.submit(lambda: c.translate([SENTENCES[1]], beam_size=1)[0].text)
            code, details = beam.result()
            assert code == grpc.StatusCode.INTERNAL and "decoding failed" in details
            assert joiner.result() == want_short
        rest = list(stream)
        assert failed and 3 in rows_seen
        assert "".join(m.chunk.text for m in [first, *rest[:-1]]).strip() == rest[-1].final.text == want_long
        assert c.translate([SENTENCES[0]], beam_size=3)[0].text == want_beam  # later requests succeed
    outcomes = {
        s.labels.get("outcome"): s.value
        for s in srv.server.metrics.sentences.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert outcomes.get("error") == 1
    assert srv.wait_idle(5)


# ----------------------------------------------------------------------------- health and reflection


def test_health_serving_then_not_serving_after_drain(make_server):
    srv = make_server()
    with grpc.insecure_channel(srv.address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for service in ("", "mtserve.v1.TranslationService"):
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        threading.Thread(target=srv.stop, daemon=True).start()
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()


def test_reflection_lists_the_services(server):
    with grpc.insecure_channel(server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"mtserve.v1.TranslationService", "grpc.health.v1.Health"} <= services
        desc = db.FindFileContainingSymbol("mtserve.v1.TranslationService")
        assert desc.package == "mtserve.v1"


# ----------------------------------------------------------------------------- INVALID_ARGUMENT


@pytest.mark.parametrize(
    "texts, opts, field",
    [
        ([], {}, "texts"),
        ([""], {}, "texts[0]"),
        (["Hallo", "   "], {}, "texts[1]"),
        (["Hallo", "\x00\x00"], {}, "texts[1]"),  # nothing left once controls are removed
        (["\u200b\ufeff"], {}, "texts[0]"),  # nor once format characters are
        (["Hallo"] * 65, {}, "texts"),
        (["Hund " * 300], {"split": "none"}, "texts[0]"),  # split: cut into rows, not refused
        (["Hallo"], {"beam_size": -1}, "options.beam_size"),
        (["Hallo"], {"beam_size": 9}, "options.beam_size"),
        (["Hallo"], {"max_output_tokens": -5}, "options.max_output_tokens"),
        (["Hallo"], {"max_output_tokens": 10**6}, "options.max_output_tokens"),
        (["Hallo"], {"length_penalty": float("nan")}, "options.length_penalty"),
        (["Hallo"], {"length_penalty": -1.0}, "options.length_penalty"),
    ],
)
def test_invalid_argument_names_the_field(client, texts, opts, field):
    code, details = code_of(lambda: client.translate(texts, **opts))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.startswith(field + ":"), details


def test_invalid_stream_and_encode_requests(client):
    code, details = code_of(lambda: list(client.translate_stream("")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("text:")
    code, details = code_of(lambda: client.encode([]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("texts:")


def test_server_still_serves_after_bad_requests(client):
    for _ in range(3):
        code_of(lambda: client.translate([""]))
    assert client.translate([SENTENCES[0]], beam_size=1)[0].text
    assert not math.isnan(client.translate([SENTENCES[0]], beam_size=2, return_scores=True)[0].score)
