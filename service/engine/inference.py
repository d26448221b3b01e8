"""The per-model inference metrics of one request (what KServe ModelStatistics reads), recorded
as the request goes through its phases."""

from __future__ import annotations

import time

from service.batching.jobs import Sentence
from service.metrics import ModelMetrics


class Inference:
    """One inference request's phases (monotonic clock), recorded in the per-model metrics that
    KServe ModelStatistics reads: once it succeeded, its duration and that of each phase, which
    add up to it (compute_input: validation and tokenisation; queue: until its last sentence
    joined a decode batch; compute_infer: until its last sentence finished; compute_output:
    detokenisation); once it failed, its duration."""

    def __init__(self, metrics: ModelMetrics, model: str):
        self.metrics, self.model = metrics.server, model
        self.version = metrics.version
        self.start = self.submitted = self.computed = time.monotonic()
        self.admitted: float | None = None
        self.recorded = False

    def submit(self) -> None:
        self.submitted = time.monotonic()

    def compute_done(self, sentences: list[Sentence] | None = None) -> None:
        """The backend answered. Without admission stamps (an Encode request, or sentences decoded
        in an engine process, whose stamps stay there) the queue counts as 0, its time as compute."""
        self.computed = time.monotonic()
        stamps = [s.admitted for s in sentences or () if s.admitted is not None]
        if sentences and len(stamps) == len(sentences):
            self.admitted = min(max(max(stamps), self.submitted), self.computed)

    def succeeded(self, texts: int) -> None:
        end, m, model = time.monotonic(), self.metrics, (self.model, self.version)
        queued = self.submitted if self.admitted is None else self.admitted
        for phase, seconds in (
            ("compute_input", self.submitted - self.start),
            ("queue", queued - self.submitted),
            ("compute_infer", self.computed - queued),
            ("compute_output", end - self.computed),
        ):
            m.inference_phase.labels(*model, phase).observe(seconds)
        m.inference_duration.labels(*model, "success").observe(end - self.start)
        m.inferences.labels(*model).inc(texts)
        m.last_inference.labels(*model).set(time.time())
        self.recorded = True

    def failed(self) -> None:
        if not self.recorded:
            model = (self.model, self.version)
            self.metrics.inference_duration.labels(*model, "failure").observe(time.monotonic() - self.start)
            self.metrics.last_inference.labels(*model).set(time.time())
            self.recorded = True
