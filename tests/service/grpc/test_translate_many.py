"""TranslateMany: many translations over one bidirectional stream, against a real server on
loopback. Ids, completion order, per-item errors, item deadlines, bounded read-ahead,
cancellation, draining, malformed messages, metrics."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc
import pytest

from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import Client, ItemFailed

SENTENCES = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Männer sitzen auf einer Bank.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen.",
    "Ein Kind lacht.",
]
GREEDY = pb.TranslationOptions(beam_size=1)


def item(id_: str, *texts: str, options=GREEDY, timeout_ms: int = 0) -> pb.TranslateManyRequest:
    return pb.TranslateManyRequest(
        id=id_, request=pb.TranslateRequest(texts=list(texts), options=options), timeout_ms=timeout_ms
    )


def test_translate_all_gives_what_translate_gives_in_input_order(client):
    texts = SENTENCES * 5
    want = [client.translate([t], beam_size=1)[0].text for t in SENTENCES] * 5
    assert [t.text for t in client.translate_all(texts, beam_size=1)] == want
    beam = client.translate_all(SENTENCES, beam_size=3, return_scores=True, return_tokens=True)
    for text, t in zip(SENTENCES, beam):
        (one,) = client.translate([text], beam_size=3, return_scores=True, return_tokens=True)
        assert (t.text, list(t.token_ids)) == (one.text, list(one.token_ids))
        assert t.score == pytest.approx(one.score, abs=1e-5)


def test_every_id_answered_once_and_short_items_overtake_a_long_one(make_server):
    srv = make_server(decode_workers=1)
    srv.slow_down(0.01)
    reqs = [item("long", " ".join(SENTENCES))] + [item(f"short{i}", SENTENCES[3]) for i in range(6)]
    with srv.client() as c:
        answers = list(c.translate_many(reqs))
    assert all(r.HasField("response") for r in answers)
    order = [r.id for r in answers]
    assert sorted(order) == sorted(r.id for r in reqs)
    assert order.index("long") > order.index("short0")  # completion order, not request order


def test_a_bad_item_fails_alone_with_the_field_named(client):
    reqs = [
        item("ok1", SENTENCES[0]),
        item("empty", ""),
        item("beam", SENTENCES[1], options=pb.TranslationOptions(beam_size=99)),
        item("none"),
        item("two", SENTENCES[1], "  "),
        item("ok2", SENTENCES[2]),
    ]
    answers = {r.id: r for r in client.translate_many(reqs)}  # the stream itself ends OK
    assert set(answers) == {r.id for r in reqs}
    for id_, field in [("empty", "texts[0]"), ("beam", "options.beam_size"), ("none", "texts"), ("two", "texts[1]")]:
        err = answers[id_].error
        assert answers[id_].HasField("error") and err.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert err.message.startswith(field + ":"), err.message
    for id_, text in [("ok1", SENTENCES[0]), ("ok2", SENTENCES[2])]:
        assert answers[id_].response.translations[0].text == client.translate([text], beam_size=1)[0].text
    with pytest.raises(ItemFailed) as e:
        client.translate_all([SENTENCES[0], "", SENTENCES[1]], beam_size=1)
    assert e.value.index == 1 and e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_an_item_past_its_deadline_is_deadline_exceeded_and_frees_its_rows(make_server):
    srv = make_server()
    srv.slow_down(0.03)
    with srv.client() as c:
        answers = {
            r.id: r
            for r in c.translate_many([item("slow", " ".join(SENTENCES), timeout_ms=150), item("free", SENTENCES[3])])
        }
        assert answers["slow"].error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        assert answers["free"].response.translations[0].text
        assert srv.wait_idle()


def test_the_server_reads_at_most_max_stream_in_flight_items_ahead(make_server):
    srv = make_server(decode_workers=2, max_stream_in_flight=2)
    engine = srv.server.engine
    running, peak, original = [0], [0], engine.translate

    async def counting(*a, **kw):
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.02)
            return await original(*a, **kw)
        finally:
            running[0] -= 1

    engine.translate = counting
    with srv.client() as c:
        answers = list(c.translate_many(item(str(i), SENTENCES[i % 4]) for i in range(12)))
    assert sorted(int(r.id) for r in answers) == list(range(12)) and all(r.HasField("response") for r in answers)
    assert peak[0] == 2


def test_cancelling_the_stream_cancels_its_items(make_server):
    srv = make_server()
    srv.slow_down(0.02)
    with srv.client() as c:
        call = c.translate_many([item("a", SENTENCES[3])] + [item(f"long{i}", " ".join(SENTENCES)) for i in range(4)])
        first = next(call)
        assert first.id == "a"
        call.cancel()
        assert srv.wait_idle()
        assert c.translate([SENTENCES[0]], beam_size=1)[0].text


def test_a_malformed_message_ends_the_stream_with_invalid_argument(server):
    with grpc.insecure_channel(server.address) as ch:
        raw = ch.stream_stream("/mtserve.v1.TranslationService/TranslateMany")
        good = item("1", SENTENCES[0]).SerializeToString()
        with pytest.raises(grpc.RpcError) as e:
            list(raw(iter([good, b"\xff\xff\xff"]), timeout=30))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("request:")


def test_items_after_drain_began_are_unavailable_and_earlier_ones_finish(make_server):
    srv = make_server()
    srv.slow_down(0.02)
    gate = threading.Event()

    def requests():
        yield item("before", " ".join(SENTENCES))
        gate.wait(10)
        yield item("after", SENTENCES[0])

    with srv.client() as c:
        call = c.translate_many(requests())
        time.sleep(0.3)  # "before" is decoding
        srv.server.scheduler.stop_accepting()  # what drain() does first
        gate.set()
        answers = {r.id: r for r in call}
    assert answers["after"].error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert answers["before"].response.translations[0].text


def test_items_are_counted_in_the_request_metrics(make_server):
    srv = make_server()
    with srv.client() as c:
        list(c.translate_many([item("1", SENTENCES[0]), item("2", SENTENCES[1]), item("3", "")]))
    samples = {
        (s.labels["method"], s.labels["code"]): s.value
        for s in srv.server.metrics.requests.collect()[0].samples
        if s.name.endswith("_total")
    }
    assert samples[("TranslateMany.item", "OK")] == 2
    assert samples[("TranslateMany.item", "INVALID_ARGUMENT")] == 1
    assert samples[("TranslateMany", "OK")] == 1


def test_a_client_with_a_token_is_needed_when_auth_is_on(make_server):
    srv = make_server(auth_token="t" * 20)
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as e:
            list(c.translate_many([item("1", SENTENCES[0])]))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with Client(srv.address, token="t" * 20, timeout=30) as c:
        assert c.translate_all([SENTENCES[0]], beam_size=1)[0].text


def test_an_id_still_unanswered_cannot_be_used_again(make_server):
    srv = make_server()
    srv.slow_down(0.01)
    reqs = [item("a", " ".join(SENTENCES)), item("a", SENTENCES[0]), item("b", SENTENCES[1])]
    with srv.client() as c:
        answers = list(c.translate_many(reqs))
        assert [r.id for r in answers].count("a") == 2 and len(answers) == 3
        refused = [r for r in answers if r.id == "a" and r.HasField("error")]
        assert len(refused) == 1 and refused[0].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert refused[0].error.message.startswith("id:")
        (long_answer,) = [r for r in answers if r.id == "a" and r.HasField("response")]
        assert long_answer.response.translations[0].text == c.translate([" ".join(SENTENCES)], beam_size=1)[0].text
    # once answered, an id is free again on the same stream
    answered = threading.Event()

    def one_then_again():
        yield item("x", SENTENCES[3])
        answered.wait(10)
        yield item("x", SENTENCES[0])

    with srv.client() as c:
        out = []
        for r in c.translate_many(one_then_again()):
            out.append(r)
            answered.set()
    assert [r.id for r in out] == ["x", "x"] and all(r.HasField("response") for r in out)
