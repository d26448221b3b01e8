"""The scheduler's admission policy, without a model: when a worker admits waiting sentences
(`_admission_due`) and which ones it takes (`_admit`). The decoding side is covered through the
server in test_server.py and test_faults.py."""

from __future__ import annotations

import time

import pytest

from service.batching.scheduler import Scheduler, Sentence
from service.errors import DeadlineExceeded
from service.metrics import Metrics
from service.settings import Settings


def make_scheduler(**overrides) -> Scheduler:
    fields = {
        "continuous_batching": True,
        "admit_fraction": 0.25,
        "admit_delay_ms": 20.0,
        "max_batch_sentences": 64,
        "max_batch_tokens": 4096,
        "max_queue_size": 1024,
    }
    return Scheduler([], Settings(**{**fields, **overrides}), Metrics().for_model("m", "1"))


def sentence(
    n_tokens: int, beam: int = 1, age_s: float = 0.0, deadline: float | None = None, request: int | None = None
) -> Sentence:
    return Sentence(
        src_ids=[5] * (n_tokens - 1) + [2],
        beam=beam,
        length_penalty=1.0,
        max_len=20,
        deadline=deadline,
        enqueued=time.monotonic() - age_s,
        request=request,
    )


def due(sch: Scheduler, running: int) -> bool:
    with sch._cond:
        return sch._admission_due(running)


def gauge(sch: Scheduler, name: str, **labels) -> float | None:
    return sch.metrics.registry.get_sample_value(name, {"model": "m", "version": "1", **labels})


def admit(sch: Scheduler, running_rows: int = 0, running_src_len: int = 0) -> list[Sentence]:
    with sch._cond:
        return sch._admit(running_rows, running_src_len)


def wait_for_company_while(sch: Scheduler, arrivals: int, gap_s: float) -> tuple[int, float]:
    """Run `_wait_for_company` while `arrivals` sentences arrive one every `gap_s` seconds: the
    rows waiting when it ended, and how long it took."""
    import threading

    def arrive() -> None:
        for _ in range(arrivals):
            time.sleep(gap_s)
            sch.submit([sentence(10)])

    clients = threading.Thread(target=arrive)
    clients.start()
    start = time.monotonic()
    with sch._cond:
        sch._wait_for_company()
        waiting = len(sch._queue)
    waited = time.monotonic() - start
    clients.join()
    return waiting, waited


def test_nothing_waiting_is_never_due():
    assert not due(make_scheduler(), 0)
    assert not due(make_scheduler(), 10)


def test_an_idle_worker_admits_at_once_in_both_modes():
    for continuous in (True, False):
        sch = make_scheduler(continuous_batching=continuous)
        sch.submit([sentence(5)])
        assert due(sch, 0)


def test_static_batching_never_joins_a_running_batch():
    sch = make_scheduler(continuous_batching=False)
    sch.submit([sentence(5, age_s=10.0) for _ in range(40)])
    assert not due(sch, 8)


def test_a_running_batch_admits_in_bulk_or_after_the_delay():
    sch = make_scheduler()
    sch.submit([sentence(5) for _ in range(3)])
    assert not due(sch, 16)  # 3 waiting < 0.25 x 16, and none has waited 20 ms
    assert due(sch, 12)  # 3 >= 0.25 x 12
    sch.submit([sentence(5)])
    assert due(sch, 16)  # 4 >= 0.25 x 16

    old = make_scheduler()
    old.submit([sentence(5, age_s=0.05)])  # waited 50 ms > admit_delay_ms
    assert due(old, 16)


def test_admission_takes_the_oldest_then_the_closest_lengths():
    sch = make_scheduler(max_batch_sentences=3)
    first, near, far, nearer = sentence(10, age_s=1.0), sentence(13), sentence(40), sentence(11)
    sch.submit([first, near, far, nearer])
    assert admit(sch) == [first, nearer, near]
    assert sch.queue_depth == 1 and gauge(sch, "mtserve_queue_depth") == 1


