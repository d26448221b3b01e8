"""The scheduler in a child process (`engine_process`): the same
answers as in-process, streaming, encode, TranslateMany, the child's metrics on the server's
registry, cancellation, queue limits, draining, and a child that dies mid-request. Without a
model: every message pickles, and each side of the pipe ignores a message it has no case for while
one it cannot unpickle replaces the child."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing as mp
import os
import pickle
import signal
import threading
import time
import typing
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from prometheus_client import generate_latest

from service.api.mtserve.v1 import translation_pb2 as pb
from service.batching.jobs import EncodeJob, Sentence
from service.decoding.results import Finished
from service.errors import Internal, ResourceExhausted
from service.metrics import Metrics
from service.parallel.child import Child
from service.parallel.engine_process import EngineProcess
from service.parallel.messages import (
    Cancel,
    Done,
    Encode,
    Encoded,
    EncodeSpec,
    Failed,
    MetricsReply,
    MetricsRequest,
    Ready,
    SentenceSpec,
    Shutdown,
    StartupError,
    StopAccepting,
    SubmitSentences,
    ToChild,
    Tokens,
    ToParent,
)
from service.settings import Settings

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


def test_more_sentences_than_one_engine_process_queues_is_invalid(make_server):
    """Each request goes to one child, which has 1/N of max_queue_size: a request of more rows
    could never be queued (INVALID_ARGUMENT naming the bound, not RESOURCE_EXHAUSTED, which says
    "retry"). A child's own queue-full error travels back with its message
    (test_every_message_round_trips_through_pickle)."""
    srv = make_server(engine_process=True, decode_workers=2, max_queue_size=4)  # 2 rows a child
    with srv.client() as c:
        with pytest.raises(grpc.RpcError) as e:
            c.translate(SENTENCES[:3], beam_size=1)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert e.value.details() == (
            "texts[2]: texts up to here make 3 sentences, over the 2 one request can queue (max_queue_size 4 "
            "over 2 engine processes, a request in one)"
        )
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


# ----------------------------------------------------------------------------- without a model


def test_a_sentence_crosses_as_a_spec_and_comes_back_with_its_fields():
    def on_tokens(ids: list[int]) -> None:
        pass

    sent = Sentence(
        src_ids=[4, 5, 2],
        beam=3,
        length_penalty=0.7,
        max_len=11,
        want_alignment=True,
        want_scores=False,
        deadline=42.0,
        on_tokens=on_tokens,
        key=17,
        target_prefix=[9],
        min_len=4,
        request=23,
        arriving_rows=3,
        answered_rows=0,
        keep_state=True,
    )
    spec = SentenceSpec.of(sent)
    assert (spec.target_prefix, spec.min_len) == ((9,), 4)
    assert (spec.key, spec.src_ids, spec.beam, spec.length_penalty, spec.max_len) == (17, [4, 5, 2], 3, 0.7, 11)
    assert (spec.want_alignment, spec.want_scores, spec.deadline, spec.stream) == (True, False, 42.0, True)
    assert spec.src_ids is not sent.src_ids  # the parent's list stays its own
    assert not SentenceSpec.of(dataclasses.replace(sent, on_tokens=None)).stream
    copy = spec.sentence(on_tokens)
    fields = ("key", "src_ids", "beam", "length_penalty", "max_len", "want_alignment", "want_scores", "deadline")
    fields += ("target_prefix", "min_len", "request")  # the request tag: one-request batching in the child
    fields += ("arriving_rows", "answered_rows")  # a request in passes counts once in the child too
    assert all(getattr(copy, f) == getattr(sent, f) for f in fields)
    assert not copy.keep_state  # a decoder state stays in the process that made it
    assert copy.on_tokens is on_tokens and copy.future is not sent.future
    assert spec.sentence().on_tokens is None


def test_every_message_round_trips_through_pickle():
    spec = SentenceSpec(
        key=3,
        src_ids=[4, 5, 2],
        beam=2,
        length_penalty=1.0,
        max_len=9,
        want_alignment=True,
        want_scores=True,
        deadline=12.5,
        stream=True,
    )
    finished = Finished(key=3, tokens=[7, 8], score=-0.5, log_prob=-1.5, alignment=np.ones((3, 3), np.float32), steps=3)
    samples = [
        SubmitSentences([spec]),
        Encode([EncodeSpec(key=4, src_ids=[6, 2])]),
        Cancel([3, 4]),
        StopAccepting(),
        MetricsRequest(token=5),
        Shutdown(),
        Ready(provider="cpu", sessions=2),
        StartupError("no model at /nowhere"),
        Done(3, finished),
        Encoded(4, np.arange(6, dtype=np.float32).reshape(2, 3)),
        Failed(3, ResourceExhausted("queue full: max_queue_size")),
        Tokens(3, [7]),
        MetricsReply(token=5, families=list(Metrics().registry.collect())),
    ]
    assert {type(m) for m in samples} == set(typing.get_args(ToChild)) | set(typing.get_args(ToParent))
    for msg in samples:
        back = pickle.loads(pickle.dumps(msg))
        assert type(back) is type(msg)
        assert repr(back) == repr(msg)
    failed = pickle.loads(pickle.dumps(samples[10]))
    assert isinstance(failed.error, ResourceExhausted) and failed.error.message == "queue full: max_queue_size"


class FakeScheduler:
    def __init__(self):
        self.calls = []

    def submit(self, sentences):
        self.calls.append(("submit", sentences))

    def submit_encode(self, jobs):
        self.calls.append(("submit_encode", jobs))

    def stop_accepting(self):
        self.calls.append(("stop_accepting",))


class NotAMessage:
    pass


def test_the_child_ignores_a_message_it_has_no_case_for():
    parent, conn = mp.Pipe()
    scheduler = FakeScheduler()
    child = Child(conn, scheduler, Metrics().for_model("m", "1"))
    assert child.handle(NotAMessage()) is True
    for msg in (NotAMessage(), ("shutdown",), StopAccepting(), Shutdown(), StopAccepting()):
        parent.send(msg)
    child.serve()  # returns at Shutdown, not at the old-style ("shutdown",)
    assert scheduler.calls == [("stop_accepting",)]
    assert not parent.poll(0.1)  # no answer to any of them
    parent.send_bytes(b"not a pickle")  # unreadable: the child process ends (the parent replaces it)
    with pytest.raises(pickle.UnpicklingError):
        child.serve()


def test_the_child_answers_by_key():
    parent, conn = mp.Pipe()
    scheduler = FakeScheduler()
    child = Child(conn, scheduler, Metrics().for_model("m", "1"))
    spec = SentenceSpec(
        key=7,
        src_ids=[4, 2],
        beam=1,
        length_penalty=1.0,
        max_len=5,
        want_alignment=False,
        want_scores=False,
        deadline=None,
        stream=True,
    )
    specs = [
        spec,
        dataclasses.replace(spec, key=8, stream=False),
        dataclasses.replace(spec, key=9, stream=False, want_scores=True),
    ]
    assert child.handle(SubmitSentences(specs))
    ((_, sentences),) = scheduler.calls
    assert [s.key for s in sentences] == [7, 8, 9] and [s.on_tokens is None for s in sentences] == [False, True, True]
    assert [s.want_scores for s in sentences] == [False, False, True]
    sentences[0].on_tokens([9])
    assert repr(parent.recv()) == repr(Tokens(7, [9]))
    sentences[1].future.set_exception(RuntimeError("boom"))
    failed = parent.recv()
    assert isinstance(failed, Failed) and failed.key == 8 and isinstance(failed.error, Internal)
    finished = Finished(key=9, tokens=[7], score=-0.5, log_prob=-1.0, alignment=None, steps=2)
    sentences[2].future.set_result(finished)
    assert repr(parent.recv()) == repr(Done(9, finished))
    child.handle(Cancel([7, 8]))
    assert sentences[0].future.cancelled() and not parent.poll(0.1)  # a cancelled one is not answered


class FakeProcess:
    exitcode = -9

    def __init__(self):
        self.killed = False

    def kill(self):
        self.killed = True

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return False


def test_the_reader_survives_a_message_it_cannot_handle_and_replaces_the_child_on_an_unreadable_one(caplog):
    engine = EngineProcess(Settings())
    child_end, engine._conn = mp.Pipe()
    engine._proc = first = FakeProcess()
    restarted = threading.Event()

    def restart():  # what start_process does, without a process
        engine._conn, engine._proc = mp.Pipe()[0], FakeProcess()
        engine._stopping = True
        restarted.set()

    engine.start_process = restart
    reader = threading.Thread(target=engine._read, daemon=True)
    reader.start()

    def boom(tokens):
        raise RuntimeError("a streaming callback that fails")

    streamed = Sentence(src_ids=[4, 2], beam=1, length_penalty=1.0, max_len=5, on_tokens=boom)
    waiting = Sentence(src_ids=[5, 2], beam=1, length_penalty=1.0, max_len=5)
    job = EncodeJob(src_ids=[6, 2])
    with caplog.at_level(logging.ERROR, logger="mtserve.engine_process"):
        engine.submit([streamed, waiting])
        engine.submit_encode([job])
        submitted, encode = child_end.recv(), child_end.recv()
        assert [s.key for s in submitted.sentences] == [streamed.key, waiting.key]
        assert [s.stream for s in submitted.sentences] == [True, False]
        assert [j.key for j in encode.jobs] == [2] and engine.load == 3
        child_end.send(NotAMessage())  # ignored
        child_end.send(Tokens(streamed.key, [9]))  # its callback raises: logged, the reader goes on
        memory = np.zeros((2, 4), np.float32)
        child_end.send(Encoded(2, memory))
        np.testing.assert_array_equal(job.future.result(timeout=5), memory)
        assert reader.is_alive() and "cannot handle Tokens(key=0)" in caplog.text
        assert engine.load == 2 and not restarted.is_set()
        child_end.send_bytes(b"not a pickle")  # unreadable: the child is killed and replaced
        assert restarted.wait(5)
        reader.join(5)
    assert first.killed and not reader.is_alive()
    for s in (streamed, waiting):
        with pytest.raises(Internal, match="engine process exited"):
            s.future.result(timeout=5)
    assert engine.load == 0 and engine.idle
