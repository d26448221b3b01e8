"""What the engine (and the server that starts and drains it) needs from whatever decodes its
sentences: the in-process scheduler (`service.batching.scheduler.Scheduler`) and the pool of
engine processes (`service.parallel.pool.EnginePool`) both provide it."""

from __future__ import annotations

from typing import Protocol

from service.batching.jobs import EncodeJob, Sentence


class Backend(Protocol):
    def start(self) -> None:
        """Start the decode workers (after the model is loaded, before the first request)."""

    def submit(self, sentences: list[Sentence]) -> None:
        """Queue sentences; each one's future is settled with a `Finished` or a `ServiceError`.
        Raises ResourceExhausted (queue full) or Unavailable (draining) for the whole group."""

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        """Queue texts for the encoder alone; each future gets the (S, d_model) states."""

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing decoding."""

    def stop_accepting(self) -> None:
        """Refuse new work with Unavailable (the drain after SIGTERM)."""

    def wait_idle(self, timeout: float) -> bool:
        """Block until idle or `timeout` seconds passed; True when idle."""

    def shutdown(self, timeout: float = 5.0) -> None:
        """Stop the decode workers; what is still queued fails with Unavailable."""
