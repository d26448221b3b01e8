"""benchmarks/ct2_backend.py: mtserve's server (gRPC front, Engine, limits, drain) decoding with
CTranslate2 through `Server(settings, backend_factory=...)`. Over real gRPC on loopback with the
tiny model: the translations are CTranslate2's own, token for token; the queue limit answers
RESOURCE_EXHAUSTED; a drain finishes what was accepted and refuses the rest. Without a server:
deadlines, cancellation, decoding modes and the split of the waiting between idle workers.
Skipped without ctranslate2 (the `bench` extra)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from benchmarks.ct2_backend import Ct2Backend
from benchmarks.ct2_convert import Ct2Translator, convert
from benchmarks.ct2_server import backend_factory
from service.batching.jobs import EncodeJob, Sentence
from service.client import Client
from service.decoding.results import Finished
from service.errors import DeadlineExceeded, ResourceExhausted, Unavailable
from service.metrics import Metrics
from service.settings import Settings

ctranslate2 = pytest.importorskip("ctranslate2")


def code_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


def wait_for(condition, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while not condition() and time.monotonic() < end:
        time.sleep(0.005)
    return condition()


# ----------------------------------------------------------------------------- over gRPC


@pytest.fixture(scope="module")
def ct2_dir(tiny_model_dir, tmp_path_factory):
    return convert(tiny_model_dir, tmp_path_factory.mktemp("ct2") / "model")


class Ct2Server:
    """`Server(settings, backend_factory=...)` on its own event loop thread, as ct2_server.py runs it."""

    def __init__(self, settings: Settings, ct2_dir):
        from service.server import Server

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = Server(settings, backend_factory=backend_factory(ct2_dir, "int8"))
        self.call(self.server.start(), timeout=120)
        self.address = f"127.0.0.1:{self.server.port}"
        self.backend: Ct2Backend = self.server.scheduler  # type: ignore[assignment]
        self.stopped = False

    def call(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def hold_calls(self) -> tuple[threading.Event, threading.Event]:
        """Every translate_batch call waits for `gate` first; `entered` is set when one does."""
        gate, entered = threading.Event(), threading.Event()
        original = self.backend.ct2.translate_limited

        def held(*a, **kw):
            entered.set()
            gate.wait(30)
            return original(*a, **kw)

        self.backend.ct2.translate_limited = held  # type: ignore[method-assign]
        return gate, entered

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            self.call(self.server.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def make_ct2_server(tiny_onnx_dir, ct2_dir):
    started = []

    def make(**overrides) -> Ct2Server:
        fields = dict(
            address="127.0.0.1:0",
            model_dir=tiny_onnx_dir.parent,
            onnx_dir=tiny_onnx_dir,
            metrics_port=0,
            decode_workers=1,
            intra_op_threads=1,
            grace_period_s=10.0,
        )
        s = Ct2Server(Settings(**{**fields, **overrides}), ct2_dir)
        started.append(s)
        return s

    yield make
    for s in started:
        if s.thread.is_alive():
            s.stop()


@pytest.fixture(scope="module")
def ct2_server(make_ct2_server) -> Ct2Server:
    return make_ct2_server()


def test_translations_are_ctranslate2s_own(ct2_server, tiny_onnx_dir, tiny_model_dir, ct2_dir, test_split):
    """One request of 16 texts is one translate_batch call of those 16 sentences (one worker): the
    same call made directly gives the same tokens, greedy and beam 4."""
    from tokenizers import Tokenizer

    texts = test_split[0][:16]
    engine = ct2_server.server.engine
    gen, eos = engine.manifest.generation, engine.eos_id
    tokenizer = Tokenizer.from_file(str(tiny_onnx_dir / "tokenizer.json"))
    src = [e.ids + [eos] for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    direct = Ct2Translator(ct2_dir, tiny_model_dir, compute_type="int8")
    with Client(ct2_server.address, timeout=60) as c:
        for beam in (1, 4):
            want = direct.translate_ids(
                src,
                beam=beam,
                length_penalty=gen.length_penalty,
                max_len_a=gen.max_len_a,
                max_len_b=gen.max_len_b,
                batch_size=len(src),
            )
            got = c.translate(texts, beam_size=beam, return_tokens=True, return_scores=True)
            assert [list(t.token_ids) for t in got] == want
            assert [t.text for t in got] == [tokenizer.decode(w, skip_special_tokens=True).strip() for w in want]
            assert all(t.score < 0 and t.output_tokens == len(t.token_ids) + 1 for t in got)
            assert all(t.input_tokens == len(s) for t, s in zip(got, src))
        info = c.model_info()
        assert info.execution_provider == "cpu (CTranslate2)"


def test_greedy_streams_token_by_token(ct2_server, test_split):
    text = max(test_split[0][:40], key=len)
    with Client(ct2_server.address, timeout=60) as c:
        (whole,) = c.translate([text], beam_size=1)
        msgs = list(c.translate_stream(text, beam_size=1))
    chunks, final = msgs[:-1], msgs[-1]
    assert len(chunks) >= 2 and all(m.HasField("chunk") for m in chunks) and final.HasField("final")
    assert "".join(m.chunk.text for m in chunks).strip() == final.final.text == whole.text


def test_encode_is_refused_with_a_clear_message(ct2_server):
    with Client(ct2_server.address, timeout=30) as c:
        code, details = code_of(lambda: c.encode(["Ein Hund."]))
    assert code == grpc.StatusCode.UNAVAILABLE and "CTranslate2" in details and "Encode" in details


def test_queue_full_is_resource_exhausted(make_ct2_server, test_split):
    srv = make_ct2_server(max_queue_size=2)
    texts = test_split[0][:4]
    gate, entered = srv.hold_calls()
    with Client(srv.address, timeout=60) as c, ThreadPoolExecutor(4) as pool:
        first = pool.submit(c.translate, texts[:1], beam_size=1)
        assert entered.wait(10)  # the one worker is in its call with the first sentence
        queued = pool.submit(c.translate, texts[1:3], beam_size=1)
        assert wait_for(lambda: srv.backend.queue_depth == 2)
        code, details = code_of(lambda: c.translate(texts[3:4], beam_size=1))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_queue_size" in details
        gate.set()
        assert first.result()[0].text and [bool(t.text) for t in queued.result()] == [True, True]
    assert wait_for(lambda: srv.backend.idle)


def test_drain_finishes_what_was_accepted_and_refuses_the_rest(make_ct2_server, test_split):
    srv = make_ct2_server()
    texts = test_split[0][:3]
    gate, entered = srv.hold_calls()
    with Client(srv.address, timeout=60) as c, ThreadPoolExecutor(4) as pool:
        first = pool.submit(c.translate, texts[:1], beam_size=4)
        assert entered.wait(10)
        queued = pool.submit(c.translate, texts[1:2], beam_size=4)
        assert wait_for(lambda: srv.backend.queue_depth == 1)
        srv.stopped = True
        drain = asyncio.run_coroutine_threadsafe(srv.server.drain(), srv.loop)
        assert wait_for(lambda: not srv.backend._accepting)
        assert c.health() == "NOT_SERVING"
        code, details = code_of(lambda: c.translate(texts[2:3], beam_size=4))
        assert code == grpc.StatusCode.UNAVAILABLE and "draining" in details
        gate.set()
        assert first.result()[0].text and queued.result()[0].text  # accepted before the drain: answered
        drain.result(30)
    assert srv.backend.idle and not any(t.is_alive() for t in srv.backend._threads)


# ----------------------------------------------------------------------------- the backend alone


class FakeCt2:
    """Ct2Translator's `translate_limited`, recording its calls; each call waits for `gate`."""

    def __init__(self, inter_threads: int = 1):
        self.inter_threads = inter_threads
        self.calls: list[dict] = []
        self.gate = threading.Event()
        self.gate.set()

    def translate_limited(self, src, limits, beam, length_penalty, batch_size, return_scores, callback):
        self.calls.append({"src": src, "limits": limits, "beam": beam, "length_penalty": length_penalty})
        self.gate.wait(10)
        return [([7] * (len(s) - 1), -0.5) for s in src]


