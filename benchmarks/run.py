"""The benchmark suite, side by side on one machine and one thread budget (`make bench`,
`make bench-quick`):

    python -m benchmarks.run            # everything, all 1,000 test sentences (15-30 minutes on 2 cores)
    python -m benchmarks.run --quick    # short mode (about 3 minutes): subsets, fewer requests

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
6. The real-size part (benchmarks/real_size.py; `--no-real-size` skips it): a random OPUS-MT-sized
   model on the engine, the server, CTranslate2, optimum and PyTorch, every engine forced to 30
   target tokens a sentence; its ratios go to the last line under `real_size`.

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
  real_size                 the real-size part's `summary` (benchmarks/real_size.py): per beam
                            engine_over_ct2_int8, engine_latency_over_ct2, service_over_ct2_int8
                            (c64), latency_c1_over_ct2, engine_over_hf and the figures behind
                            them; peak_rss_mb of every engine's process
The ratios are given for beam 4 at the top level and for every beam under `by_beam`.

The code, by what it does: benchmarks/plan.py (what each mode measures: `Plan`),
benchmarks/runners.py (the parts), benchmarks/summary.py (a `Summary` per beam and the last line),
benchmarks/report.py (the Markdown report and the plots), benchmarks/machine.py (the machine and
versions a run records); this module strings them together.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import tracing_overhead
from benchmarks.machine import environment, server_defaults
from benchmarks.plan import Plan, plan
from benchmarks.report import write_markdown, write_plots
from benchmarks.runners import (
    agreement,
    ct2_greedy_check,
    log,
    run_batcher,
    run_offline,
    run_online,
    run_pairs,
    run_sweep,
)
from benchmarks.summary import Results, headline, summarize

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PARTS = ("offline", "online", "batcher", "sweep", "pairs", "tracing", "real_size")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short mode (about 3 minutes)")
    ap.add_argument("--model", default="models/de-en/1")
    ap.add_argument("--threads", type=int, default=2, help="thread budget of every engine")
    ap.add_argument("--skip", default="", help=f"comma-separated parts to skip: {','.join(PARTS)}")
    ap.add_argument("--profile", action="store_true", help="also profile the server with py-spy at concurrency 64")
    ap.add_argument(
        "--no-real-size",
        action="store_true",
        help="skip the real-size part (benchmarks/real_size.py; = --skip real_size)",
    )
    ap.add_argument("--docs", action="store_true", help="write docs/benchmarks.md and .png even for --quick")
    ap.add_argument("--note", default="", help="a line for the top of the report (e.g. the machine was busy)")
    ap.add_argument(
        "--report",
        metavar="RESULTS_JSON",
        help="only write the report and plot again from an earlier results file (with --docs: to docs/)",
    )
    return ap.parse_args(argv)


def report_again(results_json: str, note: str, docs: bool) -> None:
    """The report and plots of an earlier results file, with today's summary."""
    res: Results = json.loads(Path(results_json).read_text())
    if note:
        res["note"] = note
    res["summary_by_beam"] = [summarize(res, s["beam"]) for s in res["summary_by_beam"]]
    md = REPO / "docs" / "benchmarks.md" if res["mode"] == "full" or docs else RESULTS / f"{res['mode']}.md"
    write_plots(res, md)
    write_markdown(res, md, md.with_suffix(".png").name)
    log(f"wrote {md} and {md.with_suffix('.png')}")


def exported_model(model_arg: str) -> str:
    """The model directory (relative to the repository), its ONNX graphs exported first when missing."""
    model = str((REPO / model_arg).resolve()) if not Path(model_arg).is_absolute() else model_arg
    if not (Path(model) / "onnx" / "manifest.json").exists():
        log("exporting the ONNX graphs first (mtserve export --precision all)")
        subprocess.run(
            [sys.executable, "-m", "mtserve", "export", "--model", model, "--precision", "all"], check=True, cwd=REPO
        )
    return model


