"""Server layouts at real size: `mtserve serve` on the real-size model (benchmarks/real_size_model.py)
in each layout of LAYOUTS, all started at once, then `rounds` rounds of concurrency-64 runs per
beam (benchmarks/real_size.py's `server_level`: 30 forced tokens a sentence), the layouts and
CTranslate2 int8 offline (at its faster ISA) in a rotated order each round:

    .venv/bin/python -m benchmarks.real_size_layouts
    .venv/bin/python -m benchmarks.real_size_layouts --layout workers --layout replicas

Per layout and beam: the median sentences/s and its ratio to CTranslate2's, the server's CPU
milliseconds a sentence against CTranslate2's (less disturbed by other load on the machine than
sentences/s), and over each whole run (the load generator's warm-up, its lead and tail around the
measured requests: `benchmarks.online`, 4 x 64 requests more), from the server's metrics, the
mean rows of a decoder step and the share of the wall time its decode workers spent in encoder and
decoder runs (summed over workers: 2.0 = two workers busy throughout), and the load generator's CPU
seconds a second. Per layout: its peak RSS (VmHWM: the largest process, and all
its processes) after its warm-up and after the runs. The last line printed is the JSON of it all.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.machine import machine
from benchmarks.processes import Server, free_port, process_cpu_s
from benchmarks.real_size import RealSizePlan, Worker, fastest, log, server_level, server_rss_mb, worker
from benchmarks.real_size_model import DATA, prepare
from benchmarks.real_size_worker import read_test

Row = dict[str, Any]
CONCURRENCY = 64  # the clients of a run
LAYOUTS = {
    "replicas": ["--replicas", "2", "--decode-workers", "1"],  # 2 processes x 1 worker, 1 thread
    "workers": ["--decode-workers", "2", "--intra-op-threads", "1"],  # 1 process x 2 workers sharing sessions
    "threads": ["--decode-workers", "1", "--intra-op-threads", "2"],  # 1 process x 1 worker x 2 threads
    # 1 process x 2 workers, an idle worker waiting up to 10 ms for its batch to fill
    "workers-delay10": ["--decode-workers", "2", "--intra-op-threads", "1", "--max-queue-delay-ms", "10"],
    # an idle worker waits up to 20 / 50 / 100 ms for its share, counting the rows just answered
    "workers-wait20": ["--decode-workers", "2", "--intra-op-threads", "1", "--max-queue-delay-ms", "20"],
    "workers-wait50": ["--decode-workers", "2", "--intra-op-threads", "1", "--max-queue-delay-ms", "50"],
    "workers-wait100": ["--decode-workers", "2", "--intra-op-threads", "1", "--max-queue-delay-ms", "100"],
    "workers-b128": ["--decode-workers", "2", "--intra-op-threads", "1", "--max-batch-sentences", "128"],
    # an idle worker waits 10 ms for the burst a finished batch's clients send (a step is 40-90 ms)
    "workers-b128-wait10": [
        *("--decode-workers", "2", "--intra-op-threads", "1", "--max-batch-sentences", "128"),
        *("--max-queue-delay-ms", "10"),
    ],
    "workers-continuous": ["--decode-workers", "2", "--intra-op-threads", "1", "--continuous-batching"],
    "workers-b128-continuous": [
        *("--decode-workers", "2", "--intra-op-threads", "1", "--max-batch-sentences", "128"),
        "--continuous-batching",
    ],
}
BUSY = ("mtserve_encoder_duration_seconds_sum", "mtserve_decoder_step_duration_seconds_sum")
ROWS = ("mtserve_decode_batch_rows_sum", "mtserve_decode_batch_rows_count")


def scrape(port: int) -> dict[str, float]:
    """The server's /metrics samples of BUSY and ROWS, summed over labels (replicas, models)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = dict.fromkeys((*BUSY, *ROWS), 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in out:
                out[s.name] += s.value
    return out


def served_run(srv: Server, port: int, texts: list[str], plan: RealSizePlan, beam: int) -> Row:
    """One c64 run: sentences/s, and over the whole run (warm-up, lead and tail included) the mean
    rows of a step, the server's CPU a sentence, the workers' busy share and the client's CPU."""
    before, cpu, t0 = scrape(port), resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    server_cpu = process_cpu_s(srv.pid)
    row = server_level(srv.address, texts, plan, beam, CONCURRENCY)
    wall, server_cpu = time.perf_counter() - t0, process_cpu_s(srv.pid) - server_cpu
    after, cpu_after = scrape(port), resource.getrusage(resource.RUSAGE_SELF)
    d = {k: after[k] - before[k] for k in after}
    client_cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu.ru_utime + cpu.ru_stime)
    return {
        "sentences_per_s": row["sentences_per_s"],
        # the load generator's warm-up (2 x C), lead (C) and tail (C) around the measured requests
        "cpu_ms_per_sentence": round(1000 * server_cpu / (plan.requests + 4 * CONCURRENCY), 1),
        "rows_per_step": round(d[ROWS[0]] / max(d[ROWS[1]], 1), 1),
        "busy": round(sum(d[k] for k in BUSY) / wall, 2),
        "client_cpu": round(client_cpu / wall, 2),
    }