def backend(fake: FakeCt2, **settings) -> Ct2Backend:
    return Ct2Backend(fake, Settings(**settings), Metrics().for_model("m", "1"))  # type: ignore[arg-type]


def sentence(n: int, beam: int = 1, lp: float = 1.0, deadline: float | None = None) -> Sentence:
    return Sentence(src_ids=list(range(4, 4 + n)) + [2], beam=beam, length_penalty=lp, max_len=n + 5, deadline=deadline)


def test_sentences_settle_as_finished_by_mode_and_the_dropped_ones_do_not_decode():
    fake = FakeCt2()
    b = backend(fake)
    expired = sentence(3, deadline=time.monotonic() - 1)
    cancelled = sentence(4)
    cancelled.future.cancel()
    greedy, beam4, greedy2 = sentence(2), sentence(3, beam=4, lp=0.6), sentence(5)
    b.submit([expired, cancelled, greedy, beam4, greedy2])  # queued before the worker starts
    b.start()
    results = [s.future.result(10) for s in (greedy, beam4, greedy2)]
    with pytest.raises(DeadlineExceeded):
        expired.future.result(10)
    assert all(isinstance(r, Finished) and r.alignment is None for r in results)
    assert [r.key for r in results] == [greedy.key, beam4.key, greedy2.key]
    assert results[0].tokens == [7, 7] and results[0].steps == 3 and results[0].score == -0.5
    # one call per decoding mode, the oldest sentence's mode first, the cancelled one in neither
    assert [(c["beam"], c["length_penalty"], len(c["src"])) for c in fake.calls] == [(1, 1.0, 2), (4, 0.6, 1)]
    assert fake.calls[0]["limits"] == [greedy.max_len, greedy2.max_len]
    assert wait_for(lambda: b.idle)
    b.shutdown()


