"""Where a real-size greedy step's time goes: ONNX Runtime's profiler over the engine's int8 graphs
(the fused decoder step, as the server runs them) of the real-size model
(benchmarks/real_size_model.py), at batch 1 on 1 thread and batch 32 on 2 threads, every sentence
forced to `--tokens` target tokens.

    python -m benchmarks.real_size_profile            # prints one JSON object per batch, then all

Each graph node's kernel time is put in one bucket by its name (`bucket`): encoder (the whole
encoder graph), self-attention, cross-attention, feed-forward, output projection, top-k (the log-
softmax, top-k and argmax after the projection, and the unscored step's </s> ban), other
(embeddings, layer norms outside a block, reshapes); `host` is the wall time of generate() less
the time inside the graphs' runs (Python, the search, copies in and out). Figures are ms per
decoder step (the encoder's: per batch, shown per step too) and shares of the wall time.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.machine import machine

BUCKETS = (
    ("cross-attention", re.compile(r"cross|\.cq\b|encoder_attn")),
    ("self-attention", re.compile(r"qkv|self_attn|self_out|norm_self|\.q_proj|\.k_proj|\.v_proj")),
    ("feed-forward", re.compile(r"\.w1|\.w2|relu|swish|silu|gelu|sigmoid|\.act|fc1|fc2|norm_ffn")),
    ("top-k", re.compile(r"top_?k|log_softmax|argmax|\beos\b|best|^rank\.|eos_biased|^logits\.eos")),
    ("output projection", re.compile(r"logits|lm_head|final_bias|final_logits")),
)
DECODER_STEPS = ("decoder", "decoder_one_row", "decoder_unscored", "decoder_one_row_unscored")


def bucket(node: str) -> str:
    for name, pattern in BUCKETS:
        if pattern.search(node):
            return name
    return "other"


def profiling_sessions(model: Any, threads: int, prefix: str) -> list[Any]:
    """Replace the model's encoder and decoder-step sessions by ones that profile (same files,
    same thread settings); the new sessions, to end."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.enable_profiling = True
    so.profile_file_prefix = prefix
    sessions = []
    for attr in ("encoder", *DECODER_STEPS):
        old = getattr(model, attr)
        if old is None:
            continue
        path = old._model_path  # the file it was loaded from
        new = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        setattr(model, attr, new)
        sessions.append((attr, new))
    return sessions


def split(profiles: list[tuple[str, Path]]) -> tuple[dict[str, float], float, dict[str, set[str]]]:
    """Kernel microseconds by bucket, microseconds inside runs, node names by bucket."""
    us: dict[str, float] = defaultdict(float)
    names: dict[str, set[str]] = defaultdict(set)
    in_runs = 0.0
    for attr, path in profiles:
        for ev in json.loads(path.read_text()):
            if ev.get("cat") == "Session" and ev.get("name") == "model_run":
                in_runs += ev["dur"]
            elif ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
                node = ev["name"][: -len("_kernel_time")]
                key = "encoder" if attr == "encoder" else bucket(node)
                us[key] += ev["dur"]
                names[key].add(node)
    return us, in_runs, names


def profile_batch(model_dir: Path, batch: int, threads: int, tokens: int, texts: list[str]) -> dict[str, Any]:
    from service.decoding.generator import generate
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = OnnxSeq2Seq(model_dir, precision="int8", intra_op_threads=threads)
    src = model.source_ids(texts[:batch])

    def run() -> float:
        t = time.perf_counter()
        generate(
            model, src, beam=1, batch_size=batch, max_len_a=0.0, max_len_b=tokens + 1, min_len=tokens, want_scores=False
        )
        return time.perf_counter() - t

    run()  # warm-up, unprofiled
    with tempfile.TemporaryDirectory(prefix="mtserve-prof-") as tmp:
        sessions = profiling_sessions(model, threads, str(Path(tmp) / "p"))
        wall = run()
        profiles = [(attr, Path(s.end_profiling())) for attr, s in sessions]
        us, in_runs, names = split(profiles)
    steps = tokens + 1  # the last forced </s> included
    wall_us = wall * 1e6
    us["host"] = wall_us - in_runs
    us["graph overhead"] = in_runs - sum(v for k, v in us.items() if k != "host")
    return {
        "batch": batch,
        "threads": threads,
        "graph": model.graph,
        "steps": steps,
        "wall_ms": round(wall * 1000, 1),
        "ms_per_step": {k: round(v / 1000 / steps, 3) for k, v in sorted(us.items(), key=lambda kv: -kv[1])},
        "share": {k: round(v / wall_us, 3) for k, v in sorted(us.items(), key=lambda kv: -kv[1])},
        "other_nodes": sorted(names["other"])[:40],
    }


def main(argv: list[str] | None = None) -> None:
    from benchmarks.real_size_model import DATA, prepare
    from benchmarks.real_size_worker import read_test

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=30)
    ap.add_argument("--model", help="an mtserve model dir (default: the real-size model, built when missing)")
    args = ap.parse_args(argv)
    model_dir = Path(args.model) if args.model else prepare().model
    texts = read_test(DATA, 64)
    out = [profile_batch(model_dir, batch, threads, args.tokens, texts) for batch, threads in ((1, 1), (32, 2))]
    where = machine()
    for row in out:
        print(json.dumps({**row, "machine": where}), flush=True)


if __name__ == "__main__":
    main()
