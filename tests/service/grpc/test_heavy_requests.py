"""One client cannot stall the server, through a real server: the worst texts (100 kB of sentence
openers, 25,000 short sentences) are split off the event loop, so Health and small requests are
answered meanwhile; what could never be queued is INVALID_ARGUMENT naming the text, with the bound
and the count (never RESOURCE_EXHAUSTED, which says "retry"); a deadline is kept while a request
is being split, and nothing of it goes on after. Bounds are generous (a loaded 2-core machine):
before, Health waited 30 s and more behind one such request."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2

from service.api.mtserve.v1 import translation_pb2 as pb

OPENERS = ("x Der " * 16667)[:100000]  # 16,667 sentences of 100,000 bytes
SHORT = "Ja. " * 25000  # 25,000 sentences of 100,000 bytes


@pytest.fixture(scope="module")
def server(make_server):
    return make_server(decode_workers=1)


@pytest.fixture(scope="module")
def roomy_server(make_server):
    """A queue that takes every sentence of ten texts of openers: the request is split and
    tokenised in full unless its deadline stops it."""
    return make_server(decode_workers=1, max_queue_size=1_000_000, max_request_bytes=4_000_000)


def _call(client, texts: list[str], timeout: float = 60) -> tuple[grpc.StatusCode, str, float]:
    """(status, details, seconds) of a Translate of `texts`."""
    start = time.monotonic()
    try:
        client.stub.Translate(pb.TranslateRequest(texts=texts), timeout=timeout)
        return grpc.StatusCode.OK, "", time.monotonic() - start
    except grpc.RpcError as e:
        return e.code(), e.details(), time.monotonic() - start


def _while(server, work) -> tuple[list, list[float], list[float]]:
    """Run `work(client)` in threads (one per item of `work`) while Health and a one-sentence
    Translate are called in a loop: (their results, Health latencies, Translate latencies)."""
    results: list = [None] * len(work)

    def run(i, fn):
        with server.client(timeout=120) as c:
            results[i] = fn(c)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(work)]
    health, small = [], []
    with server.client(timeout=30) as probe:
        probe.translate(["Ein Hund rennt."], beam_size=1)
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) or len(health) < 5:
            start = time.monotonic()
            probe.health_stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=30)
            health.append(time.monotonic() - start)
            start = time.monotonic()
            probe.translate(["Ein Hund rennt."], beam_size=1)
            small.append(time.monotonic() - start)
            time.sleep(0.01)
    for t in threads:
        t.join()
    return results, health, small


def test_the_worst_texts_never_stall_health_or_small_requests(server):
    """Three clients at once: ten texts of openers (1 MB), forty texts of short sentences (4 MB:
    past max_request_bytes), and one text of short sentences (past max_queue_size)."""
    work = [
        lambda c: _call(c, [OPENERS] * 10),
        lambda c: _call(c, [SHORT] * 40),
        lambda c: _call(c, [SHORT]),
    ]
    results, health, small = _while(server, work)
    (code1, msg1, _), (code2, msg2, _), (code3, msg3, _) = results
    assert code1 == grpc.StatusCode.INVALID_ARGUMENT and msg1.startswith("texts[0]: 16667 sentences exceed"), msg1
    assert code2 == grpc.StatusCode.INVALID_ARGUMENT, msg2
    assert msg2 == "texts[10]: texts up to here hold 1100000 bytes, over max_request_bytes (1048576)"
    assert code3 == grpc.StatusCode.INVALID_ARGUMENT, msg3
    assert msg3 == "texts[0]: 25000 sentences exceed max_queue_size (2048), the most one request can queue"
    assert max(health) < 1.0, f"Health took {max(health):.2f} s"
    assert max(small) < 2.0, f"a one-sentence Translate took {max(small):.2f} s"


def test_a_text_that_could_never_be_queued_is_invalid_not_exhausted(server, client):
    code, msg, _ = _call(client, ["Ja. " * 2049])
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert msg == "texts[0]: 2049 sentences exceed max_queue_size (2048), the most one request can queue"
    code, msg, _ = _call(client, ["Ja. " * 1500, "Nein. " * 1500])
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, msg)
    assert msg.startswith("texts[1]: texts up to here make 3000 sentences, over max_queue_size (2048)"), msg


def test_a_deadline_is_kept_while_texts_are_split_and_the_work_stops(roomy_server):
    """Ten texts of openers (166,670 sentences) with a 2 s deadline: DEADLINE_EXCEEDED within
    about 2 s (it took 45 s), and the server's CPU idle soon after."""
    work = [lambda c: _call(c, [OPENERS] * 10, timeout=2.0)]
    results, health, _ = _while(roomy_server, work)
    ((code, msg, took),) = results
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED, (code, msg)
    assert took < 3.5, f"answered after {took:.2f} s"
    assert max(health) < 1.0, f"Health took {max(health):.2f} s"
    time.sleep(1.0)
    assert roomy_server.wait_idle(5.0)
    cpu, wall = time.process_time(), time.monotonic()
    time.sleep(1.0)
    busy = (time.process_time() - cpu) / (time.monotonic() - wall)
    assert busy < 0.3, f"the server process used {busy:.0%} of a core a second after the answer"


def test_a_huge_page_token_and_encode_languages_are_refused_by_field(server, client):
    """A page_token of 5,000 digits is INVALID_ARGUMENT (it was INTERNAL: Python's int() digit
    limit); Encode's NOT_FOUND names source_language, the one language field it has."""
    with pytest.raises(grpc.RpcError) as e:
        client.stub.GetModelInfo(pb.GetModelInfoRequest(page_token="9" * 5000), timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("page_token: 5000 digits"), e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Encode(pb.EncodeRequest(texts=["Ein Hund."], source_language="fr"), timeout=30)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details().startswith("source_language: "), e.value.details()
    assert "target_language" not in e.value.details()