def test_admission_counts_beam_rows_and_padded_source_tokens():
    sch = make_scheduler(max_batch_sentences=8, max_batch_tokens=100)
    beams = [sentence(10, beam=4) for _ in range(3)]
    sch.submit(beams)
    assert len(admit(sch)) == 2  # 2 x 4 rows fill 8
    assert len(admit(sch, running_rows=6, running_src_len=10)) == 0  # 6 + 4 rows > 8

    tokens = make_scheduler(max_batch_sentences=64, max_batch_tokens=100)
    tokens.submit([sentence(20) for _ in range(8)])
    assert len(admit(tokens)) == 5  # 5 rows x 20 tokens = 100


def test_an_idle_worker_starts_a_static_batch_with_its_share_of_the_rows_in_flight():
    """With static batches, one idle worker taking all that waits leaves the other worker the
    stragglers (c64 greedy: 11-12 rows a step); each takes its share of the rows in flight instead."""
    sch = make_scheduler(continuous_batching=False)
    sch.models = [object(), object()]  # two decode workers
    sch.submit([sentence(10) for _ in range(64)])
    assert len(admit(sch)) == 32  # 64 rows in flight over 2 workers
    with sch._cond:
        sch._busy_rows = 40  # the other worker's batch
    assert len(admit(sch)) == 32  # (40 + 32 waiting) / 2 = 36 rows, and 32 wait
    beams = make_scheduler(continuous_batching=False)
    beams.models = [object(), object()]
    beams.submit([sentence(10, beam=4) for _ in range(10)])
    assert len(admit(beams)) == 5  # 40 rows in flight: 20 rows, 5 sentences of 4 beams
    one = make_scheduler(continuous_batching=False)
    one.models = [object()]
    one.submit([sentence(10) for _ in range(64)])
    assert len(admit(one)) == 64  # a lone worker takes up to max_batch_sentences
    cont = make_scheduler(continuous_batching=True)
    cont.models = [object(), object()]
    cont.submit([sentence(10) for _ in range(64)])
    assert len(admit(cont)) == 64  # continuous batching admits by its own rules


def test_a_lone_sentence_is_admitted_even_beyond_the_limits():
    """The limits bound what joins a batch, they never starve a sentence: an idle worker takes
    the oldest sentence whatever its size (its length was validated at the API)."""
    sch = make_scheduler(max_batch_sentences=2, max_batch_tokens=16)
    big = sentence(40, beam=4)
    sch.submit([big])
    assert admit(sch) == [big]


def test_cancelled_and_expired_sentences_leave_the_queue_unadmitted():
    sch = make_scheduler()
    cancelled, expired, live = sentence(5), sentence(5, deadline=time.monotonic() - 1), sentence(5)
    sch.submit([cancelled, expired, live])
    assert cancelled.future.cancel()
    assert admit(sch) == [live]
    assert sch.queue_depth == 0 and gauge(sch, "mtserve_queue_depth") == 0
    with pytest.raises(DeadlineExceeded):
        expired.future.result(timeout=0)
    for outcome in ("cancelled", "deadline_exceeded"):
        assert gauge(sch, "mtserve_sentences_total", outcome=outcome) == 1


def test_an_idle_worker_batches_one_requests_many_rows_alone_up_to_the_token_cap():
    """A long text's sentences (one request, more rows than max_batch_sentences) fill a batch of
    their own up to max_batch_tokens; other requests' rows never join it."""
    sch = make_scheduler(max_batch_sentences=16, max_batch_tokens=400)
    text = [sentence(10, beam=4, age_s=1.0, request=1) for _ in range(20)]  # 80 rows
    other = sentence(10, beam=4, request=2)
    sch.submit([*text, other])
    assert admit(sch) == text[:10]  # 10 x 4 rows x 10 tokens = 400 tokens, past 16 rows
    assert admit(sch, running_rows=40, running_src_len=10) == []  # a running batch: the sentence cap
    assert admit(sch) == text[10:]  # 40 rows, still more than 16: alone again
    assert admit(sch) == [other]


