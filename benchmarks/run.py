"""The benchmark suite, side by side on one machine and one thread budget (`make bench`,
`make bench-quick`):

    python benchmarks/run.py            # everything, all 1,000 test sentences (15-30 minutes on 2 cores)
    python benchmarks/run.py --quick    # short mode (about 3 minutes): subsets, fewer requests

1. Offline (benchmarks/offline.py, one process per engine): PyTorch without a cache (the textbook
   loop), PyTorch with the key/value cache, ONNX Runtime fp32 and int8 (service.decoding.generator),
   CTranslate2 float32 and int8 (the same weights, converted by benchmarks/ct2_convert.py), greedy
   and beam 4: sentences/s, target tokens/s, BLEU, single-sentence latency. Before timing, the
   CTranslate2 greedy output is compared token for token with ours.
2. Online (benchmarks/online.py): `mtserve serve` on loopback under an async gRPC load generator
   at concurrency 1, 8, 32, 64, 128: throughput, p50/p95/p99 latency, errors; continuous batching
   on and off.
   Beside it (benchmarks/batcher.py, one process per run): the same scheduler and decode workers
   in-process at concurrency 64 with no gRPC, continuous batching on and off, to split the gap
   between an offline engine and the service into batching and RPC.
3. A sweep of the serving thread layout (decode workers x intra-op threads, inter-op threads,
   precision) at concurrency 64 and 1.
4. The headline ratios in interleaved pairs: CTranslate2 int8 offline right next to the server
   (a replica per core, one decode worker each: `served_layout`) at concurrency 64 and 1, on the same sentences, several times per beam; in the
   same pairs, the ORT int8 engine offline (service.decoding.generator, best layout) and the same
   server decoding with CTranslate2 int8 (benchmarks/ct2_server.py: mtserve's gRPC front, Engine
   and limits on a CTranslate2 backend at its best offline layout) at concurrency 64 and 1.
5. Optionally (`--profile`) a py-spy breakdown of the server at concurrency 64.

Everything goes to benchmarks/results/MODE-DATE.json (and MODE-latest.json); the report (a
Markdown table with machine, versions, settings and date) and the latency/throughput plot go to
docs/benchmarks.md and docs/benchmarks.png for a full run, benchmarks/results/quick.md/.png for a
quick one (`--docs` sends a quick run's to docs/ too). The last line printed is one JSON object
with the headline ratios:

  service_over_ct2_int8     service throughput at concurrency 64 (a replica per core), one Translate
                            call per sentence / CTranslate2 int8 offline throughput (its best
                            layout), same beam: the median ratio of the interleaved pairs
  latency_c1_over_ct2       service p50 latency at concurrency 1 / CTranslate2 int8's
                            single-sentence p50 latency with 1 thread, same beam: the median ratio
                            of the interleaved pairs
  service_over_torch_eager  the pairs' median service throughput / the textbook PyTorch loop
                            (no cache) over length-sorted batches of 64, same beam
  service_over_torch_eager_single  the same / the textbook loop one sentence at a time
  service_best_over_ct2_int8, latency_c1_best_over_ct2  the best service sample over the online
                            levels and the sweep (any layout) against CTranslate2's figures from
                            the offline part (the faster of float32 and int8 for latency), taken
                            minutes apart
  service_many_over_ct2_int8  the best sample with the sentences as items of one TranslateMany
                            stream, against the offline part's CTranslate2 int8
  service_default_over_ct2_int8  the same for the default layout's unary calls in the main online
                            levels only
  engine_over_ct2_int8      the ORT int8 engine offline (service.decoding.generator over the pairs'
                            sentences, its best layout) / CTranslate2 int8 offline, sentences/s:
                            the median ratio of the pairs
  engine_latency_over_ct2   the ORT engine's single-sentence p50 / CTranslate2's, 1 thread each:
                            the median ratio of the pairs
  service_over_ct2_served   the server at concurrency 64 / the same server decoding with
                            CTranslate2 int8 at concurrency 64, sentences/s: the median ratio of
                            the pairs
  latency_c1_over_ct2_served  the server's p50 at concurrency 1 / the CTranslate2-served server's:
                            the median ratio of the pairs
The ratios are given for beam 4 at the top level and for every beam under `by_beam`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import online as online_mod
from benchmarks import tracing_overhead

RESULTS = REPO / "benchmarks" / "results"
LEVELS = [1, 8, 32, 64, 128]
MANY_LEVELS = [1, 64]  # TranslateMany: one stream carrying the same single-sentence requests
# Client connections of every online run (one per request at lower concurrency): a server's replicas
# (`--replicas`) are spread by connection, and one process serves 8 connections as fast as one.
CONNECTIONS = 8


def served_layout(threads: int) -> list[str]:
    """The server's layout in the pairs: a replica per core with one decode worker each (the
    fastest measured at concurrency 64: docs/performance.md), or the default on one core."""
    return ["--replicas", str(threads), "--decode-workers", "1"] if threads > 1 else []


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- plan


def plan(quick: bool) -> dict:
    """Sentences, layouts and request counts of each mode."""
    if quick:
        return {
            "limits": {"torch-eager": 12, "torch-cache": 64, "default": 200, "torch-eager-single": 12},
            "beams": [1, 4],
            "online_beams": [1, 4],
            "latency_n": 20,
            "online_requests": 100,
            "rounds": 2,
            "offline_layouts": {
                "ct2": [(2, 32), (1, 32), (2, 64)],
                "ort": [(2, 32), (2, 64)],
                "torch": [(1, 64)],
            },
            "sweep": [
                ["--decode-workers", "1", "--intra-op-threads", "2"],
                ["--decode-workers", "2", "--intra-op-threads", "1", "--precision", "fp32"],
                ["--replicas", "2", "--decode-workers", "1"],
            ],
            "sweep_levels": [1, 64],
            "profile_seconds": 8,
            "batcher_sentences": 400,
            "pairs": 3,
            "pair_sentences": 200,
            "pair_requests": 400,
            "continuous_batching": [False],  # the server's default only
            "tracing_requests": 400,  # c64 with tracing off and with every request traced
            "tracing_pairs": 1,
        }
    return {
        "limits": {"default": 0, "torch-eager-single": 200},
        "beams": [1, 4],
        "online_beams": [1, 4],
        "latency_n": 200,
        "online_requests": 1000,
        "rounds": 4,
        "offline_layouts": {
            "ct2": [(2, 32), (1, 32), (2, 64), (1, 64)],
            "ort": [(1, 32), (2, 32), (2, 64)],
            "torch": [(1, 64)],
        },
        "sweep": [
            [*w, *p]
            for p in (["--precision", "fp32"], ["--precision", "int8"])
            for w in (
                ["--decode-workers", "1", "--intra-op-threads", "1"],
                ["--decode-workers", "1", "--intra-op-threads", "2"],
                ["--decode-workers", "2", "--intra-op-threads", "1"],
                ["--decode-workers", "4", "--intra-op-threads", "1"],
                ["--decode-workers", "2", "--intra-op-threads", "1", "--inter-op-threads", "2"],
                ["--replicas", "2", "--decode-workers", "1"],
            )
        ],
        "sweep_levels": [1, 64],
        "profile_seconds": 20,
        "batcher_sentences": 3000,
        "pairs": 5,
        "pair_sentences": 1000,
        "pair_requests": 1000,
        "continuous_batching": [True, False],
        "tracing_requests": 1000,
        "tracing_pairs": 2,
    }


# ----------------------------------------------------------------------------- offline


def run_offline(p: dict, threads: int, model: str, tmp: Path) -> tuple[list[dict], dict]:
    rows, hyps = [], {}
    engines = ["torch-eager", "torch-cache", "ort-fp32", "ort-int8", "ct2-float32", "ct2-int8"]
    for beam in p["beams"]:
        for eng in engines:
            family = eng.split("-")[0]
            limit = p["limits"].get(eng, p["limits"]["default"])
            layouts = [(w, b, limit) for w, b in p["offline_layouts"][family]]
            if eng == "torch-eager":
                # The textbook loop as the Annotated Transformer runs it: one sentence at a time.
                layouts.append((1, 1, p["limits"]["torch-eager-single"]))
            for workers, batch, limit in layouts:
                first = (workers, batch) == p["offline_layouts"][family][0]
                out = tmp / f"{eng}-{beam}-{workers}-{batch}.ids.json"
                cmd = [
                    sys.executable,
                    str(REPO / "benchmarks" / "offline.py"),
                    "--engine",
                    eng,
                    "--beam",
                    str(beam),
                    "--threads",
                    str(threads),
                    "--workers",
                    str(workers),
                    "--batch-size",
                    str(batch),
                    "--limit",
                    str(limit),
                    "--model",
                    model,
                    "--hyps",
                    str(out),
                ]
                if family in ("ort", "ct2") and workers == 1:
                    cmd += ["--latency", str(p["latency_n"])]
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
                if proc.returncode != 0:
                    log(f"  offline {eng} beam {beam}: FAILED\n{proc.stderr[-2000:]}")
                    rows.append(
                        {
                            "engine": eng,
                            "beam": beam,
                            "workers": workers,
                            "batch_size": batch,
                            "error": proc.stderr[-500:],
                        }
                    )
                    continue
                row = json.loads(proc.stdout.strip().splitlines()[-1])
                rows.append(row)
                if first:
                    hyps[(eng, beam)] = json.loads(out.read_text())
                lat = row.get("latency_single", {}).get("p50_ms")
                log(
                    f"  offline {eng:<12} beam {beam} {workers}x{max(1, threads // workers)} thr, batch {batch:<3} "
                    f"n={row['sentences']:<5} {row['sentences_per_s']:9.1f} sent/s {row['target_tokens_per_s']:9.0f} tok/s"
                    f"  BLEU {row['bleu']:5.2f}" + (f"  single p50 {lat:.1f} ms" if lat is not None else "")
                )
    return rows, hyps


def agreement(hyps: dict, a: tuple, b: tuple) -> dict | None:
    if a not in hyps or b not in hyps:
        return None
    n = min(len(hyps[a]), len(hyps[b]))
    same = sum(x == y for x, y in zip(hyps[a][:n], hyps[b][:n]))
    return {"a": f"{a[0]} beam {a[1]}", "b": f"{b[0]} beam {b[1]}", "sentences": n, "identical": same}


def ct2_greedy_check(model: str, limit: int) -> dict:
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


def _online(p: dict, model: str, texts, refs, levels: list[int], beam: int, args: list[str]) -> dict:
    """`mtserve serve ARGS` under Translate calls at each level, over CONNECTIONS connections."""
    return online_mod.run(
        model,
        texts,
        refs,
        levels,
        beam,
        p["online_requests"],
        args,
        log=log,
        rounds=p["rounds"],
        connections=CONNECTIONS,
    )


def run_online(p: dict, model: str, texts, refs) -> dict:
    out = {"levels": LEVELS, "runs": []}
    for beam in p["online_beams"]:
        for cb in p["continuous_batching"]:
            args = ["--continuous-batching" if cb else "--no-continuous-batching"]
            log(f"online: beam {beam}, continuous batching {'on' if cb else 'off'} (default layout)")
            r = _online(p, model, texts, refs, LEVELS, beam, args)
            r.update({"beam": beam, "continuous_batching": cb})
            out["runs"].append(r)
        # The same single-sentence requests as items of one TranslateMany stream (static batching).
        log(f"online: beam {beam}, TranslateMany (one stream), continuous batching off (default layout)")
        r = online_mod.run(
            model,
            texts,
            refs,
            MANY_LEVELS,
            beam,
            p["online_requests"],
            ["--no-continuous-batching"],
            log=log,
            rounds=p["rounds"],
            api="many",
            streams=1,
        )
        r.update({"beam": beam, "continuous_batching": False})
        out["runs"].append(r)
    return out


def run_batcher(p: dict, model: str) -> list[dict]:
    rows = []
    for beam in p["online_beams"]:
        for cb in p["continuous_batching"]:
            log(
                f"batcher (in-process, no gRPC): beam {beam}, concurrency 64, continuous batching {'on' if cb else 'off'}"
            )
            cmd = [
                sys.executable,
                str(REPO / "benchmarks" / "batcher.py"),
                "--model",
                model,
                "--beam",
                str(beam),
                "--concurrency",
                "64",
                "--sentences",
                str(p["batcher_sentences"]),
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


def run_sweep(p: dict, model: str, texts, refs, beam: int) -> list[dict]:
    rows = []
    for args in p["sweep"]:
        log(f"sweep: {' '.join(args)} (beam {beam})")
        r = _online(p, model, texts, refs, p["sweep_levels"], beam, args)
        r["beam"] = beam
        rows.append(r)
    return rows


def _offline_cmd(p: dict, model: str, threads: int, engine: str, beam: int, workers: int, batch: int) -> list[str]:
    """offline.py over the pairs' sentences at one layout, with single-sentence latency on 1 thread."""
    return [
        sys.executable,
        str(REPO / "benchmarks" / "offline.py"),
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
        str(p["pair_sentences"]),
        "--model",
        model,
        "--latency",
        str(p["latency_n"]),
        "--latency-threads",
        "1",
    ]