def measure_offline(res: Results, p: Plan, threads: int, model: str, skip: set[str]) -> None:
    """The CTranslate2 conversion check, then (unless skipped) the offline engines and their agreement."""
    limit = p.limits["default"]
    log(f"CTranslate2 conversion check on {limit or 'all'} sentences")
    res["ct2_check"] = ct2_greedy_check(model, limit)
    log(f"  CT2 float32 greedy identical to ours: {res['ct2_check']['identical']} / {res['ct2_check']['sentences']}")
    if "offline" in skip:
        return
    with tempfile.TemporaryDirectory(prefix="mtserve-bench-") as tmp:
        log("offline")
        res["offline"], hyps = run_offline(p, threads, model, Path(tmp))
    for beam in p.beams:
        res["agreement"] += [
            agreement(hyps, ("ct2-float32", beam), ("ort-fp32", beam)),
            agreement(hyps, ("ort-fp32", beam), ("torch-cache", beam)),
            agreement(hyps, ("torch-eager", beam), ("torch-cache", beam)),
            agreement(hyps, ("ct2-int8", beam), ("ort-int8", beam)),
        ]


def measure_served(res: Results, p: Plan, threads: int, model: str, skip: set[str], profile: bool) -> None:
    """The parts that run the server (or its scheduler), each unless skipped; the profile when asked."""
    from export.data import DEFAULT_DATA_DIR, read_parallel

    texts, refs = read_parallel(DEFAULT_DATA_DIR, "test_2016_flickr")
    head_beam = p.online_beams[-1]
    if "online" not in skip:
        res["online"] = run_online(p, model, texts, refs)
    if "batcher" not in skip:
        res["batcher"] = run_batcher(p, model)
    if "sweep" not in skip:
        res["sweep"] = run_sweep(p, model, texts, refs, beam=head_beam)
    if "pairs" not in skip:
        res["pairs"] = run_pairs(p, model, threads, texts, refs, res["offline"], DEFAULT_DATA_DIR)
    if "tracing" not in skip:
        log(f"tracing: c64 with OpenTelemetry off and with every request traced, {p.tracing_pairs} pair(s)")
        res["tracing"] = tracing_overhead.measure(
            model, texts, refs, 64, head_beam, p.tracing_requests, p.tracing_pairs, log=log
        )
    if profile:
        from benchmarks.profile_server import profile as py_spy

        log(f"profile: py-spy {p.profile_seconds} s at concurrency 64")
        try:
            res["profile"] = py_spy(model, texts, refs, 64, p.profile_seconds, head_beam, [])
            log("  " + json.dumps(res["profile"]["share"]))
        except RuntimeError as e:
            log(f"  profile failed: {e}")


def write_results(res: Results, to_docs: bool) -> None:
    """benchmarks/results/MODE-DATE.json and MODE-latest.json, the report and its plots."""
    mode = res["mode"]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    blob = json.dumps(res, indent=1, default=str)
    (RESULTS / f"{mode}-{stamp}.json").write_text(blob)
    (RESULTS / f"{mode}-latest.json").write_text(blob)
    md = REPO / "docs" / "benchmarks.md" if to_docs else RESULTS / "quick.md"
    png = md.with_suffix(".png")
    try:
        write_plots(res, md)
    except ImportError:
        log("matplotlib missing: no plot (pip install -e '.[bench]')")
    write_markdown(res, md, png.name)
    log(f"wrote {RESULTS / f'{mode}-{stamp}.json'}, {md}, {png} in {res['seconds']} s")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:
        report_again(args.report, args.note, args.docs)
        return
    t_start = time.time()
    mode = "quick" if args.quick else "full"
    p = plan(args.quick)
    model = exported_model(args.model)
    res: Results = {
        "mode": mode,
        "note": args.note,
        "environment": environment(args.threads),
        "plan": dataclasses.asdict(p),
        "offline": [],
        "agreement": [],
    }
    skip = set(filter(None, args.skip.split(","))) | ({"real_size"} if args.no_real_size else set())
    measure_offline(res, p, args.threads, model, skip)
    measure_served(res, p, args.threads, model, skip, args.profile)
    if "real_size" not in skip:
        from benchmarks import real_size

        log("real size: the OPUS-MT-sized model on every engine (benchmarks/real_size.py)")
        try:
            res["real_size"] = real_size.measure(real_size.quick_plan() if args.quick else real_size.full_plan())
        except (RuntimeError, OSError, subprocess.CalledProcessError) as e:  # keep the other parts' results
            log(f"  real size failed: {e}")
            res["real_size_error"] = str(e)[-500:]
    res["summary_by_beam"] = [summarize(res, b) for b in p.online_beams]
    res["server_defaults"] = server_defaults()
    res["seconds"] = round(time.time() - t_start, 1)
    write_results(res, to_docs=mode == "full" or args.docs)
    print(json.dumps(headline(res, p.online_beams[-1])))  # the head beam: the service's default (4)


if __name__ == "__main__":
    main()