def test_a_request_within_the_sentence_cap_is_batched_as_before():
    sch = make_scheduler(max_batch_sentences=16, max_batch_tokens=4096)
    small = [sentence(10, beam=4, age_s=1.0, request=1) for _ in range(4)]  # 16 rows: not past the cap
    others = [sentence(10, beam=4, request=2) for _ in range(4)]
    sch.submit([*small, *others])
    assert admit(sch) == small  # 16 rows fill the batch, whoever's rows they are
    untagged = make_scheduler(max_batch_sentences=16, max_batch_tokens=4096)
    untagged.submit([sentence(10, beam=4) for _ in range(20)])
    assert len(admit(untagged)) == 4


def test_one_requests_static_batches_keep_each_worker_its_share():
    sch = make_scheduler(continuous_batching=False, max_batch_sentences=16, max_batch_tokens=4096)
    sch.models = [object(), object()]  # two decode workers
    sch.submit([sentence(10, beam=4, request=1) for _ in range(40)])  # 160 rows
    assert len(admit(sch)) == 20  # 80 rows each, past the 16-row cap but half of the 160


def test_an_idle_worker_waits_for_company_until_the_batch_is_full_or_the_delay_has_passed():
    """max_queue_delay_ms is a wait for a full batch, not for the next arrival: closed-loop clients
    answered together come back over a few milliseconds, and a worker woken by the first of them
    would start a batch of one."""
    sch = make_scheduler(continuous_batching=False, max_batch_sentences=3, max_queue_delay_ms=5000)
    sch.models = [object(), object()]  # two decode workers
    sch._busy_rows = 3  # the other worker's batch: this one's share is 3 rows
    sch.submit([sentence(10)])
    waiting, waited = wait_for_company_while(sch, 2, 0.05)
    assert waiting == 3  # not woken for good by the second arrival
    assert waited < 2.5  # the full batch ends the wait long before the 5 s delay

    lone = make_scheduler(continuous_batching=False, max_queue_delay_ms=5000)
    lone.models = [object(), object()]
    lone.submit([sentence(10)])
    start = time.monotonic()
    with lone._cond:
        lone._wait_for_company()  # nothing else in flight: its share is itself
    assert time.monotonic() - start < 1.0

    alone = make_scheduler(max_queue_delay_ms=100)  # continuous batching: waits for a full batch
    alone.submit([sentence(10, age_s=0.04)])  # it waited 40 ms already; the delay runs from now
    start = time.monotonic()
    with alone._cond:
        alone._wait_for_company()
    assert 0.05 <= time.monotonic() - start < 1.0


def test_a_worker_that_answered_closed_loop_clients_waits_for_them_not_for_a_straggler():
    """At c64 greedy a worker finishes 32 rows while the other runs 32: its clients come back over
    tens of milliseconds, and a straggler that waited through the other batch is already there. The
    rows just answered count as in flight (`_returning`), so the worker waits for its 32 instead of
    starting a batch of the straggler, with the delay counted from when it starts waiting."""
    sch = make_scheduler(continuous_batching=False, max_queue_delay_ms=5000)
    sch.models = [object(), object()]  # two decode workers
    sch._busy_rows = 32  # the other worker's batch
    sch.submit([sentence(10, age_s=1.0)])  # a straggler, older than the delay
    with sch._cond:
        sch._answered(31)  # this worker's batch, just answered
        assert sch._returning_rows() == 31 and sch._share(1) == 32  # (32 + 1 + 31) / 2

    waiting, waited = wait_for_company_while(sch, 31, 0.002)
    assert waiting == 32 and waited < 2.5  # all of them, long before the delay
    assert len(admit(sch)) == 32
    with sch._cond:
        assert sch._returning_rows() == 0  # the arrivals used them up


