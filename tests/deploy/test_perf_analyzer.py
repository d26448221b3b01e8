"""Triton's real `perf_analyzer`, unchanged, against the server's KServe v2 endpoint (slow: not part
of `make test`; `make test-slow` runs it).

perf_analyzer asks ModelMetadata, ModelConfig and ModelStatistics before it sends ModelInfer
requests, so this checks those calls as Triton's own tool makes them. The PyPI binary needs
glibc >= 2.38; scripts/perf_analyzer.sh runs it in a Debian trixie root built with debootstrap
(once, cached in /var/tmp/mtserve-trixie or PA_ROOT; about a minute). Skipped where that root
cannot be built: not root, or debootstrap cannot run (no mirror)."""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "perf_analyzer.sh"
SETUP_UNAVAILABLE = 3  # the script's exit status when the root cannot be built here


@pytest.fixture(scope="module")
def perf_analyzer_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: debootstrap, chroot and mounts")
    missing = [tool for tool in ("unshare", "chroot") if shutil.which(tool) is None]
    if missing or (shutil.which("debootstrap") is None and shutil.which("apt-get") is None):
        pytest.skip(f"cannot build the trixie root here: no {', '.join(missing) or 'debootstrap or apt-get'}")
    r = subprocess.run([str(SCRIPT), "setup"], capture_output=True, text=True, timeout=1500)
    if r.returncode == SETUP_UNAVAILABLE:
        pytest.skip(f"debootstrap cannot run here: {r.stderr[-2000:]}")
    assert r.returncode == 0, r.stderr[-4000:]


def test_perf_analyzer_measures_the_kserve_endpoint(perf_analyzer_root, make_server, tiny_onnx_dir, data_dir, tmp_path):
    from contract.manifest import load_manifest

    model = load_manifest(tiny_onnx_dir, verify_checksums=False).name
    server = make_server(decode_workers=2)
    env = {
        **os.environ,
        "CONCURRENCY": "1:2",  # one perf_analyzer run over both levels
        "PA_WINDOW_MS": "1500",
        # Stable: the last 3 windows within a factor 2 of each other (throughput and latency). A busy
        # 2-core machine: the point is that it works, not the precision.
        "PA_STABILITY": "100",
        "PA_MAX_TRIALS": "10",
        "PA_SENTENCES": "16",
        "PA_DATA": str(data_dir / "test_2016_flickr.de.gz"),
        "PA_CSV": str(tmp_path / "perf_analyzer.csv"),
        "PA_LOG_DIR": str(tmp_path / "levels"),
    }
    r = subprocess.run(
        [str(SCRIPT), "run", server.address, model], capture_output=True, text=True, timeout=600, env=env
    )
    output = r.stdout + r.stderr
    assert r.returncode == 0, output[-4000:]

    log = "\n".join(p.read_text() for p in sorted((tmp_path / "levels").glob("*.log")))
    rows = list(csv.DictReader((tmp_path / "perf_analyzer.csv").open()))
    assert [int(row["Concurrency"]) for row in rows] == [1, 2], log[-4000:]
    for row in rows:
        assert float(row["Inferences/Second"]) > 0, row
        assert int(row["p50 latency"]) > 0, row
    # perf_analyzer stops at the first failed request, and its report says so.
    assert "Request concurrency: 2" in log, log[-4000:]
    for bad in ("error", "Error", "Failed", "failed"):
        assert bad not in log, log[-4000:]
    # The server-side figures, from ModelStatistics: perf_analyzer reads them when ServerMetadata
    # lists the "statistics" extension, and finds the model's statistics by a numeric version (it
    # parses the version with std::stoll; with any other version it reports zeros, not an error).
    served = [int(n) for n in re.findall(r"Successful request count: (\d+)", log)]
    assert len(served) == 2 and min(served) > 0, log[-4000:]
    for row in rows:
        assert int(row["Server Compute Infer"]) > 0, row
