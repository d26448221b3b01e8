"""More model versions than a memory budget holds, through a real `mtserve serve`: `--copies`
versions of one model (hard links of its files: on disk once, each loaded as a version of its
own), every one `"load": "on_demand"`, under a budget of `--hold` versions (their measured size,
plus half of one for the noise in measuring it), while `--clients` closed-loop clients send
one-sentence requests round robin over all of them for `--seconds`.

    python -m benchmarks.many_models --model-dir MODEL_DIR --copies 20 --hold 4 --clients 1
    python -m benchmarks.many_models --model-dir MODEL_DIR --copies 20 --hold 4 --clients 4

MODEL_DIR is one version (`NAME/VERSION`, with `onnx/`), e.g. the real-size benchmark's imported
OPUS-MT-sized model (`benchmarks/.cache/real-size-*/models/opus-size/1`).

1. A version's size: a server with one copy answers one request; GetModelInfo's
   `resident_bytes` (the server's RSS after the load less before it) is the size.
2. The run: a server over all the copies with `--memory-budget-mb` of `--hold` + 0.5 sizes. Each
   request names the next version in round-robin order, so with fewer loaded than copies nearly
   every request finds its version evicted and waits for its load: one client's request latency
   is a cold start as a client sees it (the load, its warm-up, then the translation). The
   server's RSS is sampled every 20 ms throughout.

Reports one JSON line: requests by status (all must be OK); request latency p50/p99/max; the
server's own load times (`mtserve_model_load_duration_seconds`: count, mean, and how many took
over 3 s by its buckets); loads and evictions; RSS before any load (the baseline), its peak, the
peak against the budget and against the budget plus the baseline."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc

from benchmarks.figures import print_result
from benchmarks.processes import Server, free_port
from benchmarks.soak import percentiles, rss_bytes
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

SENTENCE = "Ein Hund rennt durch den Schnee."
MB = 1 << 20


def linked_repository(model_dir: Path, copies: int, root: Path) -> list[str]:
    """`copies` versions `copy-NN/1` of `model_dir` under `root`, their files hard links (a copy
    where the file system cannot link), each model's serving.json `"load": "on_demand"`. While
    the links exist, onnx's checker refuses the original's external data ("hardlink attack"):
    `main` removes them at the end."""
    names = []
    for i in range(copies):
        name = f"copy-{i:02d}"
        target = root / name / "1"
        shutil.copytree(model_dir, target, copy_function=_link)
        (root / name / "serving.json").write_text(json.dumps({"load": "on_demand"}))
        names.append(name)
    return names


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def rss_mb(pid: int) -> float:
    return rss_bytes(pid) / MB


class RssSampler(threading.Thread):
    """The process's RSS every `every` seconds until `stop`; its peak, and its peak in each
    `window` seconds (`windows`: whether it creeps up run after run)."""

    def __init__(self, pid: int, every: float = 0.02, window: float = 10.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.window, self.peak, self.samples = pid, every, window, 0.0, 0
        self.windows: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.is_set():
            rss = rss_mb(self.pid)
            self.peak = max(self.peak, rss)
            w = int((time.monotonic() - start) / self.window)
            self.windows += [0.0] * (w + 1 - len(self.windows))
            self.windows[w] = max(self.windows[w], rss)
            self.samples += 1
            self.done.wait(self.every)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.peak


def _metrics(port: int) -> dict[str, float]:
    """The load and eviction figures of the server's /metrics, summed over versions."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        key, value = line.rsplit(" ", 1)
        metric = key.split("{", 1)[0]
        if metric in ("mtserve_model_load_duration_seconds_sum", "mtserve_model_load_duration_seconds_count"):
            name = metric
        elif metric == "mtserve_model_load_duration_seconds_bucket" and 'le="2.5"' in key:
            name = "loads_within_2_5_s"
        elif metric == "mtserve_model_load_duration_seconds_bucket" and 'le="5.0"' in key:
            name = "loads_within_5_s"
        elif metric in ("mtserve_model_loads_total", "mtserve_model_evictions_total"):
            name = metric
        else:
            continue
        out[name] = out.get(name, 0.0) + float(value)
    return out


