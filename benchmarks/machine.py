"""What a benchmark run records about where it ran: the machine (CPU, vector extensions, memory),
the versions, the commit and load, and the serving settings `mtserve serve` starts with."""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
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


# (vendor, family, first model, last model) -> microarchitecture: the int8 kernels ONNX Runtime's
# MLAS and CTranslate2 pick differ between them (docs/performance.md, "int8 kernels by CPU").
MICROARCHITECTURES = [
    ("AuthenticAMD", 25, 0x00, 0x0F, "Zen 3"),
    ("AuthenticAMD", 25, 0x10, 0x1F, "Zen 4"),
    ("AuthenticAMD", 25, 0x60, 0xAF, "Zen 4"),
    ("AuthenticAMD", 26, 0x00, 0xFF, "Zen 5"),
    ("GenuineIntel", 6, 85, 85, "Skylake/Cascade Lake"),
    ("GenuineIntel", 6, 106, 106, "Ice Lake"),
    ("GenuineIntel", 6, 143, 143, "Sapphire Rapids"),
    ("GenuineIntel", 6, 207, 207, "Emerald Rapids"),
    ("GenuineIntel", 6, 173, 174, "Granite Rapids"),
]


def microarchitecture(vendor: str, family: int, model: int) -> str:
    """The CPU's microarchitecture by cpuid family and model, '' where the table has none."""
    return next(
        (name for v, f, lo, hi, name in MICROARCHITECTURES if (v, f) == (vendor, family) and lo <= model <= hi), ""
    )


def cpu_isa(text: str) -> str:
    """From /proc/cpuinfo's text: the vector extensions that decide int8 GEMM speed (one 'AMD
    EPYC' may have AVX-512 VNNI, another AVX2 only, at half the speed or less; Intel's AMX tiles
    run other int8 kernels still), and the CPU's microarchitecture, family and model."""
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
    if "amx_int8" in flags:
        isa = f"AMX int8, {isa}"
    family, model = field.get("cpu family", "?"), field.get("model", "?")
    arch = (
        microarchitecture(field.get("vendor_id", ""), int(family), int(model))
        if family.isdigit() and model.isdigit()
        else ""
    )
    return f"{isa} ({arch + ', ' if arch else ''}family {family}, model {model})"


def cpu_name(env: dict[str, Any]) -> str:
    """One line naming the CPU of an `environment()`: model name, vector extensions and
    microarchitecture (from the family and model where an older result lacks it), cores."""
    cpu, isa = env.get("cpu") or "CPU", env.get("isa", "")
    at = re.search(r"\(family (\d+), model (\d+)\)", isa)
    vendor = "AuthenticAMD" if "AMD" in cpu else "GenuineIntel" if "Intel" in cpu else ""
    arch = microarchitecture(vendor, int(at[1]), int(at[2])) if at else ""
    if arch:
        isa = isa.replace("(family", f"({arch}, family")
    return f"{cpu}, {isa}, {env.get('cores', '?')} cores"


def machine() -> dict[str, Any]:
    """What a result file records of the CPU it was measured on (`environment` without the run's
    settings): model name, vector extensions, microarchitecture, cores, commit and date."""
    env = environment(0)
    return {k: env[k] for k in ("cpu", "isa", "cores", "memory_gib", "commit", "date")}


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
