"""The shared weights layout (`contract.weights`) measured: disk per version, and a loaded int8
fused model's memory and decode speed under each way of loading the weights.

    python -m benchmarks.shared_weights --per-graph OLD/onnx --shared NEW/onnx [--ct2 CT2_DIR]

OLD/onnx: an export in the per-graph layout (every graph holding its own weights); NEW/onnx the
same export rewritten to the shared layout (`python -m export.shared_weights NEW/onnx` on a copy).
Each mode is a process of its own holding one `OnnxSeq2Seq` (int8, fused: the encoder and the four
decoder steps, five sessions, as a server's decode loops share them), `keep_freed_memory()` as
`mtserve serve` calls it:
  per-graph                the old layout, each session reading its graph's weights
  mmap                     the shared layout as served: ONNX Runtime maps the weights file
  mmap-no-prepack          the same with session.disable_prepacking = 1
  initializers             SessionOptions.add_initializer: OrtValues made once from np.memmap views
                           of the weights file, given to every session
  initializers-no-prepack  the same with session.disable_prepacking = 1
The modes other than per-graph and mmap replace the sessions' construction in their own process
(`onnx_model.ort.InferenceSession`); the server has no switch for them.
Memory: VmRSS, RssAnon, RssFile and Pss (/proc/self/smaps_rollup: a page mapped twice counts once)
after load and after a warm-up decode. Speed: `--rounds` interleaved rounds (the order reversed every
other round) of a greedy batch of 16, a beam-4 batch of 4 and one greedy sentence, every sentence
forced to 20 tokens; per mode the median of its time over per-graph's in the same round, and
whether its tokens are per-graph's. Disk: `du -sb` of each dir, of the int8 files alone, of the
fp32 and int8 files, and of --ct2. One JSON line last.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODES = ("per-graph", "mmap", "mmap-no-prepack", "initializers", "initializers-no-prepack")
WORK = ("1 16", "4 4", "1 1")  # beam, sentences


def _memory() -> dict[str, int]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    mib = {k: int(status[k].split()[0]) // 1024 for k in ("VmRSS", "RssAnon", "RssFile")}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            mib["Pss"] = int(line.split()[1]) // 1024
    return mib


def _patch_sessions(onnx_dir: Path, mode: str) -> None:
    """Make every session of this process load as `mode` says (the measurement's options)."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx.external_data_helper import uses_external_data

    from contract.weights import weights_file
    from service.runtime import onnx_model

    real = ort.InferenceSession
    values: dict[tuple, Any] = {}
    mapped = np.memmap(onnx_dir / weights_file("int8"), dtype=np.uint8, mode="r") if "initializers" in mode else None

    def session(path: str, options: ort.SessionOptions, providers: list[str]) -> ort.InferenceSession:
        so = ort.SessionOptions()  # one per session: add_initializer refuses a name twice
        so.intra_op_num_threads, so.inter_op_num_threads = options.intra_op_num_threads, options.inter_op_num_threads
        so.execution_mode, so.log_severity_level = options.execution_mode, 3
        if mode.endswith("no-prepack"):
            so.add_session_config_entry("session.disable_prepacking", "1")
        if mapped is not None:
            for t in onnx.load(path, load_external_data=False).graph.initializer:
                if not uses_external_data(t):
                    continue
                info = {e.key: e.value for e in t.external_data}
                key = (int(info["offset"]), int(info["length"]), t.data_type, tuple(t.dims))
                if key not in values:
                    view = mapped[key[0] : key[0] + key[1]].view(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))
                    values[key] = ort.OrtValue.ortvalue_from_numpy(view.reshape(key[3]))
                so.add_initializer(t.name, values[key])
        return real(path, so, providers=providers)

    onnx_model.ort.InferenceSession = session  # this process only