def ct2_run(ct2: Worker, plan: RealSizePlan, beam: int) -> Row:
    """CTranslate2 offline: sentences/s, and its CPU over the run and the worker's 8-sentence warm-up."""
    n, cpu = plan.sentences[beam], process_cpu_s(ct2.proc.pid)
    answer = ct2.ask(op="offline", beam=beam, tokens=plan.tokens, sentences=n)
    cpu = process_cpu_s(ct2.proc.pid) - cpu
    return {"sentences_per_s": answer["sentences_per_s"], "cpu_ms_per_sentence": round(1000 * cpu / (n + 8), 1)}


def rotate(names: list[str], r: int) -> list[str]:
    return names[r % len(names) :] + names[: r % len(names)]


def measure_beam(
    servers: dict[str, tuple[Server, int]], ct2: Worker, texts: list[str], plan: RealSizePlan, beam: int
) -> Row:
    """Warm-up runs, then `plan.rounds` rotated rounds of every layout and CTranslate2."""
    for srv, port in servers.values():
        served_run(srv, port, texts, plan, beam)
    runs: dict[str, list[Row]] = {name: [] for name in [*servers, "ct2"]}
    for r in range(plan.rounds):
        for name in rotate(list(runs), r):
            if name == "ct2":
                runs[name].append(ct2_run(ct2, plan, beam))
            else:
                runs[name].append(served_run(*servers[name], texts, plan, beam))
    ct2_median = statistics.median(x["sentences_per_s"] for x in runs["ct2"])
    out: Row = {
        "ct2_int8_sentences_per_s": ct2_median,
        "ct2_cpu_ms_per_sentence": statistics.median(x["cpu_ms_per_sentence"] for x in runs["ct2"]),
    }
    for name in servers:
        figs = {k: statistics.median(x[k] for x in runs[name]) for k in runs[name][0]}
        out[name] = {
            **figs,
            "over_ct2": round(figs["sentences_per_s"] / ct2_median, 3),
            "ct2_cpu_over_cpu": round(out["ct2_cpu_ms_per_sentence"] / figs["cpu_ms_per_sentence"], 3),
            "runs": runs[name],
        }
        log(f"beam {beam} {name}: {figs} -> {out[name]['over_ct2']} of CT2 {ct2_median}")
    return out


def measure(names: list[str], plan: RealSizePlan) -> Row:
    prep = prepare()
    isas = {isa: worker("ct2", prep.ct2, prep.hf, plan.threads, plan.threads, plan.batch, isa=isa) for isa in plan.isas}
    servers: dict[str, tuple[Server, int]] = {}
    rss: Row = {}
    try:
        for name in names:
            port = free_port()
            srv = Server(prep.model, [*LAYOUTS[name], "--metrics-port", str(port)])
            servers[name] = (srv, port)
            srv.wait_ready(timeout=600)
            rss[name] = {"after_warm_up": server_rss_mb(srv.pid)}
        result: Row = {"layouts": {n: LAYOUTS[n] for n in names}, "plan": {"rounds": plan.rounds}}
        for beam in plan.beams:
            isa, _ = fastest(isas, plan, beam, "offline")
            row = measure_beam(servers, isas[isa], read_test(DATA, 1000), plan, beam)
            result[f"beam_{beam}"] = {"ct2_isa": isa or "default", **row}
        for name, (srv, _) in servers.items():
            rss[name]["after_runs"] = server_rss_mb(srv.pid)
        rss["ct2_int8"] = max(round(w.ask(op="rss")["vm_hwm_kb"] / 1024, 1) for w in isas.values())
    finally:
        for srv, _ in servers.values():
            srv.stop()
        for w in isas.values():
            w.close()
    return {**result, "peak_rss_mb": rss}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--layout", action="append", choices=list(LAYOUTS), help="default: all of them")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--beam", type=int, action="append", help="default: 1 and 4")
    ap.add_argument(
        "--requests", type=int, default=128, help="requests of a c64 run, and CTranslate2's offline sentences at beam 1"
    )
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    n = args.requests
    plan = RealSizePlan(rounds=args.rounds, beams=args.beam or [1, 4], requests=n, sentences={1: n, 4: max(1, n // 2)})
    res = measure(args.layout or list(LAYOUTS), plan)
    res["machine"] = machine()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res))


if __name__ == "__main__":
    main()
