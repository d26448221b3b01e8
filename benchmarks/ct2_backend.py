"""CTranslate2 behind mtserve's own front: a `service.engine.backend.Backend` on a
`ctranslate2.Translator`, so that the same server (gRPC servicers, interceptors, the Engine's
validation, tokenisation and limits) decodes with CTranslate2 instead of the ONNX Runtime
scheduler. `benchmarks/ct2_server.py` starts it as a process; `benchmarks/run.py` measures it next
to `mtserve serve`: what a user would get deploying CTranslate2 behind a server.

Batching is CTranslate2's own, the way it is meant to be served: one worker thread per translator
replica (`inter_threads`), each taking the sentences waiting (the oldest one's decoding mode, at most
`max_batch` sentences: its share of the waiting when other workers are idle) and translating them in
one `translate_batch` call, which releases the GIL while CTranslate2 decodes them (its own padding,
beam search and early exit of finished rows). A sentence is answered when its call returns.

As `service.batching.scheduler.Scheduler` does: a bounded queue (`ResourceExhausted` beyond
`max_queue_size`), `Unavailable` once draining, sentences whose deadline passed while queued fail
with `DeadlineExceeded`, cancelled ones are dropped before their call, each sentence settles with a
`service.decoding.results.Finished` (no alignment), and greedy streams get their tokens as
CTranslate2 emits them. CTranslate2 exposes no encoder states: Encode is refused (`Unavailable`).
"""

from __future__ import annotations

import logging
import math
import threading
import time

from benchmarks.ct2_convert import Ct2Translator
from service.batching.jobs import EncodeJob, Sentence, settle
from service.batching.queue import SentenceQueue
from service.decoding.results import Finished
from service.errors import Internal, Unavailable
from service.metrics import ModelMetrics
from service.settings import Settings

log = logging.getLogger("mtserve.ct2")

ENCODE_REFUSED = (
    "Encode is not served by this server: it decodes with CTranslate2, which exposes no encoder "
    "states (Encode needs an ONNX Runtime server, `mtserve serve`)"
)


class Ct2Backend(SentenceQueue):
    """The decode workers of a CTranslate2-served server (see the module docstring)."""

    provider = "cpu (CTranslate2)"

    def __init__(self, ct2: Ct2Translator, settings: Settings, metrics: ModelMetrics, max_batch: int | None = None):
        super().__init__(settings, metrics)
        self.ct2 = ct2
        self.workers = ct2.inter_threads  # one caller per translator replica
        self.max_batch = max_batch or settings.max_batch_sentences  # sentences per translate_batch call
        self._running = 0  # workers inside translate_batch
        self._busy = 0  # sentences taken and not answered yet

    # -- caller side (event loop thread) ------------------------------------------------

    def start(self) -> None:
        for i in range(self.workers):
            t = threading.Thread(target=self._worker, name=f"ct2-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        raise Unavailable(ENCODE_REFUSED)

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._queue and self._busy == 0

    # -- worker side ---------------------------------------------------------------------

    def _take(self) -> list[Sentence]:
        """Pop the next call's sentences (lock held): the oldest live sentence's mode, at most
        `max_batch`, only this worker's share of them when other workers are idle, and at most its
        share of all the sentences in flight (the rule of mtserve's scheduler for static batches)."""
        now = time.monotonic()
        live = self._live(now)
        if not live:
            return []
        mode = live[0].mode
        same = [s for s in live if s.mode == mode]
        idle_workers = self.workers - self._running  # this one included
        share = min(math.ceil(len(same) / idle_workers), math.ceil((self._busy + len(live)) / self.workers))
        return self._pop(same[: min(self.max_batch, share)], now)

    def _worker(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                if self.settings.max_queue_delay_s > 0 and len(self._queue) < self.max_batch:
                    # An idle worker waits a moment for company, so that a burst shares one call.
                    self._cond.wait(self.settings.max_queue_delay_s)
                batch = self._take()
                self._busy += len(batch)
                self._running += bool(batch)
            if not batch:
                continue
            try:
                self._translate(batch)
            finally:
                with self._cond:
                    self._busy -= len(batch)
                    self._running -= 1

    def _translate(self, batch: list[Sentence]) -> None:
        beam, lp = batch[0].mode
        streams = {i: s.on_tokens for i, s in enumerate(batch) if s.on_tokens is not None}
        callback = None
        if beam == 1 and streams:
            limits = [s.max_len for s in batch]

            def callback(step) -> bool:  # called by CTranslate2 for each token of each row
                send = streams.get(step.batch_id)
                if (
                    send is not None
                    and step.step < limits[step.batch_id] - 1
                    and not batch[step.batch_id].future.done()
                ):
                    send([step.token_id])
                return False

        src = [s.src_ids for s in batch]
        self.metrics.input_tokens.inc(sum(map(len, src)))
        self.metrics.batch_rows.observe(beam * len(batch))
        try:
            out = self.ct2.translate_limited(
                src,
                [s.max_len for s in batch],
                beam=beam,
                length_penalty=lp,
                batch_size=len(batch),
                return_scores=any(s.want_scores for s in batch),  # as the requests ask, like mtserve
                callback=callback,
            )
        except Exception as exc:
            log.exception("translate_batch failed for %d sentences", len(batch))
            for s in batch:
                self.metrics.sentences.labels("error").inc()
                settle(s.future, error=Internal(f"decoding failed: {type(exc).__name__}"))
            return
        for s, (ids, score) in zip(batch, out):
            if s.future.cancelled():
                self.metrics.sentences.labels("cancelled").inc()
                continue
            log_prob = None if score is None else float(score) * (len(ids) + 1) ** (lp if beam > 1 else 0.0)
            self.metrics.sentences.labels("ok").inc()
            self.metrics.generated_tokens.inc(len(ids) + 1)
            settle(
                s.future,
                result=Finished(
                    key=s.key,
                    tokens=ids,
                    score=None if score is None else float(score),
                    log_prob=log_prob,
                    alignment=None,
                    steps=len(ids) + 1,
                ),
            )
