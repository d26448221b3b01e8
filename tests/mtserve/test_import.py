"""`mtserve import` from the command line: a local Hugging Face Marian folder becomes
REPOSITORY/NAME/1 with every precision and graph exported and one JSON line reported; a folder it
cannot take exits with a message naming the field, and writes nothing."""

from __future__ import annotations

import json
import shutil

import pytest

from contract.manifest import load_manifest
from mtserve.cli import main
from service.runtime.onnx_model import OnnxSeq2Seq

pytest.importorskip("transformers")


def test_import_writes_every_variant_and_reports_one_json_line(hf_marian_dir, data_dir, tmp_path, capsys):
    repo = tmp_path / "models"
    sentences = data_dir / "test_2016_flickr.de.gz"
    argv = ["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo), "--sentences", str(sentences)]
    assert main([*argv, "--limit", "200", "--precision", "all"]) == 0
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


@pytest.mark.parametrize("env, variants", [(None, {"int8-fused"}), ("fp32", {"fp32-fused"})])
def test_import_writes_the_precision_the_server_loads_by_default(
    hf_marian_dir, tmp_path, capsys, monkeypatch, env, variants
):
    """Only the precision the server loads, and of it only the fused graphs it runs on the CPU; the
    import's last step serves them."""
    monkeypatch.delenv("MTSERVE_GRAPH", raising=False)
    monkeypatch.setenv("MTSERVE_PROVIDER", "cpu")
    if env is None:
        monkeypatch.delenv("MTSERVE_PRECISION", raising=False)
    else:
        monkeypatch.setenv("MTSERVE_PRECISION", env)
    repo = tmp_path / "models"
    assert main(["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo), "--limit", "20"]) == 0
    report = json.loads(capsys.readouterr().out)
    manifest = load_manifest(repo / "opus" / "1")  # every listed file there, checksums verified
    assert set(manifest.variants) == variants
    assert (report["served"]["precision"], report["served"]["graph"]) == (env or "int8", "fused")
    on_disk = {f.name for f in (repo / "opus" / "1" / "onnx").iterdir()}
    assert on_disk == {f.file for f in manifest.files()} | {"manifest.json"}  # no portable graph left


def test_a_precision_the_server_does_not_know_is_bad_usage(hf_marian_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MTSERVE_PRECISION", "int4")
    repo = tmp_path / "models"
    with pytest.raises(SystemExit) as e:
        main(["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo)])
    assert e.value.code == 2 and "MTSERVE_PRECISION 'int4'" in capsys.readouterr().err
    assert not repo.exists()


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


@pytest.fixture(scope="module")
def padded_import(tmp_path_factory, hf_m2m100_dir, data_dir):
    """The tiny M2M100 imported through the CLI: its embedding has 8 rows past the tokenizer's
    vocabulary and language tokens (M2M100's made-up words), as the real checkpoints have."""
    repo = tmp_path_factory.mktemp("padded") / "models"
    sentences = data_dir / "test_2016_flickr.de.gz"
    argv = ["import", str(hf_m2m100_dir), "--name", "m2m", "--repository", str(repo), "--precision", "fp32"]
    assert main([*argv, "--sentences", str(sentences), "--limit", "50"]) == 0
    return repo / "m2m" / "1"


def test_the_ids_no_vocabulary_entry_names_are_recorded(padded_import, hf_m2m100_dir, capsys):
    config = json.loads((padded_import / "config.json").read_text())
    hf = json.loads((hf_m2m100_dir / "config.json").read_text())
    vocab = json.loads((padded_import / "vocab.json").read_text())
    named = set(vocab.values()) | set(config["languages"]["target_tokens"].values())
    assert config["unmapped_ids"] == [i for i in range(hf["vocab_size"]) if i not in named]
    assert len(config["unmapped_ids"]) == 8  # the made-up words, the last 8 rows
    assert config["unmapped_ids"] == list(range(hf["vocab_size"] - 8, hf["vocab_size"]))
    # the export carries the record into the manifest, which the server checks at load
    manifest = load_manifest(padded_import / "onnx", verify_checksums=False)
    assert manifest.sentencepiece is not None and manifest.sentencepiece.unmapped_ids == config["unmapped_ids"]
    assert OnnxSeq2Seq(padded_import / "onnx", precision="fp32").tokenizer.unmapped_ids == set(config["unmapped_ids"])


def test_a_shortlist_leaves_the_unmapped_ids_out_unless_asked(padded_import, data_dir, tmp_path, capsys):
    import gzip

    from contract.shortlist import Shortlist

    with gzip.open(data_dir / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        mono = tmp_path / "mono.de"
        mono.write_text("".join(f.readlines()[:200]), encoding="utf-8")
    unmapped = json.loads((padded_import / "config.json").read_text())["unmapped_ids"]
    argv = ["shortlist", "--model", str(padded_import), "--monolingual", str(mono), "--always", "2000"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["excluded_unmapped"] == 8
    shortlist = Shortlist.load(padded_import / "onnx" / "shortlist.npz")
    assert not set(unmapped) & {*shortlist.targets.tolist(), *shortlist.always.tolist()}
    assert main([*argv, "--include-unmapped"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["excluded_unmapped"] == 0


def test_a_version_the_server_would_not_load_is_not_written(hf_marian_dir, tmp_path, capsys):
    """The last step loads the version as the server does, the model's serving.json included: a
    setting the server refuses there refuses the import, and no version is left behind."""
    repo = tmp_path / "models"
    (repo / "opus").mkdir(parents=True)
    (repo / "opus" / "serving.json").write_text(json.dumps({"max_batch_sentences": 0}))
    with pytest.raises(SystemExit) as e:
        main(["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo), "--precision", "fp32"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and len(err.strip().splitlines()) == 1
    assert "the server cannot serve the imported version" in err and "max_batch_sentences" in err
    assert sorted(p.name for p in (repo / "opus").iterdir()) == ["serving.json"]