def test_answered_rows_are_expected_back_for_max_queue_delay_ms_at_most():
    sch = make_scheduler(continuous_batching=False, max_queue_delay_ms=100)
    sch.models = [object(), object()]
    with sch._cond:
        sch._answered(8)
        sch._answered(4)
    sch.submit([sentence(10) for _ in range(10)])  # the oldest answered rows are used up first
    with sch._cond:
        assert [r for _, r in sch._returning] == [2]
    time.sleep(0.15)
    with sch._cond:
        assert sch._returning_rows() == 0 and not sch._returning  # open-loop clients never come back
    for settings in ({"max_queue_delay_ms": 0, "continuous_batching": False}, {"max_queue_delay_ms": 100}):
        never = make_scheduler(**settings)  # no wait (the default), or continuous batching: not recorded
        with never._cond:
            never._answered(8)
            assert never._returning_rows() == 0


def test_answered_rows_count_as_returning_before_their_clients_have_the_answer():
    """A client can send again before the worker's next line runs: the rows are recorded first."""
    from service.decoding.results import Finished

    sch = make_scheduler(continuous_batching=False, max_queue_delay_ms=1000)
    s = sentence(10)
    seen = []
    s.future.add_done_callback(lambda _: seen.append(sch._returning_rows()))
    done = Finished(key=s.key, tokens=[5], score=None, log_prob=None, alignment=None, steps=2)
    assert sch._answer([done], {s.key: s}) == 1
    assert seen == [1]


def test_a_straggler_alone_still_waits_from_when_the_worker_starts_waiting():
    sch = make_scheduler(continuous_batching=False, max_queue_delay_ms=100)
    sch.models = [object(), object()]
    sch._busy_rows = 32  # its share is 17 rows: it waits the whole delay for them
    sch.submit([sentence(10, age_s=1.0)])
    start = time.monotonic()
    with sch._cond:
        sch._wait_for_company()
    assert 0.09 <= time.monotonic() - start < 1.0


def test_a_request_in_passes_counts_its_rows_as_it_arrives_and_as_it_is_answered():
    """A glossary row's pass 1 (greedy, one row) brings the request's beam rows and answers none;
    its pass 2 arrives with none and answers them (service.engine.placement): a closed-loop client
    whose beam-4 rows were just answered and who sends its next request does not leave the worker
    waiting for rows that are not coming."""
    from service.decoding.results import Finished

    sch = make_scheduler(continuous_batching=False, max_queue_delay_ms=1000)
    sch.models = [object()]
    with sch._cond:
        sch._answered(4)  # the client's last request, at beam 4
    first = sentence(10, beam=1)
    first.arriving_rows, first.answered_rows = 4, 0
    sch.submit([first])
    with sch._cond:
        assert sch._returning_rows() == 0 and sch._share(1) == 1  # no wait for company
    plain = sentence(10, beam=1)
    sch.submit([plain])
    with sch._cond:
        assert sch._share(2) == 2
    fin = Finished(key=first.key, tokens=[5], score=None, log_prob=None, alignment=None, steps=2)
    sch._answer([fin], {first.key: first})
    with sch._cond:
        assert sch._returning_rows() == 0  # pass 1 goes back to the engine, not to a client
    second = sentence(10, beam=4)
    second.arriving_rows = 0
    sch.submit([second])
    fin = Finished(key=second.key, tokens=[5], score=None, log_prob=None, alignment=None, steps=2)
    sch._answer([fin], {second.key: second})
    with sch._cond:
        assert sch._returning_rows() == 4


@pytest.mark.parametrize("then", ["takes", "declines", "raises"])
def test_a_sentence_s_continuation_may_take_it_on_from_the_worker(then):
    from service.decoding.results import Finished

    sch = make_scheduler()
    s = sentence(10)
    seen = []

    def go_on(f: Finished) -> bool:
        seen.append(f.tokens)
        if then == "raises":
            raise RuntimeError("a bug in a continuation")
        return then == "takes"

    s.then = go_on
    done = Finished(key=s.key, tokens=[5], score=None, log_prob=None, alignment=None, steps=2)
    assert sch._answer([done], {s.key: s}) == 1
    assert seen == [[5]]
    assert s.future.done() is (then != "takes")  # taken on: the continuation settles it later
    if then != "takes":
        assert s.future.result() is done
