"""What a real-size version costs to store and to hold, against CTranslate2: the disk of the
files the server loads at one precision (the manifest's files of its variants: graphs, the
shared weights file, tokenizer files, shortlist) against CTranslate2's int8 model directory, and
what each process holds once its model is loaded (VmRSS) and its peak RSS (VmHWM) then and
after its runs
(benchmarks/real_size.py measures them; `ratios` divides, `report_lines` renders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from contract.manifest import MANIFEST, load_manifest

GRAPHS = ("portable", "fused")


def precision_set_mb(onnx_dir: Path, precisions: tuple[str, ...] = ("int8",)) -> float:
    """The bytes of the files a server loading `precisions` reads from `onnx_dir` (each variant of
    them, portable and fused, and the manifest; each file once), in MB."""
    manifest = load_manifest(onnx_dir, verify_checksums=False)
    names = {MANIFEST}
    for precision in precisions:
        for graph in GRAPHS:
            if manifest.has(precision, graph):
                names |= {f.file for f in manifest.files(precision, graph)}
    return round(sum((onnx_dir / name).stat().st_size for name in names) / 2**20, 1)


# (name, mtserve's figure, CTranslate2's figure, the target): disk_mb's keys, then peak_rss_mb's.
ROWS = (
    ("disk: the int8 set / CTranslate2 int8", "disk", "engine_int8", "ct2_int8", "<= 1.25"),
    (
        "RSS held once loaded: engine / CTranslate2",
        "rss",
        "engine_after_load_held",
        "ct2_int8_after_load_held",
        "<= 1.25",
    ),
    (
        "RSS held: server warmed up / CTranslate2 loaded",
        "rss",
        "service_after_warm_up_held",
        "ct2_int8_after_load_held",
        "<= 1.25",
    ),
    ("peak RSS once loaded: engine / CTranslate2", "rss", "engine_after_load", "ct2_int8_after_load", ""),
    ("peak RSS: server warmed up / CTranslate2 loaded", "rss", "service_after_warm_up", "ct2_int8_after_load", ""),
    ("peak RSS: server after c64 / CTranslate2 offline", "rss", "service_replica", "ct2_int8", "<= 1.0"),
    ("peak RSS: engine offline / CTranslate2 offline", "rss", "engine", "ct2_int8", ""),
)


def ratios(disk: dict[str, float], rss: dict[str, float]) -> dict[str, float]:
    """{row's mtserve key: mtserve / CTranslate2} for the rows whose figures the run has."""
    source = {"disk": disk, "rss": rss}
    out = {}
    for _, kind, ours, theirs, _ in ROWS:
        a, b = source[kind].get(ours), source[kind].get(theirs)
        if a and b:
            out[f"{kind}_{ours}_over_{theirs}"] = round(a / b, 3)
    return out


def report_lines(real: dict[str, Any]) -> list[str]:
    """The disk and memory table of a real-size run's JSON (empty without its disk figures)."""
    disk, rss = real.get("disk_mb") or {}, real["summary"].get("peak_rss_mb") or {}
    if not disk:
        return []
    source = {"disk": disk, "rss": rss}
    L = [
        "",
        "Disk and memory against CTranslate2 (MB; RSS held is VmRSS once the model is loaded, what the process"
        " keeps; peak RSS is VmHWM, once the model is loaded and after the runs):",
        "",
        "| | mtserve | CTranslate2 | ratio | target |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, kind, ours, theirs, target in ROWS:
        a, b = source[kind].get(ours), source[kind].get(theirs)
        ratio = f"**{a / b:.3f}**" if a and b else "-"
        L.append(f"| {name} | {a if a else '-'} | {b if b else '-'} | {ratio} | {target} |")
    if disk.get("engine_version"):
        L += [
            "",
            f"The whole version directory (fp32 safetensors and every exported precision): {disk['engine_version']} MB.",
        ]
    return L
