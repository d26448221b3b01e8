"""The parts of a benchmark run turned into one `Summary` per beam (the targets' ratios and the
figures they divide), and the last line's JSON object (`headline`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, TypedDict

# A run's results as benchmarks/run.py records them (and reads them back with --report): parts
# by name, rows as the scripts print them.
Results = dict[str, Any]
Row = dict[str, Any]


class Summary(TypedDict):
    """One beam's figures: the best samples of the online, batcher and offline parts, the medians
    of the interleaved pairs, and the ratios between them (None: not measured)."""

    beam: int
    service_c64_sentences_per_s: float | None
    service_c1_p50_ms: float | None
    service_many_c64_sentences_per_s: float | None
    ct2_int8_sentences_per_s: float | None
    ct2_int8_layout: str | None
    ct2_single_p50_ms: float | None
    ort_int8_sentences_per_s: float | None
    ort_int8_layout: str | None
    batcher_c64_sentences_per_s: float | None
    torch_eager_sentences_per_s: float | None
    # The targets' ratios: the median of the interleaved pairs when they ran (else, for results of
    # older runs, the best samples of the separate parts).
    service_over_ct2_int8: float | None
    latency_c1_over_ct2: float | None
    pairs: int
    pairs_service_c64_sentences_per_s: float | None
    pairs_ct2_int8_sentences_per_s: float | None
    pairs_service_c1_p50_ms: float | None
    pairs_ct2_single_p50_ms: float | None
    # The ORT engine offline and the CTranslate2-served server against CTranslate2 (medians of the
    # pairs that measured them).
    engine_over_ct2_int8: float | None
    engine_latency_over_ct2: float | None
    service_over_ct2_served: float | None
    latency_c1_over_ct2_served: float | None
    pairs_engine_sentences_per_s: float | None
    pairs_engine_single_p50_ms: float | None
    pairs_ct2_served_c64_sentences_per_s: float | None
    pairs_ct2_served_c1_p50_ms: float | None
    service_best_over_ct2_int8: float | None
    latency_c1_best_over_ct2: float | None
    service_default_c64_sentences_per_s: float | None
    service_default_over_ct2_int8: float | None
    service_many_over_ct2_int8: float | None
    service_over_torch_eager: float | None
    torch_eager_single_sentences_per_s: float | None
    service_over_torch_eager_single: float | None


# The last line's keys: the ratios, for the default beam and per beam (`by_beam`); then the
# figures they divide, for the default beam. Each is a key of `Summary` (tests/benchmarks/test_run.py).
HEADLINE_RATIOS = (
    "service_over_ct2_int8",
    "latency_c1_over_ct2",
    "service_over_torch_eager",
    "service_over_torch_eager_single",
    "service_many_over_ct2_int8",
    "service_default_over_ct2_int8",
    "service_best_over_ct2_int8",
    "latency_c1_best_over_ct2",
    "engine_over_ct2_int8",
    "engine_latency_over_ct2",
    "service_over_ct2_served",
    "latency_c1_over_ct2_served",
)
HEADLINE_FIGURES = (
    "pairs",
    "pairs_service_c64_sentences_per_s",
    "pairs_ct2_int8_sentences_per_s",
    "pairs_service_c1_p50_ms",
    "pairs_ct2_single_p50_ms",
    "pairs_engine_sentences_per_s",
    "pairs_engine_single_p50_ms",
    "pairs_ct2_served_c64_sentences_per_s",
    "pairs_ct2_served_c1_p50_ms",
    "service_c64_sentences_per_s",
    "service_default_c64_sentences_per_s",
    "service_many_c64_sentences_per_s",
    "ct2_int8_sentences_per_s",
    "service_c1_p50_ms",
    "ct2_single_p50_ms",
    "torch_eager_sentences_per_s",
    "torch_eager_single_sentences_per_s",
)


def best_offline(rows: list[Row], engine: str, beam: int) -> Row | None:
    cand = [r for r in rows if r.get("engine") == engine and r.get("beam") == beam and "error" not in r]
    return max(cand, key=lambda r: r["sentences_per_s"], default=None)


def single_latency(rows: list[Row], engines: list[str], beam: int) -> float | None:
    vals = [
        r["latency_single"]["p50_ms"]
        for r in rows
        if r.get("engine") in engines and r.get("beam") == beam and "latency_single" in r
    ]
    return min(vals, default=None)


def service_points(res: Results, beam: int, api: str = "unary", sweep: bool = True) -> list[tuple[str, Row]]:
    """(label, level row) of every online run at this beam and API: the main runs and (with
    `sweep`) the layout sweep."""
    pts = []
    for r in res.get("online", {}).get("runs", []) + (res.get("sweep", []) if sweep else []):
        if r.get("beam") != beam or r.get("api", "unary") != api:
            continue
        label = " ".join(r["server_args"])
        for lv in r["levels"]:
            pts.append((label, lv))
    return pts


def median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 3) if xs else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _best_c64(points: list[tuple[str, Row]]) -> float | None:
    return max(
        (lv["sentences_per_s"] for _, lv in points if lv["concurrency"] == 64 and not lv["errors"]), default=None
    )


def _sentences_per_s(row: Row | None) -> float | None:
    return row["sentences_per_s"] if row else None


def _layout(row: Row | None) -> str | None:
    """An offline row's layout as the report writes it: loops x threads and batch size."""
    if not row:
        return None
    return f"{row['workers']}x{max(1, row['threads'] // row['workers'])} batch {row['batch_size']}"


