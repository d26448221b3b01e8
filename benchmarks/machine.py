"""What a benchmark run records about where it ran: the machine (CPU, vector extensions, memory),
the versions, the commit and load, and the serving settings `mtserve serve` starts with."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from service.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def server_defaults() -> str:
    """The serving settings that shape throughput, as `mtserve serve` starts without flags."""
    none: dict[str, Any] = {}  # no arguments: the defaults and the environment, as the server reads them
    d = Settings(**none)
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


def environment(threads: int) -> dict[str, Any]:
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
    versions: dict[str, str | None] = {}
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
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
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
