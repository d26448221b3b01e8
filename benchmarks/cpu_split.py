"""Where a served request's CPU goes, by thread: ms of CPU per request for the event loops, the decode
workers, the server's other threads and the load generator, at one concurrency level.

    python -m benchmarks.cpu_split --beam 1 --server-arg=--replicas=2 --server-arg=--decode-workers=1 --workers 1
    python -m benchmarks.cpu_split --beam 1 --backend ct2 --server-arg=--ct2-dir=DIR --workers 2

Threads are read from /proc (user + system time) before and after the measured requests. In each
serving process (the server, or each replica under a supervisor) the main thread runs the event
loop and the `--workers` busiest other threads are the decode workers: they are the only threads
that run a core for long. Python does not name its threads for the kernel, so the busiest ones
stand for them. Everything else (gRPC's poller, the tokenizer's and ONNX Runtime's pools, the
supervisor) counts as "other". The load generator is this process.

The figures explain the server's throughput: on C cores the server cannot answer more than
C / (the sum of the per-request figures) requests a second.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from benchmarks.online import run_level
from benchmarks.processes import Server, process_cpu_s, replica_pids, stat_cpu_s

REPO = Path(__file__).resolve().parent.parent


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of process `pid`, by thread id."""
    out = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out[int(task.name)] = stat_cpu_s(task / "stat")
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return out


def split(before: dict[int, dict[int, float]], after: dict[int, dict[int, float]], workers: int) -> dict[str, float]:
    """CPU seconds by role between two snapshots of the serving processes' threads."""
    roles = {"event_loop": 0.0, "decode_workers": 0.0, "other_threads": 0.0}
    for pid, threads in after.items():
        used = {t: s - before.get(pid, {}).get(t, 0.0) for t, s in threads.items()}
        roles["event_loop"] += used.pop(pid, 0.0)
        busiest = sorted(used.values(), reverse=True)
        roles["decode_workers"] += sum(busiest[:workers])
        roles["other_threads"] += sum(busiest[workers:])
    return roles


def measure(args, texts: list[str], refs: list[str]) -> dict:
    with Server(args.model, args.server_arg, backend=args.backend) as srv:
        run_level(
            srv.address, texts, refs, args.concurrency, args.concurrency * 4, args.beam, connections=args.connections
        )
        serving = replica_pids(srv.pid) or [srv.pid]
        supervisor = srv.pid if serving != [srv.pid] else None
        sup0 = thread_cpu_s(supervisor) if supervisor else {}
        threads0 = {p: thread_cpu_s(p) for p in serving}
        client0, t0 = process_cpu_s(), time.perf_counter()
        row = run_level(
            srv.address, texts, refs, args.concurrency, args.requests, args.beam, connections=args.connections
        )
        wall = time.perf_counter() - t0
        client = process_cpu_s() - client0
        roles = split(threads0, {p: thread_cpu_s(p) for p in serving}, args.workers)
        if supervisor:
            roles["other_threads"] += sum(thread_cpu_s(supervisor).values()) - sum(sup0.values())
    roles["load_generator"] = client
    n = args.requests
    return {
        "backend": args.backend,
        "server_args": args.server_arg,
        "beam": args.beam,
        "concurrency": args.concurrency,
        "requests": n,
        "sentences_per_s": row["sentences_per_s"],
        "errors": row["errors"],
        "serving_processes": len(serving),
        "cores": {k: round(v / wall, 3) for k, v in roles.items()},
        "cpu_ms_per_request": {k: round(1000 * v / n, 3) for k, v in roles.items()},
        "cpu_ms_per_request_total": round(1000 * sum(roles.values()) / n, 3),
    }


def main() -> None:
    from export.data import DEFAULT_DATA_DIR, read_parallel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--backend", choices=["ort", "ct2"], default="ort")
    p.add_argument("--server-arg", action="append", default=[], help="extra server flag (repeatable)")
    p.add_argument("--workers", type=int, default=2, help="decode workers in each serving process")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--connections", type=int, default=8)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args()
    texts, refs = read_parallel(args.data, "test_2016_flickr")
    result = measure(args, texts, refs)
    per = result["cpu_ms_per_request"]
    print(
        f"{args.backend} {' '.join(args.server_arg)} beam {args.beam} c{args.concurrency}: "
        f"{result['sentences_per_s']:.0f} sent/s; ms CPU per request: "
        + ", ".join(f"{k} {v:.2f}" for k, v in per.items())
        + f", total {result['cpu_ms_per_request_total']:.2f}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
