"""`mtserve import` on hostile input: folders built from the tiny seeded Marian and M2M100
checkpoints (tests/conftest.py), each broken one way, and bad command-line values. Every one ends
with one line naming the field, the flag or the file, status 2 for bad usage and 1 for a folder
it refuses, no traceback (the CLI's boundary would call it "unexpected"), nothing written outside
the repository and no version written: nothing imports that then cannot serve."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mtserve.cli import main

pytest.importorskip("transformers")


def _config(**changes):
    def edit(folder: Path) -> None:
        path = folder / "config.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))

    return edit


def _json(name: str, edit):
    def change(folder: Path) -> None:
        path = folder / name
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))

    return change


def _write(name: str, data: bytes):
    def change(folder: Path) -> None:
        (folder / name).unlink(missing_ok=True)
        (folder / name).write_bytes(data)

    return change


def _symlink(name: str, target: str):
    def change(folder: Path) -> None:
        (folder / name).unlink()
        (folder / name).symlink_to(folder / target if not target.startswith("/") else target)

    return change


def _unlink(name: str):
    return lambda folder: (folder / name).unlink()


def _duplicate_id(vocab: dict) -> dict:
    first, second = list(vocab)[5:7]
    return {**vocab, second: vocab[first]}


def _extra_entries(vocab: dict) -> dict:
    top = max(vocab.values())
    return {**vocab, **{f"extra{i}": top + 1 + i for i in range(1_000_000)}}


def _bin(data: bytes):
    def change(folder: Path) -> None:
        (folder / "model.safetensors").unlink()
        (folder / "pytorch_model.bin").write_bytes(data)

    return change


def _nothing(folder: Path) -> None:
    pass


# id: (which checkpoint, how it is broken, extra arguments, what the message names, exit status)
CASES = {
    "heads 0": (
        "marian",
        _config(encoder_attention_heads=0, decoder_attention_heads=0),
        [],
        "encoder_attention_heads",
        1,
    ),
    "heads 3": ("marian", _config(encoder_attention_heads=3, decoder_attention_heads=3), [], "d_model", 1),
    "heads differ": ("marian", _config(decoder_attention_heads=2), [], "decoder_attention_heads", 1),
    "d_model -32": ("marian", _config(d_model=-32), [], "d_model", 1),
    "d_model true": ("marian", _config(d_model=True), [], "d_model", 1),
    "d_model 64": ("marian", _config(d_model=64), [], "d_model", 1),
    "pad 1e9": ("marian", _config(pad_token_id=10**9), [], "pad_token_id", 1),
    "eos -1": ("marian", _config(eos_token_id=-1), [], "eos_token_id", 1),
    "start str": ("marian", _config(decoder_start_token_id="x"), [], "decoder_start_token_id", 1),
    "start missing": ("marian", _config(decoder_start_token_id=None), [], "decoder_start_token_id", 1),
    "100000 layers": ("marian", _config(encoder_layers=100_000), [], "encoder_layers", 1),
    "0 layers": ("marian", _config(decoder_layers=0), [], "decoder_layers", 1),
    "3 layers": ("marian", _config(encoder_layers=3), [], "encoder_layers", 1),
    "ffn 128": ("marian", _config(encoder_ffn_dim=128, decoder_ffn_dim=128), [], "encoder_ffn_dim", 1),
    "vocab 1e12": ("marian", _config(vocab_size=10**12), [], "vocab_size", 1),
    "vocab 2000": ("marian", _config(vocab_size=2000), [], "vocab_size", 1),
    "decoder vocab -1": (
        "marian",
        _config(share_encoder_decoder_embeddings=False, decoder_vocab_size=-1),
        [],
        "decoder_vocab_size",
        1,
    ),
    "positions 1e9": ("marian", _config(max_position_embeddings=10**9), [], "max_position_embeddings", 1),
    "positions str": ("marian", _config(max_position_embeddings="128"), [], "max_position_embeddings", 1),
    "activation list": ("marian", _config(activation_function=["relu"]), [], "activation_function", 1),
    "architectures str": ("marian", _config(architectures="MarianMTModel"), [], "architectures", 1),
    "tie str": ("marian", _config(tie_word_embeddings="yes"), [], "tie_word_embeddings", 1),
    "config not JSON": ("marian", _write("config.json", b"{not json"), [], "config.json", 1),
    "config a list": ("marian", _write("config.json", b"[1, 2]"), [], "config.json", 1),
    "config not UTF-8": ("marian", _write("config.json", b'{"d_model": "\xff\xfe"}'), [], "config.json", 1),
    "config symlink spm": ("marian", _symlink("config.json", "source.spm"), [], "config.json", 1),
    "config symlink zero": ("marian", _symlink("config.json", "/dev/zero"), [], "config.json", 1),
    "config missing": ("marian", _unlink("config.json"), [], "config.json", 1),
    "bad words 1e9": (
        "marian",
        _write("generation_config.json", b'{"bad_words_ids": [[1000000000]]}'),
        [],
        "bad_words_ids",
        1,
    ),
    "generation not JSON": ("marian", _write("generation_config.json", b"nope"), [], "generation_config.json", 1),
    "vocab duplicate id": ("marian", _json("vocab.json", _duplicate_id), [], "vocab.json", 1),
    "vocab negative id": ("marian", _json("vocab.json", lambda v: {**v, "neg": -5}), [], "vocab.json", 1),
    "vocab 1e6 extra": ("marian", _json("vocab.json", _extra_entries), [], "vocab.json", 1),
    "vocab str id": ("marian", _json("vocab.json", lambda v: {**v, "s": "7"}), [], "vocab.json", 1),
    "vocab a list": ("marian", _write("vocab.json", b"[]"), [], "vocab.json", 1),
    "vocab not JSON": ("marian", _write("vocab.json", b"\x00\x01"), [], "vocab.json", 1),
    "spm garbage": ("marian", _write("source.spm", b"garbage"), [], "source.spm", 1),
    "spm missing": ("marian", _unlink("target.spm"), [], "target.spm", 1),
    "tokenizer_config not JSON": ("marian", _write("tokenizer_config.json", b"{"), [], "tokenizer_config.json", 1),
    "source_lang null": (
        "marian",
        _json("tokenizer_config.json", lambda c: {**c, "source_lang": None}),
        [],
        "--src-lang",
        1,
    ),
    "weights garbage": (
        "marian",
        _write("model.safetensors", b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}"),
        [],
        "model.safetensors",
        1,
    ),
    "weights huge header": ("marian", _write("model.safetensors", b"\xff" * 16), [], "model.safetensors", 1),
    "weights missing": ("marian", _unlink("model.safetensors"), [], "model.safetensors", 1),
    "weights bin garbage": ("marian", _bin(b"not a pickle"), [], "pytorch_model.bin", 1),
    "m2m src_lang null": (
        "m2m100",
        _json("tokenizer_config.json", lambda c: {**c, "src_lang": None}),
        [],
        "--src-lang",
        1,
    ),
    "m2m tgt_lang unknown": ("m2m100", _nothing, ["--tgt-lang", "xx"], "--tgt-lang", 1),
    "m2m vocab duplicate id": ("m2m100", _json("vocab.json", _duplicate_id), [], "vocab", 1),
    "m2m vocab past the model": ("m2m100", _config(vocab_size=1000), [], "vocab_size", 1),
    "name ../x": ("marian", _nothing, ["--name", "../x"], "--name", 2),
    "name /abs": ("marian", _nothing, ["--name", "/tmp/abs-name"], "--name", 2),
    "name empty": ("marian", _nothing, ["--name", ""], "--name", 2),
    "name .hidden": ("marian", _nothing, ["--name", ".hidden"], "--name", 2),
    "name bad chars": ("marian", _nothing, ["--name", "bad name!*"], "--name", 2),
    "version 0": ("marian", _nothing, ["--version", "0"], "--version", 2),
    "version -1": ("marian", _nothing, ["--version", "-1"], "--version", 2),
    "version 1e20": ("marian", _nothing, ["--version", "99999999999999999999"], "--version", 2),
    "version str": ("marian", _nothing, ["--version", "one"], "--version", 2),
    "limit 0": ("marian", _nothing, ["--limit", "0"], "--limit", 2),
    "precision bogus": ("marian", _nothing, ["--precision", "fp8"], "--precision", 2),
    "sentences not UTF-8": (
        "marian",
        _write("sentences.txt", b"\xff\xfe\xfa\n"),
        ["--sentences", "SENTENCES"],
        "--sentences",
        1,
    ),
    "sentences /dev/zero": ("marian", _nothing, ["--sentences", "/dev/zero"], "--sentences", 1),
    "sentences not gzip": (
        "marian",
        _write("sentences.gz", b"plain text\n"),
        ["--sentences", "SENTENCES.gz"],
        "--sentences",
        1,
    ),
}


def _tree(root: Path, skip: Path) -> set[Path]:
    return {p for p in root.rglob("*") if skip not in p.parents and p != skip}


@pytest.mark.parametrize("case", list(CASES))
def test_a_hostile_import_ends_in_one_line_and_writes_nothing(case, tmp_path, hf_marian_dir, hf_m2m100_dir, capsys):
    import shutil

    which, breaks, extra, names, status = CASES[case]
    folder = tmp_path / "hf"
    shutil.copytree(hf_marian_dir if which == "marian" else hf_m2m100_dir, folder)
    breaks(folder)
    repo = tmp_path / "repo"
    (repo / "existing" / "1").mkdir(parents=True)
    extra = [str(folder / "sentences.txt") if a == "SENTENCES" else a for a in extra]
    extra = [str(folder / "sentences.gz") if a == "SENTENCES.gz" else a for a in extra]
    args = ["--name", "new", *extra] if "--name" not in extra else extra
    before = _tree(tmp_path, repo)
    with pytest.raises(SystemExit) as e:
        main(["import", str(folder), "--repository", str(repo), "--precision", "fp32", *args])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mtserve import: "), err
    assert names in lines[0] and "unexpected" not in lines[0] and "Traceback" not in err
    assert e.value.code == status and out == ""
    assert _tree(tmp_path, repo) == before  # nothing written outside the repository
    assert sorted(p.relative_to(repo) for p in repo.rglob("*")) == [Path("existing"), Path("existing/1")]
    assert not Path("/tmp/abs-name").exists()


def test_a_name_that_leads_out_of_the_repository_is_refused(tmp_path, hf_marian_dir, capsys):
    """A model folder that is a symlink out of the repository: the version would land outside."""
    repo, outside = tmp_path / "repo", tmp_path / "outside"
    repo.mkdir()
    outside.mkdir()
    (repo / "evil").symlink_to(outside)
    with pytest.raises(SystemExit) as e:
        main(["import", str(hf_marian_dir), "--name", "evil", "--repository", str(repo), "--precision", "fp32"])
    assert e.value.code == 1 and "--name" in capsys.readouterr().err
    assert list(outside.iterdir()) == []


def test_the_scratch_dir_of_a_killed_import_is_removed_by_the_next(tmp_path, hf_marian_dir, capsys):
    pid = 4_194_305  # above any pid Linux hands out (pid_max is at most 4,194,304): a process that is gone
    stale = tmp_path / "repo" / "opus" / f".import-1-{pid}-abcd"
    (stale / "model").mkdir(parents=True)
    live = tmp_path / "repo" / "opus" / f".import-2-{os.getpid()}-abcd"  # an import still running
    live.mkdir()
    with pytest.raises(SystemExit):
        main(["import", str(hf_marian_dir), "--name", "opus", "--repository", str(tmp_path / "repo"), "--limit", "0"])
    assert stale.exists()  # bad usage stops before the import starts
    folder = tmp_path / "hf"
    folder.mkdir()
    with pytest.raises(SystemExit):  # a refused folder: the import ran, and cleaned up first
        main(["import", str(folder), "--name", "opus", "--repository", str(tmp_path / "repo")])
    assert not stale.exists() and live.exists()
    assert "config.json" in capsys.readouterr().err


def test_a_terminated_import_removes_its_scratch_dir(tmp_path, hf_marian_dir):
    """SIGTERM mid-import: exit status 143, one line at most, the repository as it was."""
    import signal
    import subprocess
    import sys
    import time

    repo = tmp_path / "repo"
    argv = [sys.executable, "-m", "mtserve", "import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo)]
    argv += ["--precision", "all"]  # every precision: an import long enough to be stopped half-way
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(repo.glob("opus/.import-*")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(repo.glob("opus/.import-*")), "the import never started"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err
    assert not list(repo.glob("*/.import-*")) and not list(repo.glob("*/1"))


def test_a_termination_dropped_on_the_way_still_stops_the_import_before_its_version_is_written(
    tmp_path, hf_marian_dir, monkeypatch
):
    """A SIGTERM whose SystemExit Python dropped (it landed in a finalizer during a collection) is
    remembered: the import's last step stops with exit status 143, and no version is written."""
    from mtserve import importer

    monkeypatch.setattr(importer, "_signalled", [15])
    repo = tmp_path / "repo"
    with pytest.raises(SystemExit) as e:
        main(["import", str(hf_marian_dir), "--name", "opus", "--repository", str(repo), "--limit", "4"])
    assert e.value.code == 143
    assert not list(repo.glob("*/1")) and not list(repo.glob("*/.import-*"))
