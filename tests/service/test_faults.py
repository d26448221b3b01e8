"""Overload and faults inside a running server: far more clients than the queue holds, and
cancellations and deadlines that leave nothing behind. (Faults at start-up and signals are in
test_serve_process.py, a fault inside one decode step in test_server.py, the soak in
test_soak.py.)"""

from __future__ import annotations

import statistics
import threading
import time

import grpc

from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

SENTENCE = "Zwei Männer sitzen auf einer Bank und reden über das Wetter."


def test_overload_refuses_the_excess_quickly_and_answers_every_accepted_request(make_server):
    queue, rows, clients = 8, 4, 200
    srv = make_server(max_queue_size=queue, max_batch_sentences=rows, max_queue_delay_ms=0.0)
    srv.slow_down(0.01)  # each accepted sentence takes >= 0.1 s to decode: the queue fills up
    outcomes: list[tuple[str, float, int]] = []  # (code, latency, translations)
    lock, all_done = threading.Lock(), threading.Event()
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.TranslationServiceStub(ch)
        grpc.channel_ready_future(ch).result(timeout=10)
        req = pb.TranslateRequest(texts=[SENTENCE], options=pb.TranslationOptions(beam_size=1, max_output_tokens=10))

        def done(fut, start):
            try:
                item = ("OK", time.perf_counter() - start, len(fut.result().translations))
            except grpc.RpcError as e:
                item = (e.code().name, time.perf_counter() - start, 0)
            with lock:
                outcomes.append(item)
                if len(outcomes) == clients:
                    all_done.set()

        for _ in range(clients):  # all at once, each with its own deadline
            start = time.perf_counter()
            stub.Translate.future(req, timeout=120).add_done_callback(lambda f, s=start: done(f, s))
        assert all_done.wait(180), f"only {len(outcomes)} of {clients} answered"

    codes = [c for c, _, _ in outcomes]
    ok = [lat for c, lat, _ in outcomes if c == "OK"]
    refused = [lat for c, lat, _ in outcomes if c == "RESOURCE_EXHAUSTED"]
    assert set(codes) <= {"OK", "RESOURCE_EXHAUSTED"}, set(codes)
    assert len(ok) + len(refused) == clients  # sent == answered: nothing lost, nothing hung
    assert all(n == 1 for c, _, n in outcomes if c == "OK")
    assert len(refused) >= clients // 2, (len(ok), len(refused))  # the queue holds 8, the batch 4
    assert len(ok) >= queue
    # Refusals are immediate; accepted requests wait for decoding but stay bounded (generous bounds).
    assert statistics.median(refused) < statistics.median(ok)
    assert max(refused) < 10.0 and max(ok) < 60.0
    assert srv.wait_idle(10) and srv.server.scheduler.queue_depth == 0
    with srv.client(timeout=30) as c:
        assert c.translate([SENTENCE], beam_size=1)[0].text


def test_cancellations_and_deadlines_under_load_leave_the_queue_empty(make_server):
    srv = make_server(decode_workers=1, max_batch_sentences=8)
    srv.slow_down(0.005)
    results: dict[str, int] = {}
    with grpc.insecure_channel(srv.address) as ch:
        stub = pb_grpc.TranslationServiceStub(ch)
        req = pb.TranslateRequest(texts=[SENTENCE, "Ein Hund."], options=pb.TranslationOptions(beam_size=2))
        futures = []
        for i in range(60):
            kind = ("cancel", "deadline", "normal")[i % 3]
            f = stub.Translate.future(req, timeout=0.05 if kind == "deadline" else 60)
            futures.append((kind, f))
        for _kind, f in futures[::3]:
            f.cancel()
        for kind, f in futures:
            try:
                f.result()
                code = "OK"
            except grpc.FutureCancelledError:
                code = "CANCELLED"
            except grpc.RpcError as e:
                code = e.code().name
            results[f"{kind}:{code}"] = results.get(f"{kind}:{code}", 0) + 1
    allowed = {"cancel:CANCELLED", "cancel:OK", "deadline:DEADLINE_EXCEEDED", "deadline:OK", "normal:OK"}
    assert set(results) <= allowed, results
    assert results.get("normal:OK") == 20 and results.get("deadline:DEADLINE_EXCEEDED", 0) >= 1
    assert srv.wait_idle(15) and srv.server.scheduler.queue_depth == 0
