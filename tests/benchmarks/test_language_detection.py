"""benchmarks/language_detection.py: the short texts it builds, and a small run of the chosen
detector and the serving path's wrapper (one JSON line, restricted and unrestricted accuracy,
the threshold table) with the network refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.language_detection import MIN_CHARS, THRESHOLDS, opening

REPO = Path(__file__).resolve().parents[2]


def test_opening_is_the_leading_words_under_twenty_characters():
    assert opening("Ein Mann mit einem orangefarbenen Hut") == "Ein Mann mit einem"
    assert opening("Zwei junge weiße Männer sind im Freien.") == "Zwei junge weiße"
    assert opening("Unwahrscheinlichkeitsverhältnisse") == ""  # no word fits
    assert all(len(opening(t)) < MIN_CHARS for t in ("a " * 30, "Un chien court sur la plage."))


def test_a_small_run_prints_one_json_line(data_dir):
    names = ["py3langid", "mtserve (service.runtime.language_id)"]
    cmd = [sys.executable, "-m", "benchmarks.language_detection", "--limit", "30", "--no-save"]
    for name in names:
        cmd += ["--only", name]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result["candidates"]) == set(names)
    assert result["machine"]["cpu"] is not None
    for row in result["candidates"].values():
        assert "error" not in row, row
        assert row["licence"] == "BSD-3-Clause" and row["extra_dependencies_mib"] == {}
        for kind in ("long", "short"):
            acc = row[kind]["accuracy"]
            assert set(acc) == {"de", "en", "fr"} and all(a["n"] > 0 for a in acc.values())
            assert [t["threshold"] for t in row[kind]["threshold"]] == list(THRESHOLDS)
            assert row[kind]["mean_us"] > 0 and row[kind]["p99_us"] >= 0
        assert all(a["restricted"] == 1.0 for a in row["long"]["accuracy"].values())
    # The wrapper answers what the package answers.
    a, b = (result["candidates"][n] for n in names)
    assert a["long"]["accuracy"] == b["long"]["accuracy"] and a["short"]["threshold"] == b["short"]["threshold"]
