"""Decode workers in child processes, behind the Scheduler interface.

With `engine_process`, `EnginePool` starts one child process per decode worker. Each child owns
its ONNX Runtime sessions and a Scheduler with one worker thread (service.parallel.child). The
gRPC process keeps validation, tokenisation and the RPCs, and talks to each child over a pipe, as
vLLM's engine core runs apart from its API server.

Two things follow. No decode loop shares a GIL with another or with the gRPC event loop. And a
crash in a child (a native fault in ONNX Runtime, the kernel's OOM killer) fails only the
requests in flight there: that child is restarted and the server keeps serving.

It is off by default. On the 2-core development machine it measured no consistent throughput
gain (docs/performance.md), and it costs a copy of each sentence and result over a pipe and a
copy of the weights per child.

`EnginePool` (and each `EngineProcess`, one child: service/parallel/engine_process.py) is what `service.engine.engine.Engine` and
`service.server.Server` see: submit(), submit_encode(), stop_accepting(), wait_idle(), shutdown(),
idle. Each Sentence and EncodeJob keeps its future in this process, under a key; the child settles
its own copy and sends the outcome back under the same key, in the messages of
service.parallel.messages. A reader thread per child settles the futures. It survives a message it
cannot handle (logged) and ignores one it has no case for; one it cannot unpickle means the pipe
can no longer be trusted, so the child is killed and replaced.

The children's metrics (queue, batches, steps, sentences) are fetched at each scrape and summed
(service/parallel/child_metrics.py).
If a child dies, its unanswered sentences fail with INTERNAL and a new child is started.
"""

from __future__ import annotations

import time

from service.batching.jobs import EncodeJob, Sentence
from service.errors import ModelLoadError
from service.metrics import ModelMetrics
from service.parallel.child_metrics import forget_child_metrics, serve_child_metrics
from service.parallel.engine_process import EngineProcess
from service.settings import Settings


class EnginePool:
    """`decode_workers` engine processes with one decode worker each, behind the Scheduler
    interface: no two decode loops share a GIL. Each request goes to the child with the fewest
    unanswered rows; each child has 1/N of max_queue_size."""

    def __init__(self, settings: Settings, metrics: ModelMetrics, start_timeout: float = 300.0):
        n = settings.decode_workers
        per_child = settings.model_copy(
            update={"decode_workers": 1, "max_queue_size": max(1, -(-settings.max_queue_size // n))}
        )
        self.settings, self.metrics = settings, metrics
        labels = (metrics.name, metrics.version)
        self.children = [EngineProcess(per_child, start_timeout, labels) for _ in range(n)]
        serve_child_metrics(metrics.server, self.children)
        self.provider, self.sessions = "cpu", 0

    def start_process(self) -> None:
        for c in self.children:
            c.spawn()
        errors_seen = []
        for c in self.children:
            try:
                c.wait_ready()
            except ModelLoadError as e:
                errors_seen.append(e)
        if errors_seen:
            self.shutdown()
            raise errors_seen[0]
        self.provider = self.children[0].provider
        self.sessions = sum(c.sessions for c in self.children)

    def start(self) -> None:
        if any(not c.started for c in self.children):
            self.start_process()

    def _least_loaded(self) -> EngineProcess:
        return min(self.children, key=lambda c: c.load)

    def submit(self, sentences: list[Sentence]) -> None:
        self._least_loaded().submit(sentences)

    def submit_encode(self, jobs: list[EncodeJob]) -> None:
        self._least_loaded().submit_encode(jobs)

    def stop_accepting(self) -> None:
        for c in self.children:
            c.stop_accepting()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(c.wait_idle(max(0.0, end - time.monotonic())) for c in self.children)

    @property
    def idle(self) -> bool:
        return all(c.idle for c in self.children)

    @property
    def queue_depth(self) -> int:
        return sum(c.queue_depth for c in self.children)

    def shutdown(self, timeout: float = 5.0) -> None:
        for c in self.children:  # all children stop at once, then each is joined
            c.request_shutdown()
        for c in self.children:
            c.shutdown(timeout)
        forget_child_metrics(self.metrics.server, self.children)
