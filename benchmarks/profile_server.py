"""Where a serving process spends its time under load: py-spy samples a `mtserve serve` process
while the online load generator keeps `--concurrency` requests in flight, and every sample is put
in one bucket by the innermost frame that decides it:

  onnxruntime      inside InferenceSession.run (encoder and decoder graphs)
  tokenization     tokenizers encode/decode (source_ids, detokenize)
  numpy cache      DecodeBatch bookkeeping of the key/value cache and rows: from_sources outside
                   the encoder, concatenate, filter, the cache's select, advance and binding
  numpy search     DecodeBatch.step outside the graph: greedy/beam selection, finished hypotheses
  scheduler        service/batching/scheduler.py (admission, futures, locks)
  grpc/protobuf    grpc, protobuf, asyncio event loop, servicer/engine/interceptors
  other            everything else (logging, metrics, ...)

    python -m benchmarks.profile_server --concurrency 64 --seconds 10 [--server-arg=--precision=int8]

Needs py-spy (`pip install py-spy`; the `bench` extra has it) and permission to ptrace the server
(root, or kernel.yama.ptrace_scope 0). Samples of threads that are idle (waiting on a lock or on the
network) are not counted, so the shares are of the busy time of all threads together.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from benchmarks.online import run_level
from benchmarks.processes import Server

REPO = Path(__file__).resolve().parent.parent

BUCKETS = ["onnxruntime", "tokenization", "numpy cache", "numpy search", "scheduler", "grpc/protobuf", "other"]
_CACHE_FUNCS = {"concatenate", "filter", "from_sources", "stack", "_empty_state"}  # of DecodeBatch
_SEARCH_FUNCS = {"step", "_greedy", "_beam", "walk", "hypothesis", "active_keys", "last_tokens"}
# service/decoding's modules by bucket ("cache.py" names the caches' modules too)
_CACHE_MODULES = ("cache.py", "decoding/rows.py", "decoding/layout.py")
_SEARCH_MODULES = tuple(
    f"decoding/{m}.py" for m in ("batch", "search", "output_rules", "results", "encoder", "generator")
)


def bucket(frames: list[str]) -> str:
    """frames: outermost first, each 'function (file:line)'. The first rule that matches wins."""
    text = ";".join(frames)
    if "onnxruntime" in text:
        return "onnxruntime"
    if "tokenizers" in text or "source_ids" in text or "detokenize" in text:
        return "tokenization"
    for f in reversed(frames):  # the innermost frame of service/decoding decides
        if any(m in f for m in _CACHE_MODULES):  # the key/value cache, rows, field layouts: bookkeeping
            return "numpy cache"
        if any(m in f for m in _SEARCH_MODULES):
            parts = f.split(" (")[0].split(".")  # e.g. DecodeBatch.filter.<locals>.<listcomp>
            fn = parts[1] if parts[0] == "DecodeBatch" and len(parts) > 1 else parts[0]
            if fn in _CACHE_FUNCS:
                return "numpy cache"
            return "numpy search"
    if "scheduler.py" in text:
        return "scheduler"
    if any(
        k in text
        for k in ("grpc", "protobuf", "asyncio", "servicer.py", "engine.py", "interceptors.py", "selectors.py")
    ):
        return "grpc/protobuf"
    return "other"


def breakdown(raw: str) -> dict:
    counts: Counter = Counter()
    for line in raw.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        counts[bucket(stack.split(";"))] += int(n)
    total = sum(counts.values()) or 1
    return {"samples": sum(counts.values()), "share": {b: round(counts.get(b, 0) / total, 3) for b in BUCKETS}}


def profile(
    model_dir,
    texts,
    refs,
    concurrency: int,
    seconds: float,
    beam: int,
    server_args: list[str],
    rate: int = 100,
    raw_out: str | None = None,
) -> dict:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise RuntimeError("py-spy not found: pip install py-spy")
    with Server(model_dir, server_args) as srv:
        # Load for longer than the sampling window, so that every sample sees a full server.
        load: dict = {}
        th = threading.Thread(
            target=lambda: load.update(
                run_level(srv.address, texts, refs, concurrency, 10**9, beam, duration=seconds + 2.0)
            )
        )
        th.start()
        raw_path = raw_out or tempfile.NamedTemporaryFile(suffix=".txt", delete=False).name
        time.sleep(1.0)  # past the warm-up
        proc = subprocess.run(
            [
                spy,
                "record",
                "--pid",
                str(srv.pid),
                "--duration",
                str(int(seconds)),
                "--rate",
                str(rate),
                "--format",
                "raw",
                "--output",
                raw_path,
                "--nonblocking",
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            srv.stop()
            th.join()
            raise RuntimeError(f"py-spy failed: {proc.stderr.strip()[-500:]}")
        th.join()
        result = breakdown(Path(raw_path).read_text())
    result.update(
        {
            "concurrency": concurrency,
            "beam": beam,
            "seconds": seconds,
            "server_args": server_args,
            "load": {k: load.get(k) for k in ("sentences_per_s", "p50_ms", "errors")},
            "raw": raw_path,
        }
    )
    return result


def main() -> None:
    from export.data import DEFAULT_DATA_DIR, read_parallel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--seconds", type=float, default=10)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--server-arg", action="append", default=[])
    p.add_argument("--raw", help="keep py-spy's collapsed stacks here")
    args = p.parse_args()
    texts, refs = read_parallel(DEFAULT_DATA_DIR, "test_2016_flickr")
    print(
        json.dumps(
            profile(
                args.model, texts, refs, args.concurrency, args.seconds, args.beam, args.server_arg, raw_out=args.raw
            )
        )
    )


if __name__ == "__main__":
    main()
