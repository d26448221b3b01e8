"""`mtserve shortlist`: derive from a parallel corpus or from the model's own translations, store
with the version, write CTranslate2's vocabulary map; one JSON line."""

from __future__ import annotations

import json
import shutil

import pytest

from contract.manifest import load_manifest
from mtserve.cli import main

N = 300


@pytest.fixture()
def version(tmp_path, tiny_model_dir, tiny_onnx_dir):
    model_dir = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    return model_dir


def lines(tmp_path, name: str, texts: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    return str(path)


def test_from_a_parallel_corpus_with_a_vocabulary_map(version, tmp_path, test_split, capsys):
    de, en = test_split
    src, tgt = lines(tmp_path, "src.de", de[:N]), lines(tmp_path, "tgt.en", en[:N])
    vmap = tmp_path / "vmap.txt"
    main(["shortlist", "--model", str(version), "--source", src, "--target", tgt, "--per-source", "8"])
    main(["shortlist", "--model", str(version), "--source", src, "--target", tgt, "--always", "5", "--vmap", str(vmap)])
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["pairs"] + report["held_out"]["sentences"] == N and report["held_out"]["sentences"] == N // 10
    assert report["held_out"]["identical"] >= 0.95 * report["held_out"]["sentences"]
    assert report["derived_from"] == "parallel" and 0 < report["mean_per_source"] <= 50
    manifest = load_manifest(version / "onnx")  # the second run replaced the first; every file intact
    assert manifest.shortlist is not None and manifest.shortlist.always == 5
    assert sorted(report["graphs"]) == sorted(
        g.file for v in manifest.variants.values() for g in v.shortlist_steps.values()
    )
    first, *rules = vmap.read_text(encoding="utf-8").splitlines()
    assert first.startswith("\t") and "</s>" in first.split("\t")[1].split()
    assert rules and all(len(r.split("\t")) == 2 and r.split("\t")[0] and r.split("\t")[1] for r in rules)


def test_from_the_models_own_translations(version, tmp_path, test_split, capsys):
    de, _ = test_split
    main(["shortlist", "--model", str(version), "--monolingual", lines(tmp_path, "mono.de", de[:200])])
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["derived_from"] == "monolingual" and report["source_rows"] > 0
    assert report["pairs"] + report["held_out"]["sentences"] == 200
    assert load_manifest(version / "onnx").shortlist is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--source", "a"], "--source and --target go together"),
        (["--source", "a", "--target", "b", "--monolingual", "c"], "either --source and --target, or --monolingual"),
        (["--monolingual", "c", "--per-source", "0"], "--per-source"),
    ],
)
def test_bad_arguments_say_what_is_wrong(version, args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(["shortlist", "--model", str(version), *args])
    assert e.value.code == 2 and message in capsys.readouterr().err
