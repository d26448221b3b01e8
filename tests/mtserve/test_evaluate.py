"""`mtserve evaluate`: any split whose two files exist works; --json prints one object; the
languages of the files are the model's unless --src-lang/--tgt-lang say otherwise."""

import gzip
import json
import subprocess
import sys

import pytest


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


def _evaluate_missing_split(model, data) -> subprocess.CompletedProcess:
    """`mtserve evaluate` on a split that `data` lacks: it must fail."""
    cmd = [sys.executable, "-m", "mtserve", "evaluate", "--model", str(model), "--data", str(data), "--split", "nope"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    assert out.returncode != 0
    return out


def test_evaluate_missing_split_fails_clearly(tmp_path, tiny_model_dir):
    out = _evaluate_missing_split(tiny_model_dir, tmp_path)
    assert "nope.de" in out.stderr


def _evaluate_args(*argv: str):
    import argparse

    from mtserve.evaluate import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def _relabelled_model(tmp_path, tiny_model_dir, src_lang: str):
    """The tiny de→en model under a config that says its source language is `src_lang` (weights and
    tokenizer linked, not copied)."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("model.safetensors", "tokenizer.json"):
        (model / name).symlink_to(tiny_model_dir / name)
    meta = json.loads((tiny_model_dir / "config.json").read_text())
    meta["src_lang"] = src_lang
    (model / "config.json").write_text(json.dumps(meta))
    return model


def test_evaluate_reads_the_source_language_the_model_records(tmp_path, tiny_model_dir, test_split, capsys):
    """A config with src_lang "fr": `SPLIT.fr` is translated (and `SPLIT.de`, of another length, is
    not read); --src-lang/--tgt-lang override what the model says."""
    from mtserve.evaluate import run

    de, en = test_split
    model = _relabelled_model(tmp_path, tiny_model_dir, "fr")
    data = tmp_path / "data"
    data.mkdir()
    (data / "mysplit.fr").write_text("\n".join(de[:3]) + "\n")
    (data / "mysplit.en").write_text("\n".join(en[:3]) + "\n")
    (data / "mysplit.de").write_text("\n".join(de[:5]) + "\n")  # 5 lines: read with mysplit.en, it fails
    common = ("--model", str(model), "--data", str(data), "--split", "mysplit", "--beam", "1", "--json")

    result = run(_evaluate_args(*common))
    assert (result["src_lang"], result["tgt_lang"], result["sentences"]) == ("fr", "en", 3)

    with pytest.raises(ValueError, match="5 de lines but 3 en lines"):
        run(_evaluate_args(*common, "--src-lang", "de"))
    (data / "mysplit.xx").write_text("\n".join(en[:2]) + "\n")
    (data / "mysplit.yy").write_text("\n".join(en[:2]) + "\n")
    result = run(_evaluate_args(*common, "--src-lang", "xx", "--tgt-lang", "yy"))
    assert (result["src_lang"], result["tgt_lang"], result["sentences"]) == ("xx", "yy", 2)
    capsys.readouterr()


def test_evaluate_missing_source_side_names_the_models_language(tmp_path, tiny_model_dir):
    model = _relabelled_model(tmp_path, tiny_model_dir, "fr")
    out = _evaluate_missing_split(model, tmp_path)
    assert "nope.fr" in out.stderr


def test_onnx_engine_takes_the_languages_from_the_export_manifest(tmp_path, tiny_onnx_dir):
    """--engine onnx reads the manifest (MODEL/onnx/manifest.json, or an export dir's own), not config.json."""
    from mtserve.evaluate import model_languages

    manifest = json.loads((tiny_onnx_dir / "manifest.json").read_text())
    manifest["src_lang"], manifest["tgt_lang"] = "fr", "en"
    manifest["languages"].update(source=["fr"], target=["en"])
    (tmp_path / "onnx").mkdir()
    (tmp_path / "onnx" / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "config.json").write_text(json.dumps({"src_lang": "de", "tgt_lang": "en"}))
    assert model_languages(tmp_path, "onnx") == ("fr", "en")
    assert model_languages(tmp_path / "onnx", "onnx") == ("fr", "en")
    assert model_languages(tmp_path, "torch") == ("de", "en")


def test_evaluate_with_the_onnx_engine(tiny_onnx_dir, tmp_path, test_split):
    de, en = test_split
    (tmp_path / "s.de").write_text("\n".join(de[:12]) + "\n")
    (tmp_path / "s.en").write_text("\n".join(en[:12]) + "\n")
    base = [sys.executable, "-m", "mtserve", "evaluate", "--data", str(tmp_path), "--split", "s", "--json"]
    for precision in ("fp32", "int8"):
        out = subprocess.run(
            base + ["--model", str(tiny_onnx_dir.parent), "--engine", "onnx", "--precision", precision],
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["sentences"] == 12 and result["engine"] == "onnx" and result["precision"] == precision
    out = subprocess.run(base + ["--model", str(tmp_path / "none"), "--engine", "onnx"], capture_output=True, text=True)
    assert out.returncode != 0 and "mtserve export" in out.stderr
