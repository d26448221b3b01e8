"""Typed server settings: environment variables with the `MTSERVE_` prefix (e.g.
`MTSERVE_MAX_BATCH_SENTENCES=32`), overridden by `mtserve serve` flags. Every limit the server
enforces is one of these fields."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MTSERVE_", extra="ignore")

    # Where and what
    address: str = Field("0.0.0.0:50051", description="gRPC listen address host:port")
    model_repository: Path = Field(
        Path("models"),
        description="model repository in Triton's layout, NAME/VERSION/ (config.json, tokenizer.json, onnx/)",
    )
    models: str = Field(
        "",
        description="comma-separated models to load at start (NAME or NAME:VERSION); empty: the latest "
        "version of every model in the repository",
    )
    default_model: str = Field(
        "",
        description="the model of requests that name none (NAME, or NAME:VERSION to pick its default version too); "
        "empty: the first model loaded at start",
    )
    memory_budget_mb: int = Field(
        0,
        ge=0,
        description="the memory the loaded model versions may take together (each one's RSS growth across its "
        "load), in MiB: a version that does not fit at start is loaded on its first request, and a load that "
        "needs room evicts the least recently used versions without requests in flight; 0: no budget "
        '(every model is loaded at start but those with "load": "on_demand" in NAME/serving.json)',
    )
    repository_control: bool = Field(
        True,
        description="KServe RepositoryModelLoad/Unload (bearer token required when authentication is on); "
        "off: both answer PERMISSION_DENIED",
    )
    model_dir: Path | None = Field(
        None,
        description="serve this one model dir (config.json, tokenizer.json, onnx/) instead of the repository, "
        "under its manifest's name",
    )
    onnx_dir: Path | None = Field(None, description="exported graphs; default MODEL_DIR/onnx")
    provider: Literal["auto", "cuda", "cpu"] = Field("auto", description="ONNX Runtime execution provider")
    strict_provider: bool = Field(False, description="exit instead of falling back to CPU when CUDA is missing")
    precision: Literal["fp32", "int8", "fp16"] = Field(
        "int8", description="graph variant to load: int8 (CPU; the BLEU of fp32, 1.5-2.5x its speed), fp32, fp16 (CUDA)"
    )
    graph: Literal["auto", "fused", "portable"] = Field(
        "auto",
        description="decoder step: fused (contrib operators over an in-place cache, export/fused/), portable "
        "(the torch export, any execution provider), or auto: fused where the export has it for the provider",
    )
    shortlist: bool = Field(
        True,
        description="rank the output layer over the version's vocabulary shortlist where it has one (`mtserve "
        "shortlist`; fused graph only); off: the whole vocabulary. Per model in NAME/serving.json",
    )

    # Thread layout: `decode_workers` decode loops, each running its batches through ONNX Runtime
    # with `intra_op_threads` threads. On the CPU they share one session pair (one copy of the
    # weights; ONNX Runtime sessions take concurrent runs) unless `share_sessions` is off.
    replicas: int = Field(
        1,
        ge=1,
        le=64,
        description="server processes sharing the gRPC port (SO_REUSEPORT, Linux), each a whole server with "
        "its own GIL, event loop and decode workers: the kernel spreads client connections over them, a "
        "supervisor restarts one that dies and serves their /metrics with a replica label (service/replicas.py)",
    )
    decode_workers: int = Field(2, ge=1, le=64)
    intra_op_threads: int = Field(1, ge=1, le=256)
    inter_op_threads: int = Field(1, ge=1, le=256)
    engine_process: bool = Field(
        False,
        description="run each decode worker in a child process of its own "
        "(its own GIL and sessions; a crash there fails only its requests and the child is "
        "restarted) instead of threads of the server process",
    )
    gil_switch_interval_ms: float = Field(
        1.0,
        gt=0,
        le=100,
        description="how long a thread that wants Python's GIL waits before the holder must drop it "
        "(sys.setswitchinterval; Python's default is 5 ms): decode workers take the GIL back after every "
        "step, so a shorter wait keeps them busy while the event loop serves RPCs",
    )
    share_sessions: bool = Field(
        True,
        description="CPU: decode workers share one ONNX Runtime session pair (the "
        "weights in memory once) instead of a pair each; CUDA keeps a pair per worker",
    )

    # Batching
    continuous_batching: bool = Field(
        False,
        description="admit new sentences into running batches between decode "
        "steps (off: a worker takes the waiting sentences when its batches finish, "
        "which measured faster at every concurrency from 8 up here, docs/performance.md)",
    )
    # The three batching limits below: where neither these settings (an MTSERVE_* variable, a flag)
    # nor the model's serving.json set one, the server derives it at load from the model's decoder
    # step cost on this machine (service/batching/calibration.py); the defaults here apply only where
    # nothing is measured (engine processes, a custom backend).
    max_batch_sentences: int = Field(
        64, ge=1, description="rows of one decode batch (beam rows count each); unset: derived at load"
    )
    max_batch_tokens: int = Field(
        4096, ge=16, description="padded source tokens of one decode batch; unset: derived at load"
    )
    max_queue_delay_ms: float = Field(
        0.0,
        ge=0,
        description="an idle worker waits up to this long, from when it starts waiting, for its "
        "share of the rows in flight before starting a batch, counting rows answered within this "
        "time as about to come back (closed-loop clients); 0: it starts at once (with continuous "
        "batching a burst joins at the next step anyway); unset: derived at load from the decoder "
        "step's cost (a few mid-size steps, 1 to 100 ms)",
    )
    admit_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="a running batch admits waiting sentences once they "
        "number this fraction of its own sentences (or admit_delay_ms passed); 0: every step",
    )
    admit_delay_ms: float = Field(
        20.0,
        ge=0,
        description="the longest a sentence waits for a running batch to admit "
        "it when fewer than admit_fraction are waiting",
    )
    compact_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="a running batch drops finished rows once they "
        "are this fraction of its rows (and whenever it admits); 0: every step",
    )
    max_queue_size: int = Field(
        2048,
        ge=1,
        description="sentences waiting for a batch; beyond: RESOURCE_EXHAUSTED (a request of more sentences than "
        "this could never be queued: INVALID_ARGUMENT)",
    )

    # Per-request limits
    max_texts_per_request: int = Field(64, ge=1)
    max_input_tokens: int = Field(200, ge=1, description="subword tokens of one source text")
    max_output_tokens: int = Field(200, ge=1, description="generated tokens of one text")
    max_text_bytes: int = Field(100_000, ge=1, description="UTF-8 bytes of one source text")
    max_request_bytes: int = Field(
        1_048_576,
        ge=1,
        description="UTF-8 bytes of all the texts and target prefixes of one request (a TranslateMany item)",
    )
    max_glossary_terms: int = Field(
        256,
        ge=0,
        description="options.glossary entries and options.do_not_translate phrases of one request together "
        "(a named glossary's terms not counted); more: INVALID_ARGUMENT",
    )
    text_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="threads that split, tokenise and reassemble the texts of requests of more than 4 kB, off "
        "the event loop (service/engine/work.py)",
    )
    text_processes: int = Field(
        1,
        ge=0,
        le=64,
        description="worker processes, at nice 19, that split and tokenise the texts of Translate requests of more "
        "than 4 kB (service/engine/plan_processes.py); 0: the text threads do it",
    )
    max_beam_size: int = Field(8, ge=1)
    default_beam_size: int = Field(4, ge=1)
    max_receive_message_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_stream_in_flight: int = Field(
        256,
        ge=1,
        description="TranslateMany: items of one stream read ahead of "
        "their answers; the server stops reading the stream until one is answered",
    )

    # Language detection (service/runtime/language_id.py, docs/language_detection.md)
    detection_threshold: float = Field(
        0.9,
        ge=0,
        le=1,
        description='source_language "auto": the probability, among the served source languages, that a text\'s '
        "best language needs; below it the text is refused (INVALID_ARGUMENT naming source_language with the "
        "top candidates and their scores), never guessed. 0.9 kept 99.9 percent of multi30k's de/en/fr sentences of "
        "20+ characters, all of them right (docs/language_detection.md)",
    )

    # Lifecycle and observability
    grace_period_s: float = Field(20.0, ge=0, description="time to finish in-flight work after SIGTERM")
    drain_quiet_s: float = Field(
        0.25,
        ge=0,
        le=5,
        description="after SIGTERM, how long no RPC may arrive before the listener closes (within the grace "
        "period): gRPC cancels calls that reach it while it closes, so late ones are answered UNAVAILABLE first",
    )
    metrics_port: int = Field(9090, ge=0, le=65535, description="Prometheus /metrics port; 0 = off")
    metrics_address: str = Field("0.0.0.0")
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    # Security (docs/security.md): TLS, mutual TLS, bearer tokens. Off by default.
    tls_cert_file: Path | None = Field(None, description="PEM server certificate (chain); with tls_key_file: serve TLS")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file")
    tls_client_ca_file: Path | None = Field(None, description="PEM CA bundle: require client certificates signed by it")
    auth_tokens_file: Path | None = Field(
        None,
        description="accepted bearer tokens, one per line: require `authorization: Bearer TOKEN` (health stays open)",
    )
    auth_token: SecretStr | None = Field(
        None, description="one accepted bearer token (prefer auth_tokens_file: flags are visible in ps)"
    )

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.default_beam_size > self.max_beam_size:
            raise ValueError(
                f"default_beam_size ({self.default_beam_size}) exceeds max_beam_size ({self.max_beam_size})"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together: give both or neither")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_client_ca_file (mutual TLS) needs tls_cert_file and tls_key_file")
        return self

    @property
    def graphs_dir(self) -> Path:
        """The graphs of the one model these settings load (the server gives each version a copy
        with its own model_dir)."""
        if self.onnx_dir is not None:
            return self.onnx_dir
        if self.model_dir is None:
            raise ValueError("model_dir is not set: these settings name no single model")
        return self.model_dir / "onnx"

    @property
    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]

    @property
    def admit_delay_s(self) -> float:
        return self.admit_delay_ms / 1000.0

    @property
    def max_queue_delay_s(self) -> float:
        return self.max_queue_delay_ms / 1000.0
