"""Continuous (iteration-level) batching. Knows nothing of gRPC.

Sentences wait in one bounded queue. Each decode worker is a thread with a model (an ONNX
Runtime session pair, on the CPU usually one shared by all workers: sessions take concurrent
runs) and a running `DecodeBatch` per decoding mode (beam width, length penalty). Between two decoder steps a worker admits waiting sentences: it runs their encoder
pass and concatenates them into its running batch (the text-generation-inference
`Seq2SeqLMBatch.concatenate` pattern); rows whose sentence finished, was cancelled or failed
leave at once (`filter`) and are answered without waiting for the rest.

Admission and compaction each copy every row's cache, so a running batch does them in bulk:
it admits once the waiting sentences number `admit_fraction` of its own (or the oldest has
waited `admit_delay_ms`), and drops the rows of finished sentences once they are
`compact_fraction` of its rows (or when it admits); until then those rows ride along unanswered
for nothing, which costs less than copying the cache at every step. A sentence is answered at
the step it finishes either way.

Admission is length-aware: the oldest waiting sentence goes first, then those whose source
length is closest to it, while the batch stays within `max_batch_sentences` rows and
`max_batch_tokens` padded source tokens. ONNX Runtime runs in these worker threads, so the
asyncio event loop keeps answering health checks and new requests while batches decode.

Results travel back through `concurrent.futures.Future`s; a caller cancelling its future (a
client cancel) makes the sentence leave its batch at the next step.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Hashable, Sequence
from typing import TypeAlias

import numpy as np

from service import tracing
from service.batching.jobs import EncodeJob, Sentence, settle
from service.batching.queue import SentenceQueue
from service.decoding.batch import DecodeBatch
from service.decoding.model import DecoderModel
from service.decoding.results import Finished
from service.errors import Internal, ResourceExhausted, Unavailable
from service.metrics import ModelMetrics
from service.settings import Settings

log = logging.getLogger("mtserve.scheduler")

# A worker's running batches by decoding mode (beam width, length penalty), each with its
# sentences by key (those not answered yet).
Mode: TypeAlias = tuple[int, float]
Batches: TypeAlias = dict[Mode, tuple[DecodeBatch, dict[Hashable, Sentence]]]


class Scheduler(SentenceQueue):
    def __init__(self, models: Sequence[DecoderModel], settings: Settings, metrics: ModelMetrics):
        super().__init__(settings, metrics)
        self.models = models  # one OnnxSeq2Seq per worker
        self._encode_queue: list[EncodeJob] = []
        self._busy_rows = 0  # rows in running batches, all workers
        self._busy_encodes = 0  # encode jobs taken off the queue and not yet answered
        # Rows answered within the last max_queue_delay_ms whose clients have not sent again yet,
        # oldest first: [answered at, rows]. Closed-loop clients send their next request when
        # answered, so these are rows about to be in flight again (`_share`); arrivals use them up.
        self._returning: collections.deque[list[float]] = collections.deque()

    # -- caller side (event loop thread) ------------------------------------------------

    def start(self) -> None:
        for i, model in enumerate(self.models):
            t = threading.Thread(target=self._worker, args=(model,), name=f"decode-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        with self._cond:
            if not self._accepting:
                raise Unavailable("server is draining; retry on another replica")
            if len(self._encode_queue) + len(jobs) > self.settings.max_queue_size:
                raise ResourceExhausted(f"encode queue full (max_queue_size {self.settings.max_queue_size})")
            self._encode_queue.extend(jobs)
            self._cond.notify_all()

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._queue and not self._encode_queue and self._busy_rows == 0 and self._busy_encodes == 0

    def _take_queued(self) -> list[tuple[concurrent.futures.Future, str]]:
        left = super()._take_queued()
        jobs, self._encode_queue = self._encode_queue, []
        return left + [(j.future, "server shut down before this text was encoded") for j in jobs]

    # -- worker side ---------------------------------------------------------------------

    def _admit(self, running_rows: int, running_src_len: int) -> list[Sentence]:
        """Pop the sentences to join this worker's batches (called with the lock held)."""
        now = time.monotonic()
        live = self._live(now)
        if not live:
            return []
        st = self.settings
        cap = st.max_batch_sentences
        candidates = live
        own = [] if running_rows else self._one_request(live)
        if own:
            candidates, cap = own, st.max_batch_tokens  # rows bounded by their padded tokens alone
        if not running_rows and not st.continuous_batching:
            cap = min(cap, self._share(sum(s.beam for s in live)))
        first = candidates[0]
        ranked = sorted(candidates[1:], key=lambda s: abs(len(s.src_ids) - len(first.src_ids)))
        chosen: list[Sentence] = []
        rows, longest = running_rows, running_src_len
        for s in [first, *ranked]:
            new_rows, new_longest = rows + s.beam, max(longest, len(s.src_ids))
            if chosen or running_rows:
                if new_rows > cap or new_rows * new_longest > st.max_batch_tokens:
                    if len(chosen) + running_rows >= cap:
                        break
                    continue
            chosen.append(s)
            rows, longest = new_rows, new_longest
        return self._pop(chosen, now)

    def _one_request(self, live: list[Sentence]) -> list[Sentence]:
        """The waiting rows of the oldest sentence's request when they are more than
        max_batch_sentences rows (a long text's sentences), else []. An idle worker batches them
        alone, up to max_batch_tokens: the sentence cap bounds how long one request's steps wait
        on other requests' rows, and such a batch has none."""
        tag = live[0].request
        if tag is None:
            return []
        own = [s for s in live if s.request == tag]
        return own if sum(s.beam for s in own) > self.settings.max_batch_sentences else []

    def _admission_due(self, running: int) -> bool:
        """Whether a worker with `running` sentences in its batches admits now (lock held)."""
        if not self._queue:
            return False
        if running == 0:
            return True
        if not self.settings.continuous_batching:
            return False
        return (
            len(self._queue) >= self.settings.admit_fraction * running
            or time.monotonic() - self._queue[0].enqueued >= self.settings.admit_delay_s
        )

    def _wait_for_company(self) -> None:
        """An idle worker waits until the rows of its batch are there (a full batch, or with static
        batches its `_share`), at most max_queue_delay_ms (lock held), so that a burst shares one
        batch: closed-loop clients answered together come back over tens of milliseconds, and a
        worker that started at the first of them would run the rest apart. Triton's dynamic batcher
        waits the same way (max_queue_delay_microseconds)."""
        delay = self.settings.max_queue_delay_s
        if delay <= 0:
            return
        # From now, not from the oldest arrival: that may be a straggler left over from a full
        # batch, and the wait is for the rows coming back.
        deadline = time.monotonic() + delay
        while self._queue and not self._stopping and (left := deadline - time.monotonic()) > 0:
            waiting = sum(s.beam for s in self._queue)
            full = self.settings.max_batch_sentences
            if waiting >= (full if self.settings.continuous_batching else min(full, self._share(waiting))):
                return
            self._cond.wait(left)

    def _share(self, waiting_rows: int) -> int:
        """The rows of a static batch an idle worker starts (lock held): its share of the rows in
        flight, not all that wait. At c64 greedy one batch of 64 beside one of stragglers averages
        11-12 rows a step, two batches of about 32 average 18 (docs/performance.md). In flight
        counts the rows answered within max_queue_delay_ms whose clients have not sent again
        (`_returning`): a worker that has just answered 32 closed-loop clients waits for them, where
        a straggler alone would start a batch of one and leave the 31 to wait a whole batch. A lone
        request's share is itself, so it never waits for company."""
        in_flight = self._busy_rows + waiting_rows + self._returning_rows()
        return max(1, -(-in_flight // max(1, len(self.models))))

    def _arrived(self, sentences: list[Sentence]) -> None:
        """Arrivals use up the oldest answered rows first (lock held)."""
        returning = self._returning
        if not returning:
            return
        rows = sum(s.arriving for s in sentences)
        while rows and returning:
            used = min(rows, int(returning[0][1]))
            returning[0][1] -= used
            rows -= used
            if not returning[0][1]:
                returning.popleft()

    @property
    def _counts_returning(self) -> bool:
        """Whether answered rows are expected back (`_returning`): static batches that wait."""
        return self.settings.max_queue_delay_s > 0 and not self.settings.continuous_batching

    def _answered(self, rows: int) -> None:
        """Rows were answered (lock held): their clients may send again within max_queue_delay_ms."""
        if self._counts_returning:
            self._returning_rows()  # drops the expired ones: a busy server may not ask for a while
            self._returning.append([time.monotonic(), rows])

    def _returning_rows(self) -> int:
        """The answered rows still expected back (lock held); older than max_queue_delay_ms: not."""
        returning, oldest = self._returning, time.monotonic() - self.settings.max_queue_delay_s
        while returning and returning[0][0] < oldest:
            returning.popleft()
        return int(sum(r for _, r in returning))

    def _worker(self, model: DecoderModel) -> None:
        batches: Batches = {}
        while True:
            with self._cond:
                while not batches and not self._queue and not self._encode_queue and not self._stopping:
                    self._cond.wait()
                if self._stopping and not batches:
                    return
                waited = 0.0
                if not batches and self._queue:
                    waited = time.monotonic()
                    self._wait_for_company()
                    waited = time.monotonic() - waited
                admitted = []
                if self._admission_due(sum(len(m) for _, m in batches.values())):
                    rows = sum(len(b) for b, _ in batches.values())
                    src_len = max((b.src_len for b, _ in batches.values()), default=0)
                    admitted = self._admit(rows, src_len)
                encode_jobs, self._encode_queue = (
                    self._encode_queue[: self.settings.max_batch_sentences],
                    self._encode_queue[self.settings.max_batch_sentences :],
                )
                self._busy_rows += sum(s.beam for s in admitted)
                if admitted and log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "%s admitted %d rows after %.1f ms (%d still waiting, %d rows running, %d returning)",
                        threading.current_thread().name,
                        sum(s.beam for s in admitted),
                        1000 * waited,
                        sum(s.beam for s in self._queue),
                        self._busy_rows,
                        self._returning_rows(),
                    )
                self._busy_encodes += len(encode_jobs)
            if encode_jobs:
                try:
                    self._run_encode(model, encode_jobs)
                finally:
                    with self._cond:
                        self._busy_encodes -= len(encode_jobs)
            if admitted:
                self._join(model, batches, admitted)
            for mode in list(batches):
                self._step(model, batches, mode)

    def _join(self, model: DecoderModel, batches: Batches, admitted: list[Sentence]) -> None:
        # Resumed sentences (service.decoding.resume) join as batches of their own: they run no encoder.
        by_mode: dict[tuple[Mode, bool], list[Sentence]] = {}
        for s in admitted:
            by_mode.setdefault((s.mode, s.resume is not None), []).append(s)
        for ((beam, lp), resumed), group in by_mode.items():
            try:
                t0 = time.perf_counter()
                resume = [s.resume for s in group if s.resume is not None] if resumed else None
                new = DecodeBatch.from_sources(
                    model,
                    [s.src_ids for s in group],
                    [s.key for s in group],
                    beam=beam,
                    length_penalty=lp,
                    max_lens=[s.max_len for s in group],
                    min_lens=[s.min_len for s in group],
                    target_prefixes=[s.target_prefix for s in group],
                    kept_prefixes=None if resumed else [s.output_prefix for s in group],
                    num_hypotheses=[s.num_hypotheses for s in group],
                    sampling=[s.sampling for s in group],
                    want_alignment=any(s.want_alignment for s in group),
                    want_scores=[s.want_scores for s in group],
                    terms=[s.terms for s in group] if any(s.terms for s in group) else None,
                    pieces=[s.pieces for s in group] if any(s.terms for s in group) else None,
                    keep_states=[s.keep_state for s in group] if beam == 1 else False,
                    resume=resume,
                )
                encoder_s = time.perf_counter() - t0
                if resumed:
                    for s in group:
                        s.resume = None  # the batch holds what it needs of the state
                else:
                    self.metrics.encoder_latency.observe(encoder_s)
                    self.metrics.input_tokens.inc(sum(len(s.src_ids) for s in group))
            except Exception as exc:
                log.exception("encoder pass failed for %d sentences", len(group))
                self._fail(group, exc)
                continue
            if (beam, lp) in batches:
                old, members = batches[(beam, lp)]
                old.filter(list(members))  # the finished rows go before the copy, not after it
                members.update({s.key: s for s in group})
                batches[(beam, lp)] = (DecodeBatch.concatenate([old, new]), members)
            else:
                batches[(beam, lp)] = (new, {s.key: s for s in group})
            if tracing.tracer is not None:
                tracing.joined(batches[(beam, lp)][1], group, t0, t0 + encoder_s)

    def _step(self, model: DecoderModel, batches: Batches, mode: Mode) -> None:
        """One decoder step of the batch of `mode`: answer the sentences that finished, stream
        greedy tokens, let cancelled sentences go, and compact or end the batch."""
        batch, members = batches[mode]
        finished = self._decode(model, batch, members)
        if finished is None:
            del batches[mode]
            return
        answered = self._answer(finished, members)
        if mode[0] == 1:
            self._stream(batch, members)
        gone = self._drop_cancelled(members)
        if answered or gone:
            with self._cond:
                self._busy_rows -= mode[0] * (answered + gone)
        if not members:
            if tracing.tracer is not None:
                tracing.batch_ended(members)
            del batches[mode]
        elif batch.n_sentences - len(members) >= self.settings.compact_fraction * batch.n_sentences:
            batch.filter(list(members))

    def _decode(
        self, model: DecoderModel, batch: DecodeBatch, members: dict[Hashable, Sentence]
    ) -> list[Finished] | None:
        """Run the batch's decoder step and record it: the sentences that finished at it, or None
        when the step failed (its sentences are failed then)."""
        try:
            t0 = time.perf_counter()
            finished = batch.step(model)
            self.metrics.decoder_step_latency.observe(time.perf_counter() - t0)
            self.metrics.batch_rows.observe(len(batch))
            self.metrics.padding_ratio.observe(batch.padding_ratio)
            self.metrics.decoded_rows.inc(len(batch))
            if tracing.tracer is not None:
                tracing.stepped(members, len(batch))
        except Exception as exc:
            log.exception("decoder step failed; failing the %d sentences of this batch", len(members))
            self._fail(list(members.values()), exc)
            if tracing.tracer is not None:
                tracing.batch_ended(members, exc)
            return None
        return finished

    def _answer(self, finished: list[Finished], members: dict[Hashable, Sentence]) -> int:
        """Settle the futures of the sentences that finished; how many were still waiting."""
        done = [(s, f) for f in finished if (s := members.pop(f.key, None)) is not None]  # None: cancelled earlier
        if done and self._counts_returning:
            with self._cond:  # before the answers go: a client may send again at once
                self._answered(sum(s.answered for s, _ in done))
        for s, f in done:
            self.metrics.sentences.labels("ok").inc()
            self.metrics.generated_tokens.inc(len(f.tokens) + 1)
            if s.then is None or not self._taken_on(s, f):
                settle(s.future, result=f)
        return len(done)

    @staticmethod
    def _taken_on(s: Sentence, f: Finished) -> bool:
        """Whether the sentence's continuation (`Sentence.then`, set) took it on, settling its
        future later itself."""
        if s.future.done() or s.then is None:  # cancelled meanwhile
            return False
        try:
            return bool(s.then(f))
        except Exception:
            log.exception("a sentence's continuation failed; its caller goes on from its result")
            return False

    @staticmethod
    def _stream(batch: DecodeBatch, members: dict[Hashable, Sentence]) -> None:
        """Greedy batches: each streaming sentence's token of this step to its callback."""
        for key, tokens in batch.last_tokens().items():
            s = members.get(key)
            if s is not None and s.on_tokens is not None and not s.future.done():
                s.on_tokens(tokens)

    def _drop_cancelled(self, members: dict[Hashable, Sentence]) -> int:
        """Forget the sentences whose callers cancelled; how many."""
        gone = [k for k, s in members.items() if s.future.cancelled()]
        for k in gone:
            self.metrics.sentences.labels("cancelled").inc()
            del members[k]
        return len(gone)

    def _fail(self, sentences: list[Sentence], exc: BaseException) -> None:
        for s in sentences:
            self.metrics.sentences.labels("error").inc()
            settle(s.future, error=Internal(f"decoding failed: {type(exc).__name__}"))
        with self._cond:
            self._busy_rows -= sum(s.beam for s in sentences)

    def _run_encode(self, model: DecoderModel, jobs: list[EncodeJob]) -> None:
        live = [j for j in jobs if not j.future.cancelled()]
        if not live:
            return
        try:
            S = max(len(j.src_ids) for j in live)
            ids = np.zeros((len(live), S), dtype=np.int64)
            mask = np.zeros((len(live), S), dtype=np.int64)
            for i, j in enumerate(live):
                ids[i, : len(j.src_ids)] = j.src_ids
                mask[i, : len(j.src_ids)] = 1
            t0 = time.perf_counter()
            memory = model.encode(ids, mask)[0]  # (B, S, d_model)
            self.metrics.encoder_latency.observe(time.perf_counter() - t0)
            for i, j in enumerate(live):
                settle(j.future, result=np.array(memory[i, : len(j.src_ids)], dtype=np.float32))
        except Exception as exc:
            log.exception("encode batch failed")
            for j in live:
                settle(j.future, error=Internal(f"encoding failed: {type(exc).__name__}"))
