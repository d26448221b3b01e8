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


# ----------------------------------------------------------------------------- hostile input


@pytest.fixture(scope="module")
def shared_version(tmp_path_factory, tiny_model_dir, tiny_onnx_dir):
    """One copy for the refusals: none of them may change it."""
    model_dir = tmp_path_factory.mktemp("refusals") / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    return model_dir


def _file(data: bytes, name: str = "in.txt"):
    def make(tmp_path):
        (tmp_path / name).write_bytes(data)
        return str(tmp_path / name)

    return make


def _sentences(n: int, name: str = "in.txt"):
    return _file("".join(f"Ein Mann Nummer {i} läuft.\n" for i in range(n)).encode(), name)


def _gzip(data: bytes):
    import gzip

    return _file(gzip.compress(data)[:-12], "in.gz")  # cut: its end is missing


def _fixed(path: str):
    return lambda tmp_path: path


# id: (how the input is made, arguments with IN for it, what the message names, exit status)
HOSTILE = {
    "empty": (_file(b""), ["--monolingual", "IN"], "--min-sentences", 1),
    "blank lines": (_file(b"\n \n\t\n" * 50), ["--monolingual", "IN"], "--min-sentences", 1),
    "too few": (_sentences(5), ["--monolingual", "IN"], "--min-sentences", 1),
    "blank pairs": (_file(b"a\n" * 40), ["--source", "IN", "--target", "BLANK"], "--min-sentences", 1),
    "limit 0": (_sentences(50), ["--monolingual", "IN", "--limit", "0"], "--limit", 2),
    "5 MB line": (_file(b"x" * 5_000_000 + b"\n"), ["--monolingual", "IN"], "longer than 1000 characters", 1),
    "/dev/zero": (_fixed("/dev/zero"), ["--monolingual", "IN"], "longer than", 1),
    "not gzip": (_file(b"plain text\n" * 30, "in.gz"), ["--monolingual", "IN"], "not a gzip file", 1),
    "cut gzip": (_gzip(b"Ein Hund.\n" * 300), ["--monolingual", "IN"], "in.gz", 1),
    "not UTF-8": (_file(b"Ein Hund\n\xff\xfe\n" * 30), ["--monolingual", "IN"], "not UTF-8", 1),
    "lines differ": (_sentences(30), ["--source", "IN", "--target", "SHORT"], "source lines", 1),
    "missing file": (_fixed("/nonexistent/corpus.txt"), ["--monolingual", "IN"], "cannot be read", 1),
    "a folder": (_fixed("/tmp"), ["--monolingual", "IN"], "cannot be read", 1),
    "max bytes": (_sentences(50), ["--monolingual", "IN", "--max-bytes", "100"], "--limit", 1),
    "iterations 0": (_sentences(50), ["--monolingual", "IN", "--iterations", "0"], "--iterations", 2),
    "min identical 2": (_sentences(50), ["--monolingual", "IN", "--min-identical", "2"], "--min-identical", 2),
    "per source str": (_sentences(50), ["--monolingual", "IN", "--per-source", "many"], "--per-source", 2),
    "no model": (_sentences(50), ["--monolingual", "IN", "--model", "/nonexistent/model"], "no ONNX export", 1),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_input_ends_in_one_line_and_changes_nothing(case, shared_version, tmp_path, capsys):
    make, args, names, status = HOSTILE[case]
    path = make(tmp_path)
    lines(tmp_path, "blank.txt", [""] * 40)
    lines(tmp_path, "short.txt", ["Ein Hund."] * 10)
    swap = {"IN": path, "BLANK": str(tmp_path / "blank.txt"), "SHORT": str(tmp_path / "short.txt")}
    manifest = (shared_version / "onnx" / "manifest.json").read_bytes()
    model = [] if "--model" in args else ["--model", str(shared_version)]
    with pytest.raises(SystemExit) as e:
        main(["shortlist", *model, *[swap.get(a, a) for a in args]])
    out, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("mtserve shortlist: "), err
    assert names in err and "unexpected" not in err and "Traceback" not in err
    assert e.value.code == status and out == ""
    assert (shared_version / "onnx" / "manifest.json").read_bytes() == manifest


def test_a_failed_vmap_leaves_the_manifest_as_it_was(shared_version, tmp_path, test_split, capsys):
    de, en = test_split
    src, tgt = lines(tmp_path, "src.de", de[:N]), lines(tmp_path, "tgt.en", en[:N])
    manifest = (shared_version / "onnx" / "manifest.json").read_bytes()
    with pytest.raises(SystemExit) as e:
        main(
            ["shortlist", "--model", str(shared_version), "--source", src, "--target", tgt, "--vmap", "/nonexistent/v"]
        )
    assert e.value.code == 1 and "/nonexistent/v" in capsys.readouterr().err
    assert (shared_version / "onnx" / "manifest.json").read_bytes() == manifest
    assert not (shared_version / "onnx" / "shortlist.npz").exists()


def test_a_shortlist_that_changes_the_translations_is_refused(shared_version, tmp_path, test_split, capsys):
    """One target token per source token and none always: most held-out greedy outputs leave it."""
    de, en = test_split
    src, tgt = lines(tmp_path, "src.de", de[:N]), lines(tmp_path, "tgt.en", en[:N])
    argv = ["shortlist", "--model", str(shared_version), "--source", src, "--target", tgt]
    with pytest.raises(SystemExit) as e:
        main([*argv, "--per-source", "1", "--always", "0"])
    assert e.value.code == 1 and "held-out greedy translations" in capsys.readouterr().err
    assert load_manifest(shared_version / "onnx").shortlist is None
