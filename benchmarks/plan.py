"""What a benchmark run measures, by mode: sentences, beams, layouts and request counts (`Plan`),
and the online levels and connections every mode shares."""

from __future__ import annotations

from dataclasses import dataclass

LEVELS = [1, 8, 32, 64, 128]
MANY_LEVELS = [1, 64]  # TranslateMany: one stream carrying the same single-sentence requests
# Client connections of every online run (one per request at lower concurrency): a server's replicas
# (`--replicas`) are spread by connection, and one process serves 8 connections as fast as one.
CONNECTIONS = 8

# A layout of an offline engine: (decode loops, batch size).
Layout = tuple[int, int]


@dataclass(frozen=True)
class Plan:
    """One mode's sentences, layouts and request counts. Recorded in the results as a dict
    (`dataclasses.asdict`), so that a report can be written again from them."""

    limits: dict[str, int]  # sentences per offline engine ("default" for the others; 0 = all)
    beams: list[int]  # offline
    online_beams: list[int]  # online, batcher, sweep (the last), pairs, tracing (the last)
    latency_n: int  # single-sentence latency: sentences offline, requests at concurrency 1 in pairs
    online_requests: int  # requests per online level (at least `rounds` x its concurrency)
    rounds: int
    offline_layouts: dict[str, list[Layout]]  # by engine family: torch, ort, ct2
    sweep: list[list[str]]  # `mtserve serve` flags of each layout of the sweep
    sweep_levels: list[int]
    profile_seconds: int
    batcher_sentences: int
    pairs: int  # interleaved pairs per beam
    pair_sentences: int
    pair_requests: int
    continuous_batching: list[bool]  # the settings the online and batcher parts run
    tracing_requests: int  # c64 with tracing off and with every request traced
    tracing_pairs: int

    def limit(self, engine: str) -> int:
        """Sentences the offline engine translates (0 = all)."""
        return self.limits.get(engine, self.limits["default"])


def quick_plan() -> Plan:
    """The short mode (`--quick`, about 3 minutes): subsets, fewer requests."""
    return Plan(
        limits={"torch-eager": 12, "torch-cache": 64, "default": 200, "torch-eager-single": 12},
        beams=[1, 4],
        online_beams=[1, 4],
        latency_n=20,
        online_requests=100,
        rounds=2,
        offline_layouts={
            "ct2": [(2, 32), (1, 32), (2, 64)],
            "ort": [(2, 32), (2, 64)],
            "torch": [(1, 64)],
        },
        sweep=[
            ["--decode-workers", "1", "--intra-op-threads", "2"],
            ["--decode-workers", "2", "--intra-op-threads", "1", "--precision", "fp32"],
            ["--replicas", "2", "--decode-workers", "1"],
        ],
        sweep_levels=[1, 64],
        profile_seconds=8,
        batcher_sentences=400,
        pairs=3,
        pair_sentences=200,
        pair_requests=400,
        continuous_batching=[False],  # the server's default only
        tracing_requests=400,
        tracing_pairs=1,
    )


def full_plan() -> Plan:
    """Everything, all 1,000 test sentences."""
    worker_layouts = (
        ["--decode-workers", "1", "--intra-op-threads", "1"],
        ["--decode-workers", "1", "--intra-op-threads", "2"],
        ["--decode-workers", "2", "--intra-op-threads", "1"],
        ["--decode-workers", "4", "--intra-op-threads", "1"],
        ["--decode-workers", "2", "--intra-op-threads", "1", "--inter-op-threads", "2"],
        ["--replicas", "2", "--decode-workers", "1"],
    )
    return Plan(
        limits={"default": 0, "torch-eager-single": 200},
        beams=[1, 4],
        online_beams=[1, 4],
        latency_n=200,
        online_requests=1000,
        rounds=4,
        offline_layouts={
            "ct2": [(2, 32), (1, 32), (2, 64), (1, 64)],
            "ort": [(1, 32), (2, 32), (2, 64)],
            "torch": [(1, 64)],
        },
        sweep=[[*w, *p] for p in (["--precision", "fp32"], ["--precision", "int8"]) for w in worker_layouts],
        sweep_levels=[1, 64],
        profile_seconds=20,
        batcher_sentences=3000,
        pairs=5,
        pair_sentences=1000,
        pair_requests=1000,
        continuous_batching=[True, False],
        tracing_requests=1000,
        tracing_pairs=2,
    )


def plan(quick: bool) -> Plan:
    """Sentences, layouts and request counts of each mode."""
    return quick_plan() if quick else full_plan()


def served_layout(threads: int) -> list[str]:
    """The server's layout in the toy-size pairs: a replica per core with one decode worker each
    (the fastest measured at concurrency 64 there, where the Python front dominates a step:
    docs/performance.md), or the default on one core."""
    return ["--replicas", str(threads), "--decode-workers", "1"] if threads > 1 else []


def served_layout_real_size(threads: int) -> list[str]:
    """The server's layout at real size (benchmarks/real_size.py): one process, a decode worker per
    core sharing one session set, 1 intra-op thread each (the server's defaults at 2 threads). A
    step is 40-90 ms of ONNX Runtime with the GIL released there, so one process keeps the cores as
    busy as a replica per core does, with the weights in memory once. An idle worker waits up to
    50 ms for its share of the rows in flight, the rows it has just answered included: at c64 a
    finished batch's clients come back over tens of milliseconds, and a batch of 30 steps takes
    most of a second (benchmarks/real_size_layouts.py, docs/performance.md)."""
    return ["--decode-workers", str(threads), "--intra-op-threads", "1", "--max-queue-delay-ms", "50"]