def test_idle_workers_share_the_waiting_sentences():
    fake = FakeCt2(inter_threads=2)
    fake.gate.clear()
    b = backend(fake)
    sentences = [sentence(3) for _ in range(10)]
    b.submit(sentences)
    b.start()
    assert wait_for(lambda: len(fake.calls) == 2)  # both in their calls, holding everything
    assert sorted(len(c["src"]) for c in fake.calls) == [5, 5] and b.queue_depth == 0
    fake.gate.set()
    assert all(s.future.result(10).tokens == [7, 7, 7] for s in sentences)
    b.shutdown()


def test_limits_draining_shutdown_and_encode():
    fake = FakeCt2()
    b = backend(fake, max_queue_size=3)
    b.submit([sentence(2), sentence(2)])
    with pytest.raises(ResourceExhausted, match="max_queue_size"):
        b.submit([sentence(2), sentence(2)])  # all or none
    assert b.queue_depth == 2
    with pytest.raises(Unavailable, match="CTranslate2"):
        b.submit_encode([EncodeJob(src_ids=[4, 2])])
    b.stop_accepting()
    with pytest.raises(Unavailable, match="draining"):
        b.submit([sentence(2)])
    waiting = list(b._queue)
    b.shutdown()  # never started: what is queued fails UNAVAILABLE
    for s in waiting:
        with pytest.raises(Unavailable):
            s.future.result(1)
    assert fake.calls == [] and b.idle


def test_ct2_server_runs_as_replicas(tiny_model_dir, tiny_onnx_dir, ct2_dir, tmp_path):
    """ct2_server.py --replicas 2: its backend factory crosses to the spawned replicas, and both
    serve CTranslate2's translations on one port."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from tests.service.test_replicas import translate_over_connections
    from tests.support import free_port

    port = free_port()
    log = tmp_path / "ct2-replicas.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.ct2_server",
                "--model-dir",
                str(tiny_model_dir),
                "--onnx-dir",
                str(tiny_onnx_dir),
                "--ct2-dir",
                str(ct2_dir),
                "--address",
                f"127.0.0.1:{port}",
                "--metrics-port",
                "0",
                "--replicas",
                "2",
                "--decode-workers",
                "1",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=Path(__file__).resolve().parents[2],
        )
    try:
        assert wait_for(lambda: "2 replicas serving" in log.read_text() or proc.poll() is not None, 120)
        assert proc.poll() is None, log.read_text()
        assert translate_over_connections(f"127.0.0.1:{port}", 32, connections=8) == ["OK"] * 32
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