def version_size_mb(model_dir: Path, root: Path) -> float:
    """The resident size of one loaded copy, as the server measures it (step 1)."""
    names = linked_repository(model_dir, 1, root)
    with Server(root, models=names) as server, grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)
        stub.Translate(pb.TranslateRequest(texts=[SENTENCE], model=names[0]), timeout=120)
        info = stub.GetModelInfo(pb.GetModelInfoRequest(model=names[0]), timeout=30)
        (served,) = [m for m in info.models if m.name == names[0]]
        return served.resident_bytes / MB


def run(model_dir: Path, copies: int, hold: int, clients: int, seconds: float, work: Path) -> dict:
    size = round(version_size_mb(model_dir, work / "one"), 1)  # the budget follows from the size reported
    budget = int((hold + 0.5) * size)
    root = work / "many"
    names = linked_repository(model_dir, copies, root)
    metrics_port = free_port()
    args = ["--memory-budget-mb", str(budget), "--metrics-port", str(metrics_port)]
    with Server(root, args=args, models=names) as server:
        baseline = rss_mb(server.pid)
        sampler = RssSampler(server.pid)
        sampler.start()
        order = itertools.cycle(names)
        lock = threading.Lock()
        latencies: list[float] = []
        statuses: Counter[str] = Counter()
        stop_at = time.monotonic() + seconds

        def client() -> None:
            with grpc.insecure_channel(server.address) as channel:
                stub = pb_grpc.TranslationServiceStub(channel)
                while time.monotonic() < stop_at:
                    with lock:
                        name = next(order)
                    start = time.perf_counter()
                    try:
                        stub.Translate(pb.TranslateRequest(texts=[SENTENCE], model=name), timeout=120)
                        code = "OK"
                    except grpc.RpcError as e:
                        code = f"{e.code().name}: {e.details()[:100]}"
                    with lock:
                        latencies.append(time.perf_counter() - start)
                        statuses[code] += 1

        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = sampler.stop()
        figures = _metrics(metrics_port)
    loads = figures.get("mtserve_model_load_duration_seconds_count", 0.0)
    return {
        "benchmark": "many_models",
        "model_dir": str(model_dir),
        "copies": copies,
        "hold": hold,
        "clients": clients,
        "seconds": seconds,
        "version_size_mb": size,
        "budget_mb": budget,
        "requests": sum(statuses.values()),
        "statuses": dict(statuses),
        "latency_s": percentiles(latencies),
        "loads": int(figures.get("mtserve_model_loads_total", 0)),
        "evictions": int(figures.get("mtserve_model_evictions_total", 0)),
        "load_s": {
            "n": int(loads),
            "mean": round(figures.get("mtserve_model_load_duration_seconds_sum", 0.0) / loads, 3) if loads else None,
            "over_2_5_s": int(loads - figures.get("loads_within_2_5_s", 0.0)),
            "over_5_s": int(loads - figures.get("loads_within_5_s", 0.0)),
        },
        "rss_mb": {
            "baseline": round(baseline, 1),
            "peak": round(peak, 1),
            "samples": sampler.samples,
            "peak_by_10_s": [round(x) for x in sampler.windows],
            "peak_vs_budget": round(peak / budget, 3) if budget else None,
            "peak_vs_budget_plus_baseline": round(peak / (budget + baseline), 3) if budget else None,
        },
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", type=Path, required=True, help="one model version (NAME/VERSION with onnx/)")
    p.add_argument("--copies", type=int, default=20)
    p.add_argument("--hold", type=int, default=4, help="versions the budget holds")
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--json", help="also write the result here")
    a = p.parse_args()
    parent = a.model_dir.resolve().parent.parent.parent  # beside its repository: hard links need one file system
    with tempfile.TemporaryDirectory(prefix="many-models-", dir=parent) as work:
        result = run(a.model_dir.resolve(), a.copies, a.hold, a.clients, a.seconds, Path(work))
    print_result(result, a.json)


if __name__ == "__main__":
    main()