@dataclass(frozen=True)
class _Offline:
    """One beam's offline rows that the summary divides by (None: not measured)."""

    ct2: Row | None  # CTranslate2 int8 at its best layout
    ort: Row | None  # the ORT int8 engine at its best layout
    eager: Row | None  # the textbook PyTorch loop at its best layout
    eager_single: Row | None  # the textbook loop, one sentence at a time
    ct2_single_p50_ms: float | None  # the faster of CTranslate2 float32 and int8


def _offline(rows: list[Row], beam: int) -> _Offline:
    eager_single = next(
        (
            r
            for r in rows
            if r.get("engine") == "torch-eager" and r.get("beam") == beam and r.get("batch_size") == 1
            if "error" not in r
        ),
        None,
    )
    return _Offline(
        ct2=best_offline(rows, "ct2-int8", beam),
        ort=best_offline(rows, "ort-int8", beam),
        eager=best_offline(rows, "torch-eager", beam),
        eager_single=eager_single,
        ct2_single_p50_ms=single_latency(rows, ["ct2-int8", "ct2-float32"], beam),
    )


class _Pairs:
    """One beam's interleaved pairs: `measured` are those where CTranslate2 offline and the server
    both answered (the headline pairs); `median` takes any key over the pairs that measured it."""

    def __init__(self, res: Results, beam: int) -> None:
        self.rows = [r for r in res.get("pairs", []) if r.get("beam") == beam]
        self.measured = [r for r in self.rows if "error" not in r]

    def median(self, key: str) -> float | None:
        """The median of `key` over this beam's pairs that measured it (its two parts answered)."""
        return median([r[key] for r in self.rows if key in r])

    def headline(self, key: str) -> float | None:
        """The median of `key` over the headline pairs."""
        return median([r[key] for r in self.measured])


