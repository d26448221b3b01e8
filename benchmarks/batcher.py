"""The batcher alone: `service.batching.scheduler.Scheduler` and its decode workers under closed-loop load
in this process, with no gRPC server, no protobuf and no load-generator process.

    python -m benchmarks.batcher --concurrency 64 --beam 1 [--continuous-batching]
        [--decode-workers 2] [--sentences 2000] [--precision int8] [--set compact_fraction=0.5 ...]
        [--json out.json]

`concurrency` sentences are in flight at all times: each one that is answered submits the next
test sentence (in test-set order, so lengths arrive mixed as they do online). The first
2 x concurrency answers warm up and are not counted. It prints sentences/s, CPU cores used, the
p50/p99 time from submit to answer, and from the server's own metrics the decoder steps: mean
rows per step, ms per step and µs per row-step.

Against `benchmarks/offline.py` (the same graphs, sentences sorted by length, no scheduler) and
`benchmarks/online.py` (the same scheduler behind gRPC, with the client on the same cores), this
tells how much of the service's gap to an offline engine comes from batching arrivals of mixed
length and how much from the RPC layer.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Literal

from benchmarks.figures import percentile, print_result
from service.batching.scheduler import Scheduler, Sentence
from service.decoding.output_rules import max_output_len
from service.metrics import Metrics
from service.runtime.gil import set_switch_interval
from service.runtime.loading import load_models
from service.runtime.memory import keep_freed_memory
from service.settings import Settings

REPO = Path(__file__).resolve().parent.parent


class ClosedLoop:
    """Keeps `concurrency` sentences in the scheduler until `n` are answered."""

    def __init__(
        self, scheduler: Scheduler, sources: list[list[int]], max_lens: list[int], beam: int, length_penalty: float
    ):
        self.scheduler, self.sources, self.max_lens = scheduler, sources, max_lens
        self.beam, self.length_penalty = beam, length_penalty
        self._next = 0
        self._lock = threading.Lock()

    def run(self, concurrency: int, n: int, timeout: float = 900.0) -> dict:
        latencies: list[float] = []
        errors: list[str] = []
        answered = threading.Event()
        state = {"started": 0, "done": 0}

        def submit() -> None:
            with self._lock:
                if state["started"] >= n:
                    return
                state["started"] += 1
                i = self._next % len(self.sources)
                self._next += 1
            s = Sentence(
                src_ids=self.sources[i], beam=self.beam, length_penalty=self.length_penalty, max_len=self.max_lens[i]
            )
            t0 = time.perf_counter()

            def done(f) -> None:
                if f.exception() is not None:
                    errors.append(type(f.exception()).__name__)
                latencies.append(time.perf_counter() - t0)
                with self._lock:
                    state["done"] += 1
                    last = state["done"] >= n
                if last:
                    answered.set()
                else:
                    submit()

            s.future.add_done_callback(done)
            self.scheduler.submit([s])

        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(min(concurrency, n)):
            submit()
        if not answered.wait(timeout):
            raise TimeoutError(f"{state['done']} of {n} sentences answered after {timeout} s")
        seconds = time.perf_counter() - t0
        latencies.sort()
        return {
            "sentences": n,
            "errors": len(errors),
            "seconds": round(seconds, 3),
            "sentences_per_s": round(n / seconds, 1),
            "cpu_cores": round((time.process_time() - cpu0) / seconds, 2),
            "p50_ms": round(1000 * percentile(latencies, 0.50), 1),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 1),
        }


def _sample(metrics: Metrics, name: str) -> float:
    return metrics.registry.get_sample_value(name, {"model": "batcher", "version": "1"}) or 0.0


def run(
    model_dir: str | Path,
    texts: list[str],
    concurrency: int,
    beam: int,
    sentences: int,
    continuous_batching: bool = False,
    decode_workers: int = 2,
    precision: Literal["fp32", "int8", "fp16"] = "int8",
    settings: dict | None = None,
) -> dict:
    """`settings`: further `Settings` fields (e.g. {"compact_fraction": 0.5})."""
    keep_freed_memory()  # as `mtserve serve` does
    st = Settings(
        model_dir=Path(model_dir),
        decode_workers=decode_workers,
        precision=precision,
        continuous_batching=continuous_batching,
        max_queue_size=max(1024, 2 * concurrency),
        **(settings or {}),
    )
    set_switch_interval(st.gil_switch_interval_ms)  # as `mtserve serve` does
    models = load_models(st)  # as the server loads them (shared session pair on the CPU by default)
    m, gen = models[0], models[0].manifest.generation
    limit = min(st.max_input_tokens, m.max_positions - 1)
    sources = [m.tokenizer.encode(t.strip())[: limit - 1] + [m.eos_id] for t in texts]
    max_lens = [
        min(st.max_output_tokens, max_output_len(len(s), gen.max_len_a, gen.max_len_b, m.max_positions))
        for s in sources
    ]
    metrics = Metrics()
    scheduler = Scheduler(models, st, metrics.for_model("batcher", "1"))
    scheduler.start()
    try:
        loop = ClosedLoop(scheduler, sources, max_lens, beam, gen.length_penalty)
        loop.run(concurrency, 2 * concurrency)  # warm-up
        steps0 = (
            _sample(metrics, "mtserve_decoder_step_duration_seconds_count"),
            _sample(metrics, "mtserve_decoder_step_duration_seconds_sum"),
            _sample(metrics, "mtserve_decoded_rows_total"),
        )
        row = loop.run(concurrency, sentences)
        steps = _sample(metrics, "mtserve_decoder_step_duration_seconds_count") - steps0[0]
        step_s = _sample(metrics, "mtserve_decoder_step_duration_seconds_sum") - steps0[1]
        rows = _sample(metrics, "mtserve_decoded_rows_total") - steps0[2]
    finally:
        scheduler.shutdown()
    row.update(
        {
            "concurrency": concurrency,
            "beam": beam,
            "continuous_batching": continuous_batching,
            "decode_workers": decode_workers,
            "precision": precision,
            "settings": settings or {},
            "decoder_steps": int(steps),
            "rows_per_step": round(rows / steps, 1) if steps else None,
            "ms_per_step": round(1000 * step_s / steps, 2) if steps else None,
            "us_per_row_step": round(1e6 * step_s / rows, 1) if rows else None,
        }
    )
    return row


def main() -> None:
    from export.data import DEFAULT_DATA_DIR, read_parallel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--sentences", type=int, default=2000, help="answered sentences that are timed")
    p.add_argument(
        "--continuous-batching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the scheduler's setting (default off, as the server's own default)",
    )
    p.add_argument("--decode-workers", type=int, default=2)
    p.add_argument("--precision", default="int8")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a further server setting, as MTSERVE_FIELD would set it (repeatable)",
    )
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    overrides = dict(kv.split("=", 1) for kv in args.set)
    texts, _ = read_parallel(args.data, "test_2016_flickr")
    row = run(
        args.model,
        texts,
        args.concurrency,
        args.beam,
        args.sentences,
        args.continuous_batching,
        args.decode_workers,
        args.precision,
        overrides,
    )
    print_result(row, args.json)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
