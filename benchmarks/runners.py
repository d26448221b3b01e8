"""The parts of a benchmark run, each by its `Plan`: offline engines (one offline.py process per
engine and layout), the server online and in-process (batcher.py), the layout sweep, and the
interleaved pairs behind the headline ratios."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from benchmarks import online
from benchmarks.plan import CONNECTIONS, LEVELS, MANY_LEVELS, Layout, Plan, served_layout
from benchmarks.processes import Server
from benchmarks.summary import Row, best_offline

REPO = Path(__file__).resolve().parent.parent


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- offline


ENGINES = ["torch-eager", "torch-cache", "ort-fp32", "ort-int8", "ct2-float32", "ct2-int8"]
# The translations of one engine at one beam (its first layout), by (engine, beam): token ids per sentence.
Hyps = dict[tuple[str, int], list[list[int]]]


def run_offline(plan: Plan, threads: int, model: str, tmp: Path) -> tuple[list[Row], Hyps]:
    """Every engine at every beam and offline layout of the plan, one offline.py process each."""
    rows: list[Row] = []
    hyps: Hyps = {}
    for beam in plan.beams:
        for eng in ENGINES:
            family = eng.split("-")[0]
            for workers, batch, limit in _offline_layouts(plan, eng):
                out = tmp / f"{eng}-{beam}-{workers}-{batch}.ids.json"
                row = _offline_run(plan, model, threads, eng, beam, workers, batch, limit, out)
                rows.append(row)
                if "error" not in row and (workers, batch) == plan.offline_layouts[family][0]:
                    hyps[(eng, beam)] = json.loads(out.read_text())
    return rows, hyps


def _offline_layouts(plan: Plan, eng: str) -> list[tuple[int, int, int]]:
    """(decode loops, batch size, sentences) of each offline run of engine `eng`."""
    limit = plan.limit(eng)
    layouts = [(w, b, limit) for w, b in plan.offline_layouts[eng.split("-")[0]]]
    if eng == "torch-eager":
        # The textbook loop as the Annotated Transformer runs it: one sentence at a time.
        layouts.append((1, 1, plan.limits["torch-eager-single"]))
    return layouts


def _offline_run(
    plan: Plan, model: str, threads: int, eng: str, beam: int, workers: int, batch: int, limit: int, hyps: Path
) -> Row:
    """One offline.py run: its JSON line, or the layout and the end of its stderr when it fails."""
    cmd = [sys.executable, "-m", "benchmarks.offline", "--engine", eng, "--beam", str(beam), "--threads", str(threads)]
    cmd += ["--workers", str(workers), "--batch-size", str(batch), "--limit", str(limit), "--model", model]
    cmd += ["--hyps", str(hyps)]
    if eng.startswith(("ort", "ct2")) and workers == 1:
        cmd += ["--latency", str(plan.latency_n)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        log(f"  offline {eng} beam {beam}: FAILED\n{proc.stderr[-2000:]}")
        return {"engine": eng, "beam": beam, "workers": workers, "batch_size": batch, "error": proc.stderr[-500:]}
    row: Row = json.loads(proc.stdout.strip().splitlines()[-1])
    lat = row.get("latency_single", {}).get("p50_ms")
    log(
        f"  offline {eng:<12} beam {beam} {workers}x{max(1, threads // workers)} thr, batch {batch:<3} "
        f"n={row['sentences']:<5} {row['sentences_per_s']:9.1f} sent/s {row['target_tokens_per_s']:9.0f} tok/s"
        f"  BLEU {row['bleu']:5.2f}" + (f"  single p50 {lat:.1f} ms" if lat is not None else "")
    )
    return row


def agreement(hyps: Hyps, a: tuple[str, int], b: tuple[str, int]) -> Row | None:
    if a not in hyps or b not in hyps:
        return None
    n = min(len(hyps[a]), len(hyps[b]))
    same = sum(x == y for x, y in zip(hyps[a][:n], hyps[b][:n]))
    return {"a": f"{a[0]} beam {a[1]}", "b": f"{b[0]} beam {b[1]}", "sentences": n, "identical": same}


def ct2_greedy_check(model: str, limit: int) -> Row:
    """CTranslate2 float32 greedy vs the ONNX Runtime fp32 generator (which `mtserve verify`
    checks against the PyTorch reference), before any timing."""
    from benchmarks.ct2_convert import Ct2Translator, convert
    from export.data import DEFAULT_DATA_DIR, read_parallel
    from service.decoding.generator import generate
    from service.runtime.onnx_model import OnnxSeq2Seq

    src, _ = read_parallel(DEFAULT_DATA_DIR, "test_2016_flickr")
    if limit:
        src = src[:limit]
    m = OnnxSeq2Seq(model, "fp32", intra_op_threads=2)
    ids = m.source_ids(src)
    ours = [h.tokens for h in generate(m, ids, beam=1)]
    with tempfile.TemporaryDirectory(prefix="mtserve-ct2-") as d:
        convert(model, d)
        theirs = Ct2Translator(d, model, "float32", 1, 2).translate_ids(ids, beam=1)
    same = sum(a == b for a, b in zip(ours, theirs))
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    return {
        "sentences": len(ids),
        "identical": same,
        "first_difference": first_diff,
        "against": "ort-fp32 greedy (service.decoding.generator)",
    }


# ----------------------------------------------------------------------------- online


def _online(
    plan: Plan, model: str, texts: list[str], refs: list[str], levels: list[int], beam: int, args: list[str]
) -> Row:
    """`mtserve serve ARGS` under Translate calls at each level, over CONNECTIONS connections."""
    return online.run(
        model,
        texts,
        refs,
        levels,
        beam,
        plan.online_requests,
        args,
        log=log,
        rounds=plan.rounds,
        connections=CONNECTIONS,
    )


def run_online(plan: Plan, model: str, texts: list[str], refs: list[str]) -> Row:
    runs: list[Row] = []
    out: Row = {"levels": LEVELS, "runs": runs}
    for beam in plan.online_beams:
        for cb in plan.continuous_batching:
            args = ["--continuous-batching" if cb else "--no-continuous-batching"]
            log(f"online: beam {beam}, continuous batching {'on' if cb else 'off'} (default layout)")
            r = _online(plan, model, texts, refs, LEVELS, beam, args)
            r.update({"beam": beam, "continuous_batching": cb})
            runs.append(r)
        # The same single-sentence requests as items of one TranslateMany stream (static batching).
        log(f"online: beam {beam}, TranslateMany (one stream), continuous batching off (default layout)")
        r = online.run(
            model,
            texts,
            refs,
            MANY_LEVELS,
            beam,
            plan.online_requests,
            ["--no-continuous-batching"],
            log=log,
            rounds=plan.rounds,
            api="many",
            streams=1,
        )
        r.update({"beam": beam, "continuous_batching": False})
        runs.append(r)
    return out


def run_batcher(plan: Plan, model: str) -> list[Row]:
    rows: list[Row] = []
    for beam in plan.online_beams:
        for cb in plan.continuous_batching:
            log(
                f"batcher (in-process, no gRPC): beam {beam}, concurrency 64, continuous batching {'on' if cb else 'off'}"
            )
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.batcher",
                "--model",
                model,
                "--beam",
                str(beam),
                "--concurrency",
                "64",
                "--sentences",
                str(plan.batcher_sentences),
                "--continuous-batching" if cb else "--no-continuous-batching",
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
            if out.returncode != 0:
                log(f"  failed: {out.stderr.strip()[-500:]}")
                rows.append({"beam": beam, "continuous_batching": cb, "error": out.stderr.strip()[-500:]})
                continue
            row = json.loads(out.stdout.strip().splitlines()[-1])
            log(
                f"  {row['sentences_per_s']:.1f} sent/s, {row['cpu_cores']} cores, {row['rows_per_step']} rows/step, "
                f"{row['us_per_row_step']} us/row-step"
            )
            rows.append(row)
    return rows


def run_sweep(plan: Plan, model: str, texts: list[str], refs: list[str], beam: int) -> list[Row]:
    rows = []
    for args in plan.sweep:
        log(f"sweep: {' '.join(args)} (beam {beam})")
        r = _online(plan, model, texts, refs, plan.sweep_levels, beam, args)
        r["beam"] = beam
        rows.append(r)
    return rows


def _offline_cmd(plan: Plan, model: str, threads: int, engine: str, beam: int, workers: int, batch: int) -> list[str]:
    """offline.py over the pairs' sentences at one layout, with single-sentence latency on 1 thread."""
    return [
        sys.executable,
        "-m",
        "benchmarks.offline",
        "--engine",
        engine,
        "--beam",
        str(beam),
        "--threads",
        str(threads),
        "--workers",
        str(workers),
        "--batch-size",
        str(batch),
        "--limit",
        str(plan.pair_sentences),
        "--model",
        model,
        "--latency",
        str(plan.latency_n),
        "--latency-threads",
        "1",
    ]


