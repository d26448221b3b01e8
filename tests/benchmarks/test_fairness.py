"""benchmarks/fairness.py end to end with the tiny model: a real server on a repository of two
names for the same model dir, a few probe calls per phase, one JSON line with every figure (no
timing thresholds: only that the figures exist and are sane)."""

from __future__ import annotations

import json

from benchmarks.fairness import main


def test_fairness_reports_both_phases_per_round_and_medians(tmp_path, tiny_onnx_dir, data_dir, capsys):
    model_dir = tiny_onnx_dir.parent
    repository = tmp_path / "repo"
    for name in ("flooded", "probed"):
        (repository / name).mkdir(parents=True)
        (repository / name / "1").symlink_to(model_dir)
    rc = main(
        [
            "--repository",
            str(repository),
            "--models",
            "flooded,probed",
            "--requests",
            "4",
            "--rounds",
            "2",
            "--beam",
            "2",
            "--decode-workers",
            "1",
            "--flood-concurrency",
            "4",
            "--flood-warmup-s",
            "0.2",
            "--data",
            str(data_dir),
            "--server-arg=--precision=fp32",
        ]
    )
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and result["errors"] == {} and result["server_exit_code"] == 0
    assert (result["flooded"], result["probed"]) == ("flooded", "probed")
    assert result["source_languages"] == {"flooded": "de", "probed": "de"}  # what the tiny model's manifest says
    assert result["probe_answered_by"] == ["probed:1"]
    assert (result["requests"], result["beam"], result["flood_concurrency"]) == (4, 2, 4)
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    for r in result["rounds"]:
        for phase in ("alone", "flood"):
            figures = r[phase]
            assert figures["n"] == 4
            assert 0 < figures["p50_ms"] <= figures["p99_ms"]
            assert figures["mean_ms"] > 0
        flooded = r["flooded_model"]
        assert flooded["answered"] > 0 and flooded["errors"] == {}
        assert flooded["window_s"] > 0 and flooded["sentences_per_s"] >= 0
        assert r["p50_ratio"] == round(r["flood"]["p50_ms"] / r["alone"]["p50_ms"], 3)
        assert r["probe_errors"] == {}
    median = result["median"]
    assert set(median) == {
        "alone_p50_ms",
        "alone_p99_ms",
        "flood_p50_ms",
        "flood_p99_ms",
        "flooded_sentences_per_s",
        "p50_ratio",
        "p99_ratio",
    }
    assert median["alone_p50_ms"] > 0 and median["flood_p50_ms"] > 0 and median["p50_ratio"] > 0
    assert median["flooded_sentences_per_s"] >= 0
