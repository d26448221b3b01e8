"""The scheduler in a child process (engine_process, the default of `mtserve serve`): the same
answers as in-process, streaming, encode, TranslateMany, the child's metrics on the server's
registry, cancellation, queue limits, draining, and a child that dies mid-request."""

from __future__ import annotations

import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest

from service.api.mtserve.v1 import translation_pb2 as pb

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen.",
    "Ein Kind lacht.",
]


@pytest.fixture(scope="module")
def pair(make_server):
    """The same model served in-process and with an engine process."""
    return make_server(decode_workers=2), make_server(decode_workers=2, engine_process=True)


def test_same_answers_as_in_process(pair):
    threads, process = pair
    assert type(process.server.scheduler).__name__ == "EnginePool"
    assert len(process.server.scheduler.children) == 2  # a child process per decode worker
    with threads.client() as a, process.client() as b:
        for beam in (1, 3):
            want = a.translate(SENTENCES, beam_size=beam, return_scores=True, return_alignment=True)
            got = b.translate(SENTENCES, beam_size=beam, return_scores=True, return_alignment=True)
            assert [t.text for t in got] == [t.text for t in want]
            assert [t.score for t in got] == pytest.approx([t.score for t in want], abs=1e-5)
            assert list(got[0].alignment.weights) == pytest.approx(list(want[0].alignment.weights), abs=1e-5)
        stream = list(b.translate_stream(SENTENCES[2], beam_size=1))
        assert len(stream) >= 3 and stream[-1].final.text == a.translate([SENTENCES[2]], beam_size=1)[0].text
        assert "".join(m.chunk.text for m in stream[:-1]).strip() == stream[-1].final.text
        np.testing.assert_allclose(
            b.encode(SENTENCES[:2])[1]["pooled"], a.encode(SENTENCES[:2])[1]["pooled"], atol=1e-5
        )
        assert [t.text for t in b.translate_all(SENTENCES * 3, beam_size=1)] == [
            t.text for t in a.translate(SENTENCES * 3, beam_size=1)
        ]
    assert process.wait_idle()


def test_the_child_metrics_are_scraped_with_the_servers(pair):
    _, process = pair
    with process.client() as c:
        c.translate(SENTENCES[:2], beam_size=1)
    text = generate_latest(process.server.metrics.registry).decode()
    for name in (
        "mtserve_requests_total",
        "mtserve_decode_batch_rows_count",
        "mtserve_sentences_total",
        "mtserve_queue_capacity",
        "mtserve_encoder_duration_seconds_count",
    ):
        assert name in text
    types = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types))  # each family once: the parent's copies are not served
    rows = [line for line in text.splitlines() if line.startswith("mtserve_sentences_total")]
    assert any('outcome="ok"' in line and float(line.split()[-1]) >= 2 for line in rows)


def test_a_cancelled_stream_frees_its_rows_in_the_child(pair):
    _, process = pair
    with process.client() as c:
        call = c.translate_stream(" ".join(SENTENCES), beam_size=1)
        next(call)
        call.cancel()
        assert process.wait_idle()
        assert c.translate([SENTENCES[0]], beam_size=1)[0].text


def test_queue_full_is_resource_exhausted_with_its_message(make_server):
    srv = make_server(engine_process=True, max_queue_size=2)  # one child: all of max_queue_size
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as e:
            c.translate(SENTENCES[:3], beam_size=1)
        assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queue_size" in e.value.details()
        assert c.translate(SENTENCES[:2], beam_size=1)[0].text


def test_a_child_that_dies_fails_only_its_requests_and_is_replaced(make_server):
    srv = make_server(engine_process=True, decode_workers=2)
    engine = srv.server.scheduler.children[0]
    first = engine._proc.pid
    with srv.client(timeout=60) as c, ThreadPoolExecutor(8) as pool:
        assert c.translate([SENTENCES[0]], beam_size=1)[0].text
        futures = [pool.submit(c.translate, [" ".join(SENTENCES)], beam_size=4) for _ in range(8)]
        time.sleep(0.05)
        os.kill(first, signal.SIGKILL)
        codes = []
        for f in futures:
            try:
                f.result()
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
                assert e.code() == grpc.StatusCode.INTERNAL and "engine process" in e.details()
        end = time.time() + 60
        while (engine._proc is None or engine._proc.pid == first or engine._conn is None) and time.time() < end:
            time.sleep(0.1)
        assert engine._proc.pid != first
        assert c.translate([SENTENCES[1]], beam_size=1)[0].text  # the new child serves
    assert all(code in (grpc.StatusCode.OK, grpc.StatusCode.INTERNAL) for code in codes)


def test_drain_finishes_accepted_work_and_refuses_new(make_server):
    srv = make_server(engine_process=True)
    with srv.client(timeout=60) as c, ThreadPoolExecutor(4) as pool:
        running = [pool.submit(c.translate, [s], beam_size=4) for s in SENTENCES]
        time.sleep(0.02)
        srv.server.scheduler.stop_accepting()
        with pytest.raises(grpc.RpcError) as e:
            c.translate([SENTENCES[0]], beam_size=1)
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert all(f.result().__len__() == 1 for f in running)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    stopper.join(30)
    assert not any(c._proc.is_alive() for c in srv.server.scheduler.children)


def test_translate_many_items_through_the_child(pair):
    _, process = pair
    with process.client() as c:
        reqs = [
            pb.TranslateManyRequest(
                id=str(i),
                request=pb.TranslateRequest(
                    texts=[SENTENCES[i % 4]] if i != 3 else [""], options=pb.TranslationOptions(beam_size=1)
                ),
            )
            for i in range(6)
        ]
        answers = {r.id: r for r in c.translate_many(reqs)}
    assert answers["3"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert all(answers[str(i)].response.translations[0].text for i in (0, 1, 2, 4, 5))