def summarize(res: Results, beam: int) -> Summary:
    """One beam's `Summary` of the results `res` (its offline, online, sweep, batcher and pairs parts)."""
    service = service_points(res, beam)
    svc64 = _best_c64(service)
    # The default layout alone, from the main online levels (the sweep measures it again later: on a
    # machine whose speed drifts, the best of the two samples reads high).
    svc64_default = _best_c64(service_points(res, beam, sweep=False))
    svc1 = min((lv["p50_ms"] for _, lv in service if lv["concurrency"] == 1 and not lv["errors"]), default=None)
    many64 = _best_c64(service_points(res, beam, "many"))
    off = _offline(res["offline"], beam)
    batcher = max(
        (r["sentences_per_s"] for r in res.get("batcher", []) if r.get("beam") == beam and "error" not in r),
        default=None,
    )
    pairs = _Pairs(res, beam)
    ct2 = _sentences_per_s(off.ct2)
    best_tp, best_lat = ratio(svc64, ct2), ratio(svc1, off.ct2_single_p50_ms)
    svc_paired = pairs.headline("service_c64_sentences_per_s")
    svc = svc_paired if pairs.measured else svc64  # what the textbook-loop ratios divide
    return Summary(
        beam=beam,
        service_c64_sentences_per_s=svc64,
        service_c1_p50_ms=svc1,
        service_many_c64_sentences_per_s=many64,
        ct2_int8_sentences_per_s=ct2,
        ct2_int8_layout=_layout(off.ct2),
        ct2_single_p50_ms=off.ct2_single_p50_ms,
        ort_int8_sentences_per_s=_sentences_per_s(off.ort),
        ort_int8_layout=_layout(off.ort),
        batcher_c64_sentences_per_s=batcher,
        torch_eager_sentences_per_s=_sentences_per_s(off.eager),
        service_over_ct2_int8=pairs.headline("throughput_ratio") if pairs.measured else best_tp,
        latency_c1_over_ct2=pairs.headline("latency_ratio") if pairs.measured else best_lat,
        pairs=len(pairs.measured),
        pairs_service_c64_sentences_per_s=svc_paired,
        pairs_ct2_int8_sentences_per_s=pairs.headline("ct2_sentences_per_s"),
        pairs_service_c1_p50_ms=pairs.headline("service_c1_p50_ms"),
        pairs_ct2_single_p50_ms=pairs.headline("ct2_single_p50_ms"),
        engine_over_ct2_int8=pairs.median("engine_throughput_ratio"),
        engine_latency_over_ct2=pairs.median("engine_latency_ratio"),
        service_over_ct2_served=pairs.median("served_throughput_ratio"),
        latency_c1_over_ct2_served=pairs.median("served_latency_ratio"),
        pairs_engine_sentences_per_s=pairs.median("engine_sentences_per_s"),
        pairs_engine_single_p50_ms=pairs.median("engine_single_p50_ms"),
        pairs_ct2_served_c64_sentences_per_s=pairs.median("ct2_served_c64_sentences_per_s"),
        pairs_ct2_served_c1_p50_ms=pairs.median("ct2_served_c1_p50_ms"),
        service_best_over_ct2_int8=best_tp,
        latency_c1_best_over_ct2=best_lat,
        service_default_c64_sentences_per_s=svc64_default,
        service_default_over_ct2_int8=ratio(svc64_default, ct2),
        service_many_over_ct2_int8=ratio(many64, ct2),
        service_over_torch_eager=ratio(svc, _sentences_per_s(off.eager)),
        torch_eager_single_sentences_per_s=_sentences_per_s(off.eager_single),
        service_over_torch_eager_single=ratio(svc, _sentences_per_s(off.eager_single)),
    )


def tracing_figures(tracing: Row | None) -> dict[str, float]:
    if not tracing:
        return {}
    return {
        "service_c64_tracing_off_sentences_per_s": tracing["off_sentences_per_s"],
        "service_c64_tracing_on_sentences_per_s": tracing["on_sentences_per_s"],
        "tracing_overhead": tracing["overhead"],
    }


def headline(res: Results, head_beam: int) -> dict[str, Any]:
    """The JSON object of the last line: `head_beam`'s ratios and figures at the top level, every
    beam's ratios under `by_beam`."""
    summaries: list[Summary] = res["summary_by_beam"]
    head = next(s for s in summaries if s["beam"] == head_beam)
    return {
        "mode": res["mode"],
        "beam": head_beam,
        **{k: head.get(k) for k in HEADLINE_RATIOS + HEADLINE_FIGURES},
        "by_beam": {str(s["beam"]): {k: s.get(k) for k in HEADLINE_RATIOS} for s in summaries},
        "ct2_greedy_identical": f"{res['ct2_check']['identical']}/{res['ct2_check']['sentences']}",
        # c64 at the head beam with OpenTelemetry off and with every request traced (OTLP to loopback)
        **tracing_figures(res.get("tracing")),
        # offline sentences per engine (0 = all 1,000): quick-mode ratios come from subsets
        "offline_sentences": res["plan"]["limits"],
        # the OPUS-MT-sized model (benchmarks/real_size.py), when it ran
        **({"real_size": res["real_size"]["summary"]} if "real_size" in res else {}),
    }
