"""Prometheus metrics (prometheus-client), served on their own port. Names follow Prometheus
conventions: base units, `_seconds`, `_total`. Documented in docs/metrics.md."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    Summary,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.metrics import MetricWrapperBase

# No `*_created` series beside every counter, histogram and summary: they roughly double a scrape,
# and no dashboard or alert reads them (rate() and increase() need none). Process-wide, so the
# engine processes' metrics lose them too.
disable_created_metrics()

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKEN_BUCKETS = (1, 4, 8, 16, 32, 64, 128, 256, 512)
# Every metric with a model in play carries these: the served name and version (Triton's layout,
# NAME/VERSION/), so one dashboard tells the models and their versions apart.
MODEL_LABELS = ("model", "version")


class Metrics:
    """All of the server's metrics, on one registry (a fresh one per server, so tests can run
    several servers in one process)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = r = registry or CollectorRegistry()
        self._add_rpc_metrics(r)
        self._add_queue_metrics(r)
        self._add_decoding_metrics(r)
        self._add_inference_metrics(r)
        self._add_detection_metrics(r)
        self._add_residency_metrics(r)

    def _add_rpc_metrics(self, r: CollectorRegistry) -> None:
        """Per RPC method: calls, their latency and those in flight."""
        self.requests = Counter(
            "mtserve_requests_total", "RPCs handled, by method and status code", ["method", "code"], registry=r
        )
        self.request_latency = Histogram(
            "mtserve_request_duration_seconds",
            "RPC latency, by method and status code",
            ["method", "code"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge("mtserve_requests_in_flight", "RPCs being handled", ["method"], registry=r)

    def _add_queue_metrics(self, r: CollectorRegistry) -> None:
        """Per model version: the sentences waiting for a decode batch, and the first streamed chunk."""
        self.queue_wait = Histogram(
            "mtserve_queue_wait_seconds",
            "time a sentence waited before joining a batch",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge("mtserve_queue_depth", "sentences waiting for a batch", MODEL_LABELS, registry=r)
        self.queue_capacity = Gauge(
            "mtserve_queue_capacity",
            "max_queue_size: queued sentences before RESOURCE_EXHAUSTED",
            MODEL_LABELS,
            registry=r,
        )
        self.time_to_first_chunk = Histogram(
            "mtserve_time_to_first_chunk_seconds",
            "TranslateStream: time from request to the first chunk",
            MODEL_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

    def _add_decoding_metrics(self, r: CollectorRegistry) -> None:
        """Per model version: what the encoder and the decoder computed, and the version's info."""
        self.batch_rows = Histogram(
            "mtserve_decode_batch_rows",
            "rows (sentences x beams) in each decode step",
            MODEL_LABELS,
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.encoder_latency = Histogram(
            "mtserve_encoder_duration_seconds",
            "one encoder run (a batch of sentences)",
            MODEL_LABELS,
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.decoder_step_latency = Histogram(
            "mtserve_decoder_step_duration_seconds",
            "one decoder step of a batch",
            MODEL_LABELS,
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.input_tokens = Counter(
            "mtserve_input_tokens_total", "source subword tokens accepted", MODEL_LABELS, registry=r
        )
        self.generated_tokens = Counter(
            "mtserve_generated_tokens_total",
            "target tokens of finished translations (</s> included)",
            MODEL_LABELS,
            registry=r,
        )
        self.decoded_rows = Counter(
            "mtserve_decoded_rows_total",
            "row-steps computed by the decoder (sentences x beams x steps)",
            MODEL_LABELS,
            registry=r,
        )
        self.padding_ratio = Histogram(
            "mtserve_padding_ratio",
            "share of padding in each decoder step's source tensors",
            MODEL_LABELS,
            buckets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0),
            registry=r,
        )
        self.sentences = Counter(
            "mtserve_sentences_total", "sentences finished, by outcome", [*MODEL_LABELS, "outcome"], registry=r
        )
        self.texts = Counter("mtserve_texts_total", "texts accepted for translation", MODEL_LABELS, registry=r)
        self.text_types = Counter(
            "mtserve_text_types_total",
            "texts accepted for translation, by text_type (text, html, xml)",
            [*MODEL_LABELS, "text_type"],
            registry=r,
        )
        self.text_segments = Histogram(
            "mtserve_text_segments",
            "segments (sentences, or lines) of each text accepted for translation",
            MODEL_LABELS,
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.split_rows = Counter(
            "mtserve_split_rows_total",
            "rows added by splitting texts into segments and over-long sentences into parts",
            MODEL_LABELS,
            registry=r,
        )
        self.glossary_terms_applied = Counter(
            "mtserve_glossary_terms_applied_total",
            "glossary terms and do-not-translate phrases placed in translations, by origin "
            "(glossary, do_not_translate, markup or the named glossary's id)",
            [*MODEL_LABELS, "origin"],
            registry=r,
        )
        self.model_info = Info("mtserve_model", "each model version being served", MODEL_LABELS, registry=r)
        self.default_model = Gauge(
            "mtserve_default_model",
            "1 for the default model (requests that name none go to it), 0 for the model that was it before",
            ["model"],
            registry=r,
        )

    def _add_inference_metrics(self, r: CollectorRegistry) -> None:
        # Per model (the translation model and the encoder model, whichever API called them): what
        # KServe ModelStatistics reports, read back from these (`model_statistics`).
        self.inference_duration = Summary(
            "mtserve_inference_request_duration_seconds",
            "inference requests by model and outcome (success, failure): from their arrival at the engine to their results",
            [*MODEL_LABELS, "outcome"],
            registry=r,
        )
        self.inference_phase = Summary(
            "mtserve_inference_phase_duration_seconds",
            "successful inference requests by model: time in each phase (queue, compute_input, compute_infer, compute_output)",
            [*MODEL_LABELS, "phase"],
            registry=r,
        )
        self.inferences = Counter(
            "mtserve_inferences_total", "texts of successful inference requests, by model", MODEL_LABELS, registry=r
        )
        self.last_inference = Gauge(
            "mtserve_last_inference_timestamp_seconds",
            "Unix time of the last inference request's end, by model",
            MODEL_LABELS,
            registry=r,
        )

    def _add_detection_metrics(self, r: CollectorRegistry) -> None:
        """source_language "auto" (service/repository/routing.py): each text's (or segment's)
        detected language, and "undecided" for each one below the detection threshold."""
        self.language_detections = Counter(
            "mtserve_language_detections_total",
            'texts (and segments, with detect_per_segment) of source_language "auto" requests by detected '
            'language; "undecided": below the detection threshold',
            ["language"],
            registry=r,
        )

    def _add_residency_metrics(self, r: CollectorRegistry) -> None:
        """Per model version: its loads (at start, on demand, RepositoryModelLoad), their time,
        its evictions under the memory budget and what it takes while loaded
        (service/repository/residency.py). Kept across unloads, but the resident bytes."""
        self.model_loads = Counter(
            "mtserve_model_loads_total",
            "loads of a model version, by outcome (loaded, failed)",
            [*MODEL_LABELS, "outcome"],
            registry=r,
        )
        self.model_evictions = Counter(
            "mtserve_model_evictions_total",
            "model versions evicted (least recently used) to make room under memory_budget_mb",
            MODEL_LABELS,
            registry=r,
        )
        self.model_resident_bytes = Gauge(
            "mtserve_model_resident_bytes",
            "what a loaded model version takes, as its load measured it: the RSS it grew, or the allocator's bytes in use it added, whichever is more",
            MODEL_LABELS,
            registry=r,
        )
        self.model_load_duration = Histogram(
            "mtserve_model_load_duration_seconds",
            "a model version's load (cold start: sessions, warm-up) until it serves, successful loads",
            MODEL_LABELS,
            buckets=LOAD_BUCKETS,
            registry=r,
        )

    def for_model(self, name: str, version: str) -> ModelMetrics:
        """The metrics of one served model version, its labels filled in."""
        return ModelMetrics(self, name, version)

    def forget_model(self, name: str, version: str) -> None:
        """Drop an unloaded version's series (its gauges would otherwise keep their last values)."""
        for metric in MODEL_SCOPED:
            m = getattr(self, metric)
            for labels in list(_children(m)):
                if labels[:2] == (name, version):
                    m.remove(*labels)
        if (name, version) in _children(self.model_resident_bytes):
            self.model_resident_bytes.remove(name, version)
        for kserve_name in (name, f"{name}-encoder"):
            for metric in ("inference_duration", "inference_phase", "inferences", "last_inference"):
                m = getattr(self, metric)
                for labels in list(_children(m)):
                    if labels[:2] == (kserve_name, version):
                        m.remove(*labels)

    def model_statistics(self) -> dict[tuple[str, str], ModelStatistics]:
        """The per-model inference metrics by (model, version), as a scrape would read them (in
        engine processes too: the children's decoder steps are fetched, which blocks on their pipes)."""
        stats: dict[tuple[str, str], ModelStatistics] = {}
        phases = {"queue", "compute_input", "compute_infer", "compute_output"}
        steps: dict[tuple[str, str], float] = {}
        for family in self.registry.collect():
            for s in family.samples:
                model, version = s.labels.get("model"), s.labels.get("version", "")
                if model is None:
                    continue
                key = (model, version)
                if s.name == "mtserve_decoder_step_duration_seconds_count":
                    steps[key] = steps.get(key, 0.0) + s.value
                    continue
                kind = "count" if s.name.endswith("_count") else "sum" if s.name.endswith("_sum") else None
                if family.name == "mtserve_inference_request_duration_seconds" and kind:
                    getattr(stats.setdefault(key, ModelStatistics()), s.labels["outcome"])[kind] += s.value
                elif family.name == "mtserve_inference_phase_duration_seconds" and kind:
                    if s.labels["phase"] in phases:
                        st = stats.setdefault(key, ModelStatistics())
                        st.phases.setdefault(s.labels["phase"], {"count": 0.0, "sum": 0.0})[kind] += s.value
                elif s.name == "mtserve_inferences_total":
                    stats.setdefault(key, ModelStatistics()).inferences += s.value
                elif s.name == "mtserve_last_inference_timestamp_seconds":
                    st = stats.setdefault(key, ModelStatistics())
                    st.last_inference = max(st.last_inference, s.value)
        for key, n in steps.items():
            stats.setdefault(key, ModelStatistics()).decoder_steps = n
        return stats

    def serve(self, port: int, address: str = "0.0.0.0") -> tuple[WSGIServer, threading.Thread]:
        """Start the /metrics HTTP endpoint; returns (server, thread)."""
        return start_http_server(port, addr=address, registry=self.registry)


@dataclass
class ModelStatistics:
    """One model's inference metrics: counts, and sums in seconds."""

    success: dict[str, float] = field(default_factory=lambda: {"count": 0.0, "sum": 0.0})
    failure: dict[str, float] = field(default_factory=lambda: {"count": 0.0, "sum": 0.0})
    phases: dict[str, dict[str, float]] = field(default_factory=dict)  # phase -> {"count", "sum"}
    inferences: float = 0.0
    last_inference: float = 0.0  # Unix time; 0 = none
    decoder_steps: float = 0.0  # the model version's decoder steps (the translation model's executions)


# The metrics a decode backend updates, one series per model version (engine processes update
# them in the child, see service/parallel/child_metrics.py).
MODEL_SCOPED = (
    "queue_wait",
    "queue_depth",
    "queue_capacity",
    "time_to_first_chunk",
    "batch_rows",
    "encoder_latency",
    "decoder_step_latency",
    "input_tokens",
    "generated_tokens",
    "decoded_rows",
    "padding_ratio",
    "sentences",
)


def _children(metric: MetricWrapperBase) -> list[tuple[str, ...]]:
    with metric._lock:
        return [tuple(labels) for labels in metric._metrics]


class _Partial:
    """A labelled metric with the model's labels filled in; `labels(*rest)` names the others."""

    def __init__(self, metric: Counter, values: tuple[str, ...]):
        self.metric, self.values = metric, values

    def labels(self, *rest: str) -> Counter:
        return self.metric.labels(*self.values, *rest)


class ModelMetrics:
    """One served model version's view of the server's metrics: what the scheduler and the engine
    update, with `model` and `version` filled in. `server` is the whole set (RPC metrics)."""

    def __init__(self, metrics: Metrics, name: str, version: str):
        self.server, self.name, self.version = metrics, name, version
        self.registry = metrics.registry
        v = (name, version)
        self.queue_wait = metrics.queue_wait.labels(*v)
        self.queue_depth = metrics.queue_depth.labels(*v)
        self.queue_capacity = metrics.queue_capacity.labels(*v)
        self.time_to_first_chunk = metrics.time_to_first_chunk.labels(*v)
        self.batch_rows = metrics.batch_rows.labels(*v)
        self.encoder_latency = metrics.encoder_latency.labels(*v)
        self.decoder_step_latency = metrics.decoder_step_latency.labels(*v)
        self.input_tokens = metrics.input_tokens.labels(*v)
        self.generated_tokens = metrics.generated_tokens.labels(*v)
        self.decoded_rows = metrics.decoded_rows.labels(*v)
        self.padding_ratio = metrics.padding_ratio.labels(*v)
        self.sentences = _Partial(metrics.sentences, v)
        self.texts = metrics.texts.labels(*v)
        self.text_types = _Partial(metrics.text_types, v)
        self.text_segments = metrics.text_segments.labels(*v)
        self.split_rows = metrics.split_rows.labels(*v)
        self.glossary_terms_applied = _Partial(metrics.glossary_terms_applied, v)
        self.model_info = metrics.model_info.labels(*v)
