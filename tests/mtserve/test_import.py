"""`mtserve import` from the command line: a local Hugging Face Marian folder becomes
REPOSITORY/NAME/1 with every precision and graph exported and one JSON line reported; a folder it
cannot take exits with a message naming the field, and writes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from contract.manifest import load_manifest
from mtserve.cli import main

pytest.importorskip("transformers")


def test_import_writes_every_variant_and_reports_one_json_line(hf_marian_dir, data_dir, tmp_path, capsys):
    repo = tmp_path / "models"
    sentences = data_dir / "test_2016_flickr.de.gz"
    argv = ["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo), "--sentences", str(sentences)]
    assert main([*argv, "--limit", "200"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])
    assert (report["name"], report["version"], report["architecture"]) == ("opus", 1, "MarianMTModel")
    assert report["parity"]["sentences"] == report["parity"]["greedy_identical"] == 200
    assert report["parity"]["max_abs_log_prob_diff"] <= 1e-4
    manifest = load_manifest(repo / "opus" / "1")  # checksums verified, tokenizer files included
    assert set(manifest.variants) == {"fp32", "fp32-fused", "int8", "int8-fused", "fp16"}
    assert set(report["onnx_parity"]) == set(manifest.variants)
    assert manifest.src_lang == "de" and manifest.tgt_lang == "en"
    assert sorted(p.name for p in (repo / "opus").iterdir()) == ["1"]  # no scratch dir left


def test_refused_folder_exits_naming_the_field(hf_marian_dir, tmp_path, capsys):
    folder = tmp_path / "hf"
    shutil.copytree(hf_marian_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "activation_function": "tanh"}))
    repo = tmp_path / "models"
    with pytest.raises(SystemExit) as e:
        main(["import", str(folder), "--name", "opus", "--repository", str(repo)])
    out, err = capsys.readouterr()
    assert e.value.code == 1 and "activation_function" in err and "tanh" in err
    assert not repo.exists()
    assert out == ""