def _offline_part(cmd: list[str], prefix: str) -> dict:
    """One offline.py run: {PREFIX_sentences_per_s, PREFIX_single_p50_ms}, or {"error": ...}."""
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()[-500:]}
    off = json.loads(proc.stdout.strip().splitlines()[-1])
    return {
        f"{prefix}_sentences_per_s": off["sentences_per_s"],
        f"{prefix}_single_p50_ms": off["latency_single"]["p50_ms"],
    }


def _server_part(p: dict, address: str, texts, refs, beam: int, prefix: str) -> dict:
    """One server at concurrency 64 over the pairs' sentences, then at concurrency 1:
    {PREFIX_c64_sentences_per_s, PREFIX_c1_p50_ms}, or {"error": ...}."""
    n = p["pair_sentences"]
    c64 = online_mod.run_level(
        address,
        texts[:n],
        refs[:n],
        64,
        online_mod.requests_for(64, p["pair_requests"], p["rounds"]),
        beam,
        connections=CONNECTIONS,
    )
    c1 = online_mod.run_level(address, texts, refs, 1, p["latency_n"], beam)
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
    p: dict, model: str, threads: int, texts, refs, offline_rows: list[dict], data_dir: str | Path | None = None
) -> list[dict]:
    """The headline ratios, measured in interleaved pairs, `p["pairs"]` times per beam on the same
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
        for beam in p["online_beams"]:
            ct2 = best_offline(offline_rows, "ct2-int8", beam)
            workers, batch = (ct2["workers"], ct2["batch_size"]) if ct2 else p["offline_layouts"]["ct2"][0]
            ort = best_offline(offline_rows, "ort-int8", beam)
            ort_workers, ort_batch = (ort["workers"], ort["batch_size"]) if ort else p["offline_layouts"]["ort"][0]
            intra = max(1, threads // workers)
            log(
                f"pairs: beam {beam}, CT2 int8 {workers}x{intra} batch {batch} offline and served, ORT int8 engine "
                f"{ort_workers}x{max(1, threads // ort_workers)} batch {ort_batch} offline (single: 1x1), the server "
                f"{' '.join(served_layout(threads)) or 'default layout'}, {p['pairs']} pairs, {CONNECTIONS} connections"
            )
            ct2_cmd = _offline_cmd(p, model, threads, "ct2-int8", beam, workers, batch) + data + ["--ct2-dir", ct2_dir]
            ort_cmd = _offline_cmd(p, model, threads, "ort-int8", beam, ort_workers, ort_batch) + data
            served_args = [
                "--decode-workers",
                str(workers),
                "--intra-op-threads",
                str(intra),
                "--ct2-batch-size",
                str(batch),
                "--ct2-dir",
                ct2_dir,
            ]
            with contextlib.ExitStack() as servers:
                srv = servers.enter_context(online_mod.Server(model, served_layout(threads)))
                try:  # a CTranslate2 server that does not start leaves its ratios out, not the others
                    ct2_srv = servers.enter_context(
                        online_mod.Server(model, served_args, backend="ct2", log_prefix="mtserve-ct2-bench-")
                    )
                    served = partial(_server_part, p, ct2_srv.address, texts, refs, beam, "ct2_served")
                except RuntimeError as e:
                    log(f"  the CTranslate2-served server did not start: {e}")
                    served = partial(dict, error=f"ct2_served did not start: {str(e)[-400:]}")
                parts = {
                    "engine": partial(_offline_part, ort_cmd, "engine"),
                    "ct2": partial(_offline_part, ct2_cmd, "ct2"),
                    "service": partial(_server_part, p, srv.address, texts, refs, beam, "service"),
                    "ct2_served": served,
                }
                order = list(parts)  # reversed in odd pairs: each ratio's parts stay side by side
                for i in range(p["pairs"]):
                    row: dict = {"beam": beam, "pair": i}
                    errors = {}
                    for name in order if i % 2 == 0 else order[::-1]:
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
                    _log_pair(row)
                    rows.append(row)
    return rows


def _log_pair(row: dict) -> None:
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


# ----------------------------------------------------------------------------- summary


def best_offline(rows: list[dict], engine: str, beam: int) -> dict | None:
    cand = [r for r in rows if r.get("engine") == engine and r.get("beam") == beam and "error" not in r]
    return max(cand, key=lambda r: r["sentences_per_s"], default=None)


def single_latency(rows: list[dict], engines: list[str], beam: int) -> float | None:
    vals = [
        r["latency_single"]["p50_ms"]
        for r in rows
        if r.get("engine") in engines and r.get("beam") == beam and "latency_single" in r
    ]
    return min(vals, default=None)


def service_points(res: dict, beam: int, api: str = "unary", sweep: bool = True) -> list[tuple[str, dict]]:
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


def summarize(res: dict, beam: int) -> dict:
    pts = service_points(res, beam)
    c64 = [lv for _, lv in pts if lv["concurrency"] == 64 and not lv["errors"]]
    c1 = [lv for _, lv in pts if lv["concurrency"] == 1 and not lv["errors"]]
    svc64 = max((lv["sentences_per_s"] for lv in c64), default=None)
    # The default layout alone, from the main online levels (the sweep measures it again later: on a
    # machine whose speed drifts, the best of the two samples reads high).
    svc64_default = max(
        (
            lv["sentences_per_s"]
            for _, lv in service_points(res, beam, sweep=False)
            if lv["concurrency"] == 64 and not lv["errors"]
        ),
        default=None,
    )
    svc1 = min((lv["p50_ms"] for lv in c1), default=None)
    many64 = max(
        (
            lv["sentences_per_s"]
            for _, lv in service_points(res, beam, "many")
            if lv["concurrency"] == 64 and not lv["errors"]
        ),
        default=None,
    )
    ct2 = best_offline(res["offline"], "ct2-int8", beam)
    eager = best_offline(res["offline"], "torch-eager", beam)
    ort = best_offline(res["offline"], "ort-int8", beam)
    batcher = max(
        (r["sentences_per_s"] for r in res.get("batcher", []) if r.get("beam") == beam and "error" not in r),
        default=None,
    )
    ct2_lat = single_latency(res["offline"], ["ct2-int8", "ct2-float32"], beam)
    eager1 = next(
        (
            r
            for r in res["offline"]
            if r.get("engine") == "torch-eager"
            and r.get("beam") == beam
            and r.get("batch_size") == 1
            and "error" not in r
        ),
        None,
    )
    beam_pairs = [r for r in res.get("pairs", []) if r.get("beam") == beam]
    pairs = [r for r in beam_pairs if "error" not in r]  # CTranslate2 offline and the server both measured

    def paired(key: str) -> float | None:
        """The median of `key` over this beam's pairs that measured it (its two parts answered)."""
        return median([r[key] for r in beam_pairs if key in r])

    def ratio(a, b):
        return None if a is None or not b else round(a / b, 3)

    best_tp, best_lat = ratio(svc64, ct2 and ct2["sentences_per_s"]), ratio(svc1, ct2_lat)
    svc_paired = median([r["service_c64_sentences_per_s"] for r in pairs])
    svc = svc_paired if pairs else svc64  # what the textbook-loop ratios divide
    return {
        "beam": beam,
        "service_c64_sentences_per_s": svc64,
        "service_c1_p50_ms": svc1,
        "service_many_c64_sentences_per_s": many64,
        "ct2_int8_sentences_per_s": ct2 and ct2["sentences_per_s"],
        "ct2_int8_layout": ct2
        and f"{ct2['workers']}x{max(1, ct2['threads'] // ct2['workers'])} batch {ct2['batch_size']}",
        "ct2_single_p50_ms": ct2_lat,
        "ort_int8_sentences_per_s": ort and ort["sentences_per_s"],
        "ort_int8_layout": ort
        and f"{ort['workers']}x{max(1, ort['threads'] // ort['workers'])} batch {ort['batch_size']}",
        "batcher_c64_sentences_per_s": batcher,
        "torch_eager_sentences_per_s": eager and eager["sentences_per_s"],
        # The targets' ratios: the median of the interleaved pairs when they ran (else, for results
        # of older runs, the best samples of the separate parts).
        "service_over_ct2_int8": median([r["throughput_ratio"] for r in pairs]) if pairs else best_tp,
        "latency_c1_over_ct2": median([r["latency_ratio"] for r in pairs]) if pairs else best_lat,
        "pairs": len(pairs),
        "pairs_service_c64_sentences_per_s": svc_paired,
        "pairs_ct2_int8_sentences_per_s": median([r["ct2_sentences_per_s"] for r in pairs]),
        "pairs_service_c1_p50_ms": median([r["service_c1_p50_ms"] for r in pairs]),
        "pairs_ct2_single_p50_ms": median([r["ct2_single_p50_ms"] for r in pairs]),
        # The ORT engine offline and the CTranslate2-served server against CTranslate2 (medians of
        # the pairs that measured them).
        "engine_over_ct2_int8": paired("engine_throughput_ratio"),
        "engine_latency_over_ct2": paired("engine_latency_ratio"),
        "service_over_ct2_served": paired("served_throughput_ratio"),
        "latency_c1_over_ct2_served": paired("served_latency_ratio"),
        "pairs_engine_sentences_per_s": paired("engine_sentences_per_s"),
        "pairs_engine_single_p50_ms": paired("engine_single_p50_ms"),
        "pairs_ct2_served_c64_sentences_per_s": paired("ct2_served_c64_sentences_per_s"),
        "pairs_ct2_served_c1_p50_ms": paired("ct2_served_c1_p50_ms"),
        "service_best_over_ct2_int8": best_tp,
        "latency_c1_best_over_ct2": best_lat,
        "service_default_c64_sentences_per_s": svc64_default,
        "service_default_over_ct2_int8": ratio(svc64_default, ct2 and ct2["sentences_per_s"]),
        "service_many_over_ct2_int8": ratio(many64, ct2 and ct2["sentences_per_s"]),
        "service_over_torch_eager": ratio(svc, eager and eager["sentences_per_s"]),
        "torch_eager_single_sentences_per_s": eager1 and eager1["sentences_per_s"],
        "service_over_torch_eager_single": ratio(svc, eager1 and eager1["sentences_per_s"]),
    }


