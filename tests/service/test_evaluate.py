"""`mtserve evaluate`: any split whose two files exist works; --json prints one object."""

import gzip
import json
import subprocess
import sys


def test_evaluate_any_split_json(tmp_path, tiny_model_dir, test_split):
    de, en = test_split
    (tmp_path / "mysplit.de").write_text("\n".join(de[:20]) + "\n")
    with gzip.open(tmp_path / "mysplit.en.gz", "wt") as f:  # a gzipped side works as well
        f.write("\n".join(en[:20]) + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtserve",
            "evaluate",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(tmp_path),
            "--split",
            "mysplit",
            "--beam",
            "2",
            "--json",
            "--output",
            str(tmp_path / "hyp.txt"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sentences"] == 20
    assert 0.0 <= result["bleu"] <= 100.0
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result["seconds"] > 0
    assert len((tmp_path / "hyp.txt").read_text().splitlines()) == 20


def test_evaluate_missing_split_fails_clearly(tmp_path, tiny_model_dir):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mtserve",
            "evaluate",
            "--model",
            str(tiny_model_dir),
            "--data",
            str(tmp_path),
            "--split",
            "nope",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0
    assert "nope.de" in out.stderr
