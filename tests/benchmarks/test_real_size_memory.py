"""benchmarks/real_size_memory.py: the files a server loads at one precision (from the manifest,
each once), the ratios against CTranslate2, and their table."""

from __future__ import annotations

from benchmarks.real_size_memory import precision_set_mb, ratios, report_lines
from contract.manifest import MANIFEST, load_manifest


def test_the_int8_set_is_the_files_its_variants_read(tiny_onnx_dir):
    manifest = load_manifest(tiny_onnx_dir, verify_checksums=False)
    names = {
        f.file for graph in ("portable", "fused") if manifest.has("int8", graph) for f in manifest.files("int8", graph)
    }
    assert any("int8" in n for n in names) and not any("fp32" in n or "fp16" in n for n in names)
    expected = sum((tiny_onnx_dir / n).stat().st_size for n in names | {MANIFEST}) / 2**20
    assert precision_set_mb(tiny_onnx_dir) == round(expected, 1)
    every = sum(f.stat().st_size for f in tiny_onnx_dir.iterdir() if f.is_file()) / 2**20
    assert precision_set_mb(tiny_onnx_dir, ("fp32", "int8", "fp16")) <= round(every, 1)
    assert precision_set_mb(tiny_onnx_dir, ("fp32", "int8")) > precision_set_mb(tiny_onnx_dir)


def test_ratios_and_their_table_hold_only_the_figures_a_run_has():
    disk = {"engine_int8": 150.0, "ct2_int8": 100.0, "engine_version": 900.0}
    rss = {"engine_after_load": 300.0, "ct2_int8_after_load": 200.0, "service_replica": 800.0, "ct2_int8": 1000.0}
    got = ratios(disk, rss)
    assert got == {
        "disk_engine_int8_over_ct2_int8": 1.5,
        "rss_engine_after_load_over_ct2_int8_after_load": 1.5,
        "rss_service_replica_over_ct2_int8": 0.8,
    }
    table = report_lines({"disk_mb": disk, "summary": {"peak_rss_mb": rss}})
    assert "| disk: the int8 set / CTranslate2 int8 | 150.0 | 100.0 | **1.500** | <= 1.25 |" in table
    assert "| peak RSS: server warmed up / CTranslate2 loaded | - | 200.0 | - |  |" in table
    assert "| RSS held: server warmed up / CTranslate2 loaded | - | - | - | <= 1.25 |" in table
    held = {"service_after_warm_up_held": 260.0, "ct2_int8_after_load_held": 200.0}
    assert ratios({}, held) == {"rss_service_after_warm_up_held_over_ct2_int8_after_load_held": 1.3}
    assert report_lines({"summary": {"peak_rss_mb": rss}}) == []