def server_defaults() -> str:
    """The serving settings that shape throughput, as `mtserve serve` starts without flags."""
    from service.settings import Settings

    d = Settings()
    return (
        f"{d.precision} graphs, {d.decode_workers} decode workers x {d.intra_op_threads} intra-op thread(s), "
        f"continuous batching {'on' if d.continuous_batching else 'off'}, max batch {d.max_batch_sentences} rows / "
        f"{d.max_batch_tokens} source tokens, admit at {d.admit_fraction:g} of the batch or after "
        f"{d.admit_delay_ms:g} ms, compact at {d.compact_fraction:g}, idle-batch delay {d.max_queue_delay_ms:g} ms"
    )


def cpu_isa(text: str) -> str:
    """From /proc/cpuinfo's text: the vector extensions that decide int8 GEMM speed (one 'AMD
    EPYC' may have AVX-512 VNNI, another AVX2 only, at half the speed or less), and the CPU
    family/model."""
    if not text:
        return platform.machine()
    flags = set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))
    field = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines()[:30] if ":" in line)}
    isa = (
        "AVX-512 VNNI"
        if "avx512_vnni" in flags
        else "AVX-512"
        if "avx512f" in flags
        else "AVX-VNNI"
        if "avx_vnni" in flags
        else "AVX2"
        if "avx2" in flags
        else "no AVX2"
    )
    return f"{isa} (family {field.get('cpu family', '?')}, model {field.get('model', '?')})"