def _offline_part(cmd: list[str], prefix: str) -> Row:
    """One offline.py run: {PREFIX_sentences_per_s, PREFIX_single_p50_ms}, or {"error": ...}."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    off = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        f"{prefix}_sentences_per_s": off["sentences_per_s"],
        f"{prefix}_single_p50_ms": off["latency_single"]["p50_ms"],
    }


def _server_part(plan: Plan, address: str, texts: list[str], refs: list[str], beam: int, prefix: str) -> Row:
    """One server at concurrency 64 over the pairs' sentences, then at concurrency 1:
    {PREFIX_c64_sentences_per_s, PREFIX_c1_p50_ms}, or {"error": ...}."""
    n = plan.pair_sentences
    c64 = online.run_level(
        address,
        texts[:n],
        refs[:n],
        64,
        online.requests_for(64, plan.pair_requests, plan.rounds),
        beam,
        connections=CONNECTIONS,
    )
    c1 = online.run_level(address, texts, refs, 1, plan.latency_n, beam)
    if c64["errors"] or c1["errors"]:
        return {"error": f"{prefix} errors: {c64['errors']} {c1['errors']}"}
    return {f"{prefix}_c64_sentences_per_s": c64["sentences_per_s"], f"{prefix}_c1_p50_ms": c1["p50_ms"]}


# Each pair's ratios: (key, numerator, denominator).
PAIR_RATIOS = (
    ("throughput_ratio", "service_c64_sentences_per_s", "ct2_sentences_per_s"),
    ("latency_ratio", "service_c1_p50_ms", "ct2_single_p50_ms"),
    ("engine_throughput_ratio", "engine_sentences_per_s", "ct2_sentences_per_s"),
    ("engine_latency_ratio", "engine_single_p50_ms", "ct2_single_p50_ms"),
    ("served_throughput_ratio", "service_c64_sentences_per_s", "ct2_served_c64_sentences_per_s"),
    ("served_latency_ratio", "service_c1_p50_ms", "ct2_served_c1_p50_ms"),
)


def run_pairs(
    plan: Plan,
    model: str,
    threads: int,
    texts: list[str],
    refs: list[str],
    offline_rows: list[Row],
    data_dir: str | Path | None = None,
) -> list[Row]:
    """The headline ratios, measured in interleaved pairs, `plan.pairs` times per beam on the same
    sentences, alternating the order of the parts:
    - CTranslate2 int8 offline (its best layout from the offline part, else the plan's first;
      single-sentence latency with 1 thread, as the issue defines it),
    - the ORT int8 engine offline (`service.decoding.generator` over the sentences, its best layout
      likewise; single-sentence latency with 1 thread),
    - the server (`mtserve serve`, a replica per core: `served_layout`) at concurrency 64 and 1,
    - the same server decoding with CTranslate2 int8 (benchmarks/ct2_server.py: CTranslate2's best
      offline layout and batch size) at concurrency 64 and 1, under the same load generator.
    Either order keeps each ratio's two parts next to each other. On a machine whose speed drifts
    by tens of percent within minutes, the median of per-pair ratios is what one run can say; a
    ratio of figures taken ten minutes apart is not. A part that fails is recorded in the row's
    `errors` and leaves out the ratios it enters; the pair as a whole (`error`) fails when
    CTranslate2 offline or the server does, as before. `texts`/`refs`: the test split read from
    `data_dir` (offline.py's default corpus when None)."""
    from benchmarks.ct2_convert import convert

    rows = []
    data = ["--data", str(data_dir)] if data_dir is not None else []
    with tempfile.TemporaryDirectory(prefix="mtserve-ct2-") as ct2_dir:
        convert(model, ct2_dir)  # once, for every CTranslate2 run below
        for beam in plan.online_beams:
            layouts = _PairLayouts.of(plan, offline_rows, beam)
            layouts.log(plan, threads, beam)
            with contextlib.ExitStack() as servers:
                parts = _pair_parts(plan, model, threads, texts, refs, beam, layouts, data, ct2_dir, servers)
                order = list(parts)  # reversed in odd pairs: each ratio's parts stay side by side
                for i in range(plan.pairs):
                    row = _run_pair(parts, order if i % 2 == 0 else order[::-1], beam, i)
                    _log_pair(row)
                    rows.append(row)
    return rows


@dataclass(frozen=True)
class _PairLayouts:
    """The offline layouts (decode loops, batch size) the pairs run CTranslate2 and the ORT engine
    at: each one's best in the offline part, else the plan's first."""

    ct2: Layout
    ort: Layout

    @staticmethod
    def of(plan: Plan, offline_rows: list[Row], beam: int) -> _PairLayouts:
        ct2 = best_offline(offline_rows, "ct2-int8", beam)
        ort = best_offline(offline_rows, "ort-int8", beam)
        return _PairLayouts(
            ct2=(ct2["workers"], ct2["batch_size"]) if ct2 else plan.offline_layouts["ct2"][0],
            ort=(ort["workers"], ort["batch_size"]) if ort else plan.offline_layouts["ort"][0],
        )

    def log(self, plan: Plan, threads: int, beam: int) -> None:
        (workers, batch), (ort_workers, ort_batch) = self.ct2, self.ort
        log(
            f"pairs: beam {beam}, CT2 int8 {workers}x{max(1, threads // workers)} batch {batch} offline and served, "
            f"ORT int8 engine {ort_workers}x{max(1, threads // ort_workers)} batch {ort_batch} offline (single: 1x1), "
            f"the server {' '.join(served_layout(threads)) or 'default layout'}, {plan.pairs} pairs, "
            f"{CONNECTIONS} connections"
        )


Part = Callable[[], Row]


def _pair_parts(
    plan: Plan,
    model: str,
    threads: int,
    texts: list[str],
    refs: list[str],
    beam: int,
    layouts: _PairLayouts,
    data: list[str],
    ct2_dir: str,
    servers: contextlib.ExitStack,
) -> dict[str, Part]:
    """A pair's four parts by name, their servers started on `servers`. A CTranslate2 server that
    does not start leaves its ratios out, not the others."""
    (workers, batch), (ort_workers, ort_batch) = layouts.ct2, layouts.ort
    ct2_cmd = _offline_cmd(plan, model, threads, "ct2-int8", beam, workers, batch) + data + ["--ct2-dir", ct2_dir]
    ort_cmd = _offline_cmd(plan, model, threads, "ort-int8", beam, ort_workers, ort_batch) + data
    served_args = ["--decode-workers", str(workers), "--intra-op-threads", str(max(1, threads // workers))]
    served_args += ["--ct2-batch-size", str(batch), "--ct2-dir", ct2_dir]
    srv = servers.enter_context(Server(model, served_layout(threads)))
    served: Part
    try:
        ct2_srv = servers.enter_context(Server(model, served_args, backend="ct2", log_prefix="mtserve-ct2-bench-"))
        served = partial(_server_part, plan, ct2_srv.address, texts, refs, beam, "ct2_served")
    except RuntimeError as e:
        log(f"  the CTranslate2-served server did not start: {e}")
        served = partial(dict, error=f"ct2_served did not start: {str(e)[-400:]}")
    return {
        "engine": partial(_offline_part, ort_cmd, "engine"),
        "ct2": partial(_offline_part, ct2_cmd, "ct2"),
        "service": partial(_server_part, plan, srv.address, texts, refs, beam, "service"),
        "ct2_served": served,
    }


def _run_pair(parts: dict[str, Part], order: list[str], beam: int, i: int) -> Row:
    """Pair `i`: the parts in `order`, their figures and the ratios of those that answered."""
    row: Row = {"beam": beam, "pair": i}
    errors = {}
    for name in order:
        out = parts[name]()
        if "error" in out:
            errors[name] = out["error"]
        else:
            row.update(out)
    if errors:
        row["errors"] = errors
        failed = [k for k in ("ct2", "service") if k in errors]
        if failed:
            row["error"] = "; ".join(errors[k] for k in failed)
    for key, num, den in PAIR_RATIOS:
        if num in row and den in row:
            row[key] = round(row[num] / row[den], 3)
    return row


def _log_pair(row: Row) -> None:
    for name, error in row.get("errors", {}).items():
        log(f"  pair {row['pair']}: {name} failed: {error}")

    def fig(num: str, den: str, key: str, unit: str) -> str:
        if key not in row:
            return "n/a"
        return f"{row[num]:.1f} / {row[den]:.1f} {unit} = {row[key]:.3f}"

    log(
        f"  pair {row['pair']}: service/CT2 offline "
        + fig("service_c64_sentences_per_s", "ct2_sentences_per_s", "throughput_ratio", "sent/s")
        + "; c1 p50 "
        + fig("service_c1_p50_ms", "ct2_single_p50_ms", "latency_ratio", "ms")
    )
    log(
        "           engine/CT2 offline "
        + fig("engine_sentences_per_s", "ct2_sentences_per_s", "engine_throughput_ratio", "sent/s")
        + "; single p50 "
        + fig("engine_single_p50_ms", "ct2_single_p50_ms", "engine_latency_ratio", "ms")
    )
    log(
        "           service/CT2 served c64 "
        + fig("service_c64_sentences_per_s", "ct2_served_c64_sentences_per_s", "served_throughput_ratio", "sent/s")
        + "; c1 p50 "
        + fig("service_c1_p50_ms", "ct2_served_c1_p50_ms", "served_latency_ratio", "ms")
    )