def worker(onnx_dir: Path, mode: str) -> None:
    """One mode's process: load, print the memory, then answer "BEAM SENTENCES" lines with timings."""
    import numpy as np

    from service.decoding.generator import generate
    from service.runtime.memory import keep_freed_memory
    from service.runtime.onnx_model import OnnxSeq2Seq

    keep_freed_memory()
    if mode not in ("per-graph", "mmap"):
        _patch_sessions(onnx_dir, mode)
    model = OnnxSeq2Seq(onnx_dir, precision="int8", graph="fused", intra_op_threads=1, verify_checksums=False)
    loaded = _memory()
    rng = np.random.default_rng(0)
    sources = [
        [*map(int, rng.integers(10, model.vocab_size - 10, size=n)), model.eos_id] for n in rng.integers(8, 30, 16)
    ]

    def decode(beam: int, n: int) -> tuple[float, str]:
        t = time.perf_counter()
        hyps = generate(model, sources[:n], beam=beam, batch_size=n, min_len=20, max_len_a=0, max_len_b=21)
        return time.perf_counter() - t, hashlib.sha256(str([h.tokens for h in hyps]).encode()).hexdigest()[:16]

    for w in WORK:
        decode(*map(int, w.split()))
    print(json.dumps({"mode": mode, "loaded_mib": loaded, "after_decode_mib": _memory()}), flush=True)
    for line in sys.stdin:
        seconds, tokens = decode(*map(int, line.split()))
        print(json.dumps({"s": seconds, "tokens": tokens}), flush=True)


def du(paths: list[Path]) -> int:
    return int(subprocess.run(["du", "-sbc", *map(str, paths)], capture_output=True, text=True).stdout.split()[-2])


def disk(per_graph: Path, shared: Path, ct2: Path | None) -> dict[str, Any]:
    def of(d: Path, *precisions: str) -> int:
        return du([p for p in d.iterdir() if any(f".{q}." in p.name for q in precisions)])

    figures: dict[str, Any] = {
        layout: {"all": du([d]), "int8": of(d, "int8"), "fp32+int8": of(d, "fp32", "int8")}
        for layout, d in (("per-graph", per_graph), ("shared", shared))
    }
    if ct2 is not None:
        figures["ct2"] = du([ct2])
    return figures


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser("python -m benchmarks.shared_weights")
    p.add_argument("--per-graph", type=Path, required=True)
    p.add_argument("--shared", type=Path, required=True)
    p.add_argument("--ct2", type=Path)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.per_graph if args.worker == "per-graph" else args.shared, args.worker)
        return
    modes = args.modes.split(",")
    if modes[0] != "per-graph":
        p.error("--modes must start with per-graph, the reference")
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = [sys.executable, "-m", "benchmarks.shared_weights", "--per-graph", str(args.per_graph)]
    procs, report = {}, {"disk_bytes": disk(args.per_graph, args.shared, args.ct2), "modes": {}}
    for m in modes:
        procs[m] = subprocess.Popen(
            [*cmd, "--shared", str(args.shared), "--worker", m],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        out = procs[m].stdout
        assert out is not None
        report["modes"][m] = json.loads(out.readline())
        print(json.dumps(report["modes"][m]), flush=True)
    times: dict[str, list[float]] = {m: [] for m in modes}
    tokens: dict[str, set[tuple[str, str]]] = {m: set() for m in modes}
    for r in range(args.rounds):
        for m in modes if r % 2 == 0 else modes[::-1]:
            total = 0.0
            for w in WORK:
                proc = procs[m]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(w + "\n")
                proc.stdin.flush()
                answer = json.loads(proc.stdout.readline())
                total += answer["s"]
                tokens[m].add((w, answer["tokens"]))
            times[m].append(total)
    for m in modes:
        ratios = [a / b for a, b in zip(times[m], times["per-graph"])]
        report["modes"][m].update(
            median_s=round(statistics.median(times[m]), 4),
            time_over_per_graph=round(statistics.median(ratios), 3),
            same_tokens=tokens[m] == tokens["per-graph"],
        )
    for proc in procs.values():
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