def environment(threads: int) -> dict:
    import importlib.metadata as md

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    cpu = (
        next(
            (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
            platform.processor(),
        )
        if cpuinfo
        else ""
    )
    mem = (
        next(
            (
                int(line.split()[1]) // 1024 // 1024
                for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")
            ),
            None,
        )
        if Path("/proc/meminfo").exists()
        else None
    )
    versions = {}
    for pkg in ("torch", "onnxruntime", "ctranslate2", "numpy", "grpcio", "protobuf", "tokenizers", "sacrebleu"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "isa": cpu_isa(cpuinfo),
        "cores": os.cpu_count(),
        "memory_gib": mem,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": versions,
        "thread_budget": threads,
        "commit": commit,
        "load_average": os.getloadavg(),
    }


# ----------------------------------------------------------------------------- report


def write_plot(res: dict, path: Path, beam: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    for label, rows in _online_series(res, beam).items():
        xs = [lv["sentences_per_s"] for lv in rows]
        ys = [lv["p50_ms"] for lv in rows]
        ax.plot(xs, ys, marker="o", label=f"mtserve {label}")
        for lv in rows:
            ax.annotate(
                f"c{lv['concurrency']}",
                (lv["sentences_per_s"], lv["p50_ms"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    engines = sorted({r["engine"] for r in res["offline"] if "error" not in r}, key=str)
    for eng in engines:
        # Per offline engine: one sentence at a time (its single-sentence layout), and whole batches
        # at its best layout (latency = the time of one batch at the measured throughput).
        best = best_offline(res["offline"], eng, beam)
        single = next(
            (r for r in res["offline"] if r.get("engine") == eng and r.get("beam") == beam and "latency_single" in r),
            None,
        )
        if best is None:
            continue
        xs, ys = [], []
        if single:
            lat1 = single["latency_single"]["p50_ms"]
            xs.append(1000.0 / lat1)
            ys.append(lat1)
        xs.append(best["sentences_per_s"])
        ys.append(1000.0 * min(best["batch_size"], best["sentences"]) / best["sentences_per_s"])
        ax.plot(xs, ys, marker="s" if single else "x", linestyle="--", label=f"{eng} offline")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (sentences/s)")
    ax.set_ylabel("latency p50 (ms)")
    ax.set_title(f"Latency against throughput, beam {beam} ({res['mode']} run, {res['environment']['date']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(res: dict, md: Path) -> None:
    """One latency/throughput plot per online beam: MD.png for the last (the default beam 4),
    MD-beamN.png for the others."""
    beams = res["plan"]["online_beams"]
    for b in beams:
        write_plot(res, md.with_suffix(".png") if b == beams[-1] else md.with_name(f"{md.stem}-beam{b}.png"), b)


def _online_series(res: dict, beam: int) -> dict[str, list[dict]]:
    series = {}
    for r in res.get("online", {}).get("runs", []) + res.get("sweep", []):
        if r.get("beam") == beam:
            api = "" if r.get("api", "unary") == "unary" else f" ({r['api']})"
            series[" ".join(r["server_args"]).replace("--", "") + api] = r["levels"]
    return series


def write_markdown(res: dict, path: Path, plot_name: str) -> None:
    """docs/benchmarks.md (or the quick report): its sections in order, each from its part of `res`."""
    sections = [
        _report_header(res),
        _report_what_is_measured(),
        _report_machine(res),
        _report_offline(res),
        _report_online(res),
        _report_batcher(res),
        _report_profile(res),
        _report_pairs(res),
        report_tracing(res),
        _report_headline(res, plot_name),
        report_elsewhere(),
    ]
    path.write_text("\n".join(line for section in sections for line in section))


def report_elsewhere() -> list[str]:
    """What is measured by other commands: perf_analyzer's table (docs/perf_analyzer.md, `make
    perf-analyzer`), carried into every report so that it stays beside the load generator's figures,
    and where the GPU comparison stands."""
    source = REPO / "docs" / "perf_analyzer.md"
    L = ["", "## perf_analyzer against the load generator", ""]
    text = source.read_text() if source.exists() else ""
    if "## Measured" in text:
        measured = text.split("## Measured", 1)[1].split("\n## ", 1)[0].strip()
        L += [
            "Triton's `perf_analyzer`, unchanged, against the server's KServe endpoint, beside "
            "`benchmarks/online.py` on the same server and levels (`make perf-analyzer`; from "
            "[perf_analyzer.md](perf_analyzer.md), which says how it runs):",
            "",
            measured,
        ]
    else:
        L.append("`make perf-analyzer` writes [perf_analyzer.md](perf_analyzer.md).")
    L += [
        "",
        "## Several models",
        "",
        "Fairness between two models (a c1 client on one while 64 clients flood the other, "
        "`benchmarks/fairness.py`) and hot swap under load (`benchmarks/hot_swap.py`): how they run is in "
        "[repository.md](repository.md), the figures in [performance.md](performance.md#several-models).",
        "",
        "## GPU",
        "",
        "The CUDA comparison (the fp16 graphs on CUDA against CTranslate2 float16) is still to be run: "
        '[performance.md](performance.md) ("GPU") says what it needs.',
        "",
    ]
    return L


def report_tracing(res: dict) -> list[str]:
    t = res.get("tracing")
    if not t:
        return []
    return [
        "## Tracing",
        "",
        f"The server at concurrency {t['concurrency']}, beam {t['beam']}, {t['requests']} requests, with OpenTelemetry "
        f"off and with every request traced (OTLP/gRPC to a receiver on loopback), {t['pairs']} pair(s), order "
        f"alternating (`benchmarks/tracing_overhead.py`): {t['off_sentences_per_s']:.1f} against "
        f"{t['on_sentences_per_s']:.1f} sent/s (medians); overhead {100 * t['overhead']:.1f}% of throughput, "
        f"{100 * t['cpu_overhead']:.1f}% of the server's CPU per request (negative: within the noise).",
        "",
    ]


def _report_header(res: dict) -> list[str]:
    L = [
        f"# Benchmarks ({res['mode']} run)",
        "",
        "Generated by `benchmarks/run.py` (`make bench`; `make bench-quick` for the short mode). Do not edit by hand: "
        "rerun it.",
        "",
    ]
    if res.get("note"):
        L += [f"> **{res['note']}**", ""]
    return L


def _report_what_is_measured() -> list[str]:
    return [
        "## What is measured",
        "",
        "- **Offline** (one process per engine, `benchmarks/offline.py`): the test sentences sorted by length into "
        "batches, timed after a warm-up. `torch-eager` is the textbook loop without a cache (every step runs "
        "`Transformer.decode` over the whole prefix), over batches and at batch 1 (one sentence at a time); `torch-cache` is the reference search of `export/generate.py`; "
        "`ort-*` is `service.decoding.generator.generate` over the ONNX graphs (what the server runs, without the server); "
        "`ct2-*` is CTranslate2 over the same weights (`benchmarks/ct2_convert.py`). Layout `W x T`: W decode loops "
        "(CTranslate2: `inter_threads`) of T threads each. Single-sentence latency: one sentence per call.",
        "- **Online** (`benchmarks/online.py`): `mtserve serve` on loopback, a grpc.aio client keeps N single-sentence "
        "`Translate` requests in flight (API `unary`), or the same requests as items of one `TranslateMany` stream "
        "(API `many`); warm-up of 2N requests not counted; the client shares the cores.",
        "- **Batcher** (`benchmarks/batcher.py`): the same scheduler and decode workers in one process with no gRPC, "
        "64 sentences in flight: what batching arrivals of mixed length costs, apart from the RPC layer.",
        "- **Pairs** (`run_pairs`): CTranslate2 int8 offline and the server (a replica per core with one decode "
        "worker each, `--replicas 2 --decode-workers 1` on 2 cores) at concurrency 64 "
        "and 1, one right after the other on the same sentences, several times per beam: the headline ratios. "
        "In the same pairs, the ORT int8 engine offline, and the same server decoding with CTranslate2 int8 "
        "(`benchmarks/ct2_server.py`, the server's front on a CTranslate2 backend) at concurrency 64 and 1.",
        "- **Target tokens**: generated subword tokens, `</s>` included.",
        "",
    ]


def _report_machine(res: dict) -> list[str]:
    """The machine, the versions and the settings; the conversion check and the agreements."""
    env = res["environment"]
    L = [
        "## Machine and settings",
        "",
        f"- date: {env['date']}, commit `{env['commit']}`",
        f"- CPU: {env['cpu']}, {env.get('isa', '')}, {env['cores']} cores, {env['memory_gib']} GiB; load average at start "
        f"{', '.join(f'{x:.1f}' for x in env['load_average'])}",
        f"- Python {env['python']}; " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- thread budget: {env['thread_budget']} threads for every engine; test set test_2016_flickr "
        f"(Multi30k), model models/de-en/1 (fp32 weights; int8 = dynamic quantisation at export/load)",
        f"- sentences per offline engine: {json.dumps(res['plan']['limits'])} (0 = all 1,000)",
        "",
    ]
    chk = res.get("ct2_check")
    if chk:
        L += [
            f"CTranslate2 conversion check (greedy, token for token against {chk['against']}): "
            f"**{chk['identical']} / {chk['sentences']} identical**.",
            "",
        ]
    for a in res.get("agreement", []):
        if a:
            L.append(f"- agreement {a['a']} vs {a['b']}: {a['identical']} / {a['sentences']} identical")
    return L


def _report_offline(res: dict) -> list[str]:
    L = [
        "",
        "## Offline",
        "",
        "| engine | beam | layout (loops x threads) | batch | sentences | sent/s | target tok/s | BLEU | single-sentence p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["offline"]:
        if "error" in r:
            L.append(f"| {r['engine']} | {r['beam']} | {r['workers']} | {r['batch_size']} | failed | | | | |")
            continue
        lat = r.get("latency_single", {}).get("p50_ms", "")
        L.append(
            f"| {r['engine']} | {r['beam']} | {r['workers']}x{max(1, r['threads'] // r['workers'])} | "
            f"{r['batch_size']} | {r['sentences']} | {r['sentences_per_s']:.1f} | {r['target_tokens_per_s']:.0f} | "
            f"{r['bleu']:.2f} | {lat} |"
        )
    L += [
        "",
        "BLEU is sacreBLEU (13a, cased) over the sentences translated; it is comparable between rows only "
        "when they translated the same sentences.",
        "",
    ]
    return L


def _report_online(res: dict) -> list[str]:
    L = [
        "## Online (mtserve serve on loopback, async gRPC client, one sentence per request)",
        "",
        "| beam | API | server flags | concurrency | requests | errors | sent/s | target tok/s | p50 ms | p95 ms | p99 ms "
        "| BLEU | CPU cores: server / client |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res.get("online", {}).get("runs", []) + [dict(s, sweep=True) for s in res.get("sweep", [])]:
        flags = " ".join(r["server_args"]) + (" (sweep)" if r.get("sweep") else "")
        for lv in r["levels"]:
            L.append(
                f"| {r['beam']} | {r.get('api', 'unary')} | `{flags}` | {lv['concurrency']} | {lv['requests']} | "
                f"{sum(lv['errors'].values()) if lv['errors'] else 0} | {lv['sentences_per_s']:.1f} | "
                f"{lv['target_tokens_per_s']:.0f} | {lv['p50_ms']:.1f} | {lv['p95_ms']:.1f} | {lv['p99_ms']:.1f} | "
                f"{lv['bleu']} | {lv.get('server_cpu_cores', '')} / {lv.get('client_cpu_cores', '')} |"
            )
    L += [
        "",
        f"Server defaults (flags not listed): {res.get('server_defaults', '')}. The load generator runs on "
        "the same cores as the server; the last column is the CPU each process used during the level.",
        "",
    ]
    return L


def _report_batcher(res: dict) -> list[str]:
    """The batcher alone, and the step-by-step gap to CTranslate2; nothing without a batcher part."""
    if not res.get("batcher"):
        return []
    L = [
        "## The batcher alone (in-process, no gRPC)",
        "",
        "`benchmarks/batcher.py`: the server's scheduler and decode workers (default layout) in one process, "
        "64 sentences in flight, each answer submitting the next test sentence; no RPC, no protobuf, no client "
        "process. Step figures are from the scheduler's own metrics.",
        "",
        "| beam | continuous batching | sentences | sent/s | CPU cores | p50 ms | p99 ms | rows/step | ms/step "
        "| µs/row-step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["batcher"]:
        if "error" in r:
            L.append(f"| {r['beam']} | {'on' if r['continuous_batching'] else 'off'} | failed | | | | | | | |")
            continue
        L.append(
            f"| {r['beam']} | {'on' if r['continuous_batching'] else 'off'} | {r['sentences']} | "
            f"{r['sentences_per_s']:.1f} | {r['cpu_cores']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['rows_per_step']} | {r['ms_per_step']} | {r['us_per_row_step']} |"
        )
    L += [
        "",
        "Where the gap to CTranslate2 is, step by step (best layout or mode of each, sent/s):",
        "",
        "| beam | CT2 int8 offline | ORT int8 offline (sorted batches) | batcher c64 (mixed arrivals) | "
        "service c64 TranslateMany | service c64 Translate (gRPC, client on the same cores) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for s in res["summary_by_beam"]:
        L.append(
            f"| {s['beam']} | {s['ct2_int8_sentences_per_s']} ({s['ct2_int8_layout']}) | "
            f"{s.get('ort_int8_sentences_per_s')} ({s.get('ort_int8_layout')}) | "
            f"{s.get('batcher_c64_sentences_per_s')} | {s.get('service_many_c64_sentences_per_s')} | "
            f"{s['service_c64_sentences_per_s']} |"
        )
    L.append("")
    return L


def _report_profile(res: dict) -> list[str]:
    """Where the server's time goes (py-spy); nothing without a profile."""
    if not res.get("profile"):
        return []
    pr = res["profile"]
    L = [
        "## Where the server's time goes",
        "",
        f"py-spy, {pr['seconds']} s at concurrency {pr['concurrency']}, beam {pr['beam']}, "
        f"{pr['samples']} busy samples (all threads):",
        "",
        "| bucket | share |",
        "| --- | --- |",
    ]
    L += [f"| {k} | {100 * v:.1f}% |" for k, v in pr["share"].items()]
    L.append("")
    return L


def _report_pairs(res: dict) -> list[str]:
    """The interleaved pairs, one row each; nothing without pairs."""
    pairs = res.get("pairs", [])
    if not pairs:
        return []
    L = [
        "## Headline ratios in interleaved pairs",
        "",
        "Each pair runs CTranslate2 int8 offline (its best layout from the offline part; single-sentence latency "
        "with 1 thread) and the server (a replica per core, one decode worker each) at concurrency 64 and 1 "
        "over 8 client connections, on the same sentences, one "
        "right after the other, alternating which goes first. The targets' ratios are the medians of the "
        "per-pair ratios.",
        "",
        "| beam | pair | service c64 sent/s | CT2 int8 sent/s | ratio | service c1 p50 ms | CT2 single p50 ms | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in pairs:
        if "error" in r:
            L.append(f"| {r['beam']} | {r['pair']} | failed | | | | | |")
            continue
        L.append(
            f"| {r['beam']} | {r['pair']} | {r['service_c64_sentences_per_s']:.1f} | {r['ct2_sentences_per_s']:.1f} | "
            f"{r['throughput_ratio']:.3f} | {r['service_c1_p50_ms']:.1f} | {r['ct2_single_p50_ms']:.1f} | "
            f"{r['latency_ratio']:.3f} |"
        )
    L.append("")
    if not any(k in r for r in pairs for k in ("engine_sentences_per_s", "ct2_served_c64_sentences_per_s")):
        return L  # results from before the ORT engine and the CTranslate2-served server were paired
    L += [
        "In the same pairs, the ORT int8 engine offline (`service.decoding.generator` over the same sentences, "
        "its best layout from the offline part; single-sentence latency with 1 thread) against CTranslate2 int8 "
        "offline, and the server against the same server decoding with CTranslate2 int8 "
        "(`benchmarks/ct2_server.py`: the same gRPC front, Engine and limits, CTranslate2's best offline layout "
        "and batch size) under the same load generator (blank: that part failed):",
        "",
        "| beam | pair | ORT engine sent/s | CT2 int8 sent/s | ratio | ORT engine single p50 ms | CT2 single p50 ms "
        "| ratio | service c64 sent/s | CT2-served c64 sent/s | ratio | service c1 p50 ms | CT2-served c1 p50 ms "
        "| ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else ""

    for r in pairs:
        cols = [
            ("engine_sentences_per_s", ".1f"),
            ("ct2_sentences_per_s", ".1f"),
            ("engine_throughput_ratio", ".3f"),
            ("engine_single_p50_ms", ".1f"),
            ("ct2_single_p50_ms", ".1f"),
            ("engine_latency_ratio", ".3f"),
            ("service_c64_sentences_per_s", ".1f"),
            ("ct2_served_c64_sentences_per_s", ".1f"),
            ("served_throughput_ratio", ".3f"),
            ("service_c1_p50_ms", ".1f"),
            ("ct2_served_c1_p50_ms", ".1f"),
            ("served_latency_ratio", ".3f"),
        ]
        L.append(f"| {r['beam']} | {r['pair']} | " + " | ".join(cell(r, k, f) for k, f in cols) + " |")
    L.append("")
    return L


def _report_headline(res: dict, plot_name: str) -> list[str]:
    """The headline ratios per beam, what they divide, and the plots."""
    L = [
        "## Headline ratios",
        "",
        "| beam | service / CT2 int8 (target >= 1.0) | c1 latency / CT2 (target <= 1.5) | "
        "service / torch eager, batched | service / torch eager, one sentence at a time (target >= 30) | "
        "best samples: service c64 / CT2 int8 | default layout, main levels / CT2 int8 | TranslateMany c64 / CT2 int8 | "
        "best samples: service c1 / CT2 single | ORT engine / CT2 int8, offline | ORT engine single / CT2 single "
        "| service c64 / CT2-served c64 | service c1 / CT2-served c1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in res["summary_by_beam"]:
        L.append(
            f"| {s['beam']} | **{s['service_over_ct2_int8']}** | **{s['latency_c1_over_ct2']}** | "
            f"{s['service_over_torch_eager']} | **{s.get('service_over_torch_eager_single')}** | "
            f"{s['service_c64_sentences_per_s']} / {s['ct2_int8_sentences_per_s']} ({s['ct2_int8_layout']}) "
            f"= {s.get('service_best_over_ct2_int8')} | "
            f"{s.get('service_default_c64_sentences_per_s')} → {s.get('service_default_over_ct2_int8')} | "
            f"{s.get('service_many_over_ct2_int8')} | "
            f"{s['service_c1_p50_ms']} / {s['ct2_single_p50_ms']} = {s.get('latency_c1_best_over_ct2')} | "
            + " | ".join(
                "not measured" if s.get(k) is None else str(s[k])
                for k in (
                    "engine_over_ct2_int8",
                    "engine_latency_over_ct2",
                    "service_over_ct2_served",
                    "latency_c1_over_ct2_served",
                )
            )
            + " |"
        )
    L += [
        "",
        "The first two columns are the medians of the interleaved pairs above (for results without pairs, the "
        "best samples). The textbook-loop ratios divide the pairs' median service throughput (or the best sample) "
        'by the PyTorch loop without a cache, run over length-sorted batches of 64 ("batched") and one sentence '
        'at a time as the Annotated Transformer does (the issue\'s ~20 sent/s reference). "best samples": the best '
        "service figure over the online levels and the sweep, against CTranslate2's figures from the offline part "
        '(minutes apart: on a drifting machine they read high or low). "TranslateMany" sends the same sentences '
        "as items of one stream. The last four columns are the medians of the pairs' second table: the ORT engine "
        "offline against CTranslate2 offline (sent/s, and single-sentence p50 with 1 thread each), and the server "
        "against the same server decoding with CTranslate2 (c64 sent/s, c1 p50). "
        "Where the time goes and why: [performance.md](performance.md).",
        "",
        f"![latency against throughput, beam 4]({plot_name})",
        "",
    ]
    for b in res["plan"]["online_beams"][:-1]:
        L += [f"![latency against throughput, beam {b}]({Path(plot_name).stem}-beam{b}.png)", ""]
    return L


# The last line's keys: the ratios, for the default beam and per beam (`by_beam`); then the
# figures they divide, for the default beam.
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


def tracing_figures(tracing: dict | None) -> dict:
    if not tracing:
        return {}
    return {
        "service_c64_tracing_off_sentences_per_s": tracing["off_sentences_per_s"],
        "service_c64_tracing_on_sentences_per_s": tracing["on_sentences_per_s"],
        "tracing_overhead": tracing["overhead"],
    }


def headline(res: dict, head_beam: int) -> dict:
    """The JSON object of the last line: `head_beam`'s ratios and figures at the top level, every
    beam's ratios under `by_beam`."""
    head = next(s for s in res["summary_by_beam"] if s["beam"] == head_beam)
    return {
        "mode": res["mode"],
        "beam": head_beam,
        **{k: head.get(k) for k in HEADLINE_RATIOS + HEADLINE_FIGURES},
        "by_beam": {str(s["beam"]): {k: s.get(k) for k in HEADLINE_RATIOS} for s in res["summary_by_beam"]},
        "ct2_greedy_identical": f"{res['ct2_check']['identical']}/{res['ct2_check']['sentences']}",
        # c64 at the head beam with OpenTelemetry off and with every request traced (OTLP to loopback)
        **tracing_figures(res.get("tracing")),
        # offline sentences per engine (0 = all 1,000): quick-mode ratios come from subsets
        "offline_sentences": res["plan"]["limits"],
    }


# ----------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short mode (about 3 minutes)")
    ap.add_argument("--model", default="models/de-en/1")
    ap.add_argument("--threads", type=int, default=2, help="thread budget of every engine")
    ap.add_argument(
        "--skip", default="", help="comma-separated parts to skip: offline,online,batcher,sweep,pairs,tracing"
    )
    ap.add_argument("--profile", action="store_true", help="also profile the server with py-spy at concurrency 64")
    ap.add_argument("--docs", action="store_true", help="write docs/benchmarks.md and .png even for --quick")
    ap.add_argument("--note", default="", help="a line for the top of the report (e.g. the machine was busy)")
    ap.add_argument(
        "--report",
        metavar="RESULTS_JSON",
        help="only write the report and plot again from an earlier results file (with --docs: to docs/)",
    )
    args = ap.parse_args()
    if args.report:
        res = json.loads(Path(args.report).read_text())
        if args.note:
            res["note"] = args.note
        res["summary_by_beam"] = [summarize(res, s["beam"]) for s in res["summary_by_beam"]]  # today's summary
        md = REPO / "docs" / "benchmarks.md" if res["mode"] == "full" or args.docs else RESULTS / f"{res['mode']}.md"
        write_plots(res, md)
        write_markdown(res, md, md.with_suffix(".png").name)
        log(f"wrote {md} and {md.with_suffix('.png')}")
        return
    t_start = time.time()
    mode = "quick" if args.quick else "full"
    p = plan(args.quick)
    skip = set(filter(None, args.skip.split(",")))
    model = str((REPO / args.model).resolve()) if not Path(args.model).is_absolute() else args.model
    if not (Path(model) / "onnx" / "manifest.json").exists():
        log("exporting the ONNX graphs first (mtserve export --precision all)")
        subprocess.run(
            [sys.executable, "-m", "mtserve", "export", "--model", model, "--precision", "all"], check=True, cwd=REPO
        )

    from export.data import DEFAULT_DATA_DIR, read_parallel

    texts, refs = read_parallel(DEFAULT_DATA_DIR, "test_2016_flickr")
    res: dict = {
        "mode": mode,
        "note": args.note,
        "environment": environment(args.threads),
        "plan": dict(p),
        "offline": [],
        "agreement": [],
    }
    limit = p["limits"]["default"]
    log(f"CTranslate2 conversion check on {limit or 'all'} sentences")
    res["ct2_check"] = ct2_greedy_check(model, limit)
    log(f"  CT2 float32 greedy identical to ours: {res['ct2_check']['identical']} / {res['ct2_check']['sentences']}")

    with tempfile.TemporaryDirectory(prefix="mtserve-bench-") as tmp:
        if "offline" not in skip:
            log("offline")
            res["offline"], hyps = run_offline(p, args.threads, model, Path(tmp))
            for beam in p["beams"]:
                res["agreement"] += [
                    agreement(hyps, ("ct2-float32", beam), ("ort-fp32", beam)),
                    agreement(hyps, ("ort-fp32", beam), ("torch-cache", beam)),
                    agreement(hyps, ("torch-eager", beam), ("torch-cache", beam)),
                    agreement(hyps, ("ct2-int8", beam), ("ort-int8", beam)),
                ]
    if "online" not in skip:
        res["online"] = run_online(p, model, texts, refs)
    if "batcher" not in skip:
        res["batcher"] = run_batcher(p, model)
    if "sweep" not in skip:
        res["sweep"] = run_sweep(p, model, texts, refs, beam=p["online_beams"][-1])
    if "pairs" not in skip:
        res["pairs"] = run_pairs(p, model, args.threads, texts, refs, res["offline"], DEFAULT_DATA_DIR)
    if "tracing" not in skip:
        log(f"tracing: c64 with OpenTelemetry off and with every request traced, {p['tracing_pairs']} pair(s)")
        res["tracing"] = tracing_overhead.measure(
            model, texts, refs, 64, p["online_beams"][-1], p["tracing_requests"], p["tracing_pairs"], log=log
        )
    if args.profile:
        from benchmarks.profile_server import profile

        log(f"profile: py-spy {p['profile_seconds']} s at concurrency 64")
        try:
            res["profile"] = profile(model, texts, refs, 64, p["profile_seconds"], p["online_beams"][-1], [])
            log("  " + json.dumps(res["profile"]["share"]))
        except RuntimeError as e:
            log(f"  profile failed: {e}")
    res["summary_by_beam"] = [summarize(res, b) for b in p["online_beams"]]
    res["server_defaults"] = server_defaults()
    res["seconds"] = round(time.time() - t_start, 1)

    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    blob = json.dumps(res, indent=1, default=str)
    (RESULTS / f"{mode}-{stamp}.json").write_text(blob)
    (RESULTS / f"{mode}-latest.json").write_text(blob)
    to_docs = mode == "full" or args.docs
    md = REPO / "docs" / "benchmarks.md" if to_docs else RESULTS / "quick.md"
    png = md.with_suffix(".png")
    head_beam = p["online_beams"][-1]  # the service's default beam (4)
    try:
        write_plots(res, md)
    except ImportError:
        log("matplotlib missing: no plot (pip install -e '.[bench]')")
    write_markdown(res, md, png.name)
    log(f"wrote {RESULTS / f'{mode}-{stamp}.json'}, {md}, {png} in {res['seconds']} s")
    print(json.dumps(headline(res, head_beam)))


if __name__ == "__main__":
    main()
