"""The soak and overload commands (benchmarks/soak.py) against a real `mtserve serve` process:
a short run in the default suite, a long one behind the `slow` marker (`make test-slow`; the
documented command is `make soak`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_soak(tiny_onnx_dir, tmp_path, *args: str, timeout: float) -> dict:
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.soak",
            "--onnx-dir",
            str(tiny_onnx_dir),
            "--model-dir",
            str(tiny_onnx_dir.parent),
            "--json",
            str(out),
            "--server-arg=--decode-workers=1",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    assert out.exists(), proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert proc.returncode == (0 if report["passed"] else 1)
    return report


def check_soak(r: dict) -> None:
    assert r["unexpected"] == 0, r["unexpected_by_code"]
    assert r["sent"] == r["answered"] == r["ok"] + r["cancelled"] + r["deadline_exceeded"]
    assert r["ok"] > 100 and r["cancelled"] > 0 and r["deadline_exceeded"] > 0, r
    assert r["rss_growth_after_warmup"] < 0.10, r["rss_mib"]
    assert r["queue_depth_after"] == 0 and r["in_flight_after"] == 0
    assert r["server_exit_code"] == 0
    assert r["passed"], r


def test_short_soak(tiny_onnx_dir, tmp_path):
    check_soak(
        run_soak(tiny_onnx_dir, tmp_path, "--seconds", "15", "--warmup-s", "5", "--concurrency", "64", timeout=240)
    )


def test_short_overload(tiny_onnx_dir, tmp_path):
    r = run_soak(tiny_onnx_dir, tmp_path, "--scenario", "overload", "--clients", "400", "--rounds", "1", timeout=240)
    assert r["unexpected"] == 0, r["unexpected_by_code"]
    assert r["sent"] == r["answered"] == r["ok"] + r["refused"] == 400
    assert r["refused"] > 0 and r["ok"] >= 32  # the queue holds 32
    assert r["latency_refused_s"]["max"] < 10 and r["latency_ok_s"]["max"] < 60  # generous bounds
    assert r["queue_depth_after"] == 0 and r["server_exit_code"] == 0 and r["passed"]


@pytest.mark.slow
def test_long_soak(tiny_onnx_dir, tmp_path):
    check_soak(run_soak(tiny_onnx_dir, tmp_path, "--minutes", "3", "--concurrency", "64", timeout=600))
