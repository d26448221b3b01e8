"""benchmarks/shortlist.py's plumbing: the CTranslate2 vocabulary map read back and checked against
the shortlist `mtserve shortlist` stores, the linked copies, CTranslate2 under mtserve's length
rule, the candidate counts and the BLEU table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from benchmarks import shortlist as bs
from benchmarks import shortlist_copies as copies
from contract.shortlist import PAD_MULTIPLE, Shortlist
from export.shortlist import write_vmap

TOKENS = ["</s>", "<unk>", "<pad>", "▁Hund", "▁Katze", "▁dog", "▁cat", "▁the", "s", "▁a"]


def small_shortlist() -> Shortlist:
    rows: list[list[int]] = [[] for _ in TOKENS]
    rows[3], rows[4] = [5, 7], [6, 7, 8]  # ▁Hund -> ▁dog ▁the, ▁Katze -> ▁cat ▁the s
    return Shortlist.from_rows(rows, [0, 1, 2, 9], len(TOKENS), {"per_source": 3})


def test_size_parse() -> None:
    assert copies.Size.parse("50:100") == copies.Size(50, 100) and copies.Size(50, 100).key == "p50-a100"
    mono = copies.Size.parse("20:50:mono")
    assert (
        mono == copies.Size(20, 50, True) and mono.key == "p20-a50-mono" and mono.label == "20 : 50 (own translations)"
    )
    for bad in ("50", "a:1", "5:-1", "5:1:x", "5:1:mono:2"):
        with pytest.raises(argparse.ArgumentTypeError, match="PER_SOURCE:ALWAYS"):
            copies.Size.parse(bad)


def test_vmap_read_back_and_checked(tmp_path: Path) -> None:
    sl, vmap = small_shortlist(), tmp_path / "vmap.txt"
    sl.save(tmp_path / "shortlist.npz")
    pieces = dict(enumerate(TOKENS))
    write_vmap(sl, pieces, pieces, vmap)  # what `mtserve shortlist --vmap` writes
    always, rules = bs.read_vmap(vmap)
    assert set(always) == {"</s>", "<unk>", "<pad>", "▁a"}
    assert set(rules["▁Katze"]) == {"▁cat", "▁the", "s"}
    assert set(rules["▁Hund"]) == {"▁dog", "▁the"} and "</s>" not in rules
    assert bs.check_vmap(tmp_path / "shortlist.npz", vmap, TOKENS) == len(TOKENS)
    lines = vmap.read_text(encoding="utf-8").splitlines()
    other = [line.replace("▁cat", "▁dog") if line.startswith("▁Katze\t") else line for line in lines]
    vmap.write_text("\n".join(other) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'▁Katze' maps to other targets"):
        bs.check_vmap(tmp_path / "shortlist.npz", vmap, TOKENS)
    vmap.write_text("▁Hund ▁Katze\t▁dog\n", encoding="utf-8")
    with pytest.raises(ValueError, match="n-gram"):
        bs.read_vmap(vmap)
    vmap.write_text("▁Hund ▁dog\n", encoding="utf-8")
    with pytest.raises(ValueError, match=":1: no tab"):
        bs.read_vmap(vmap)


def test_linked_copies_leave_the_original_alone(tmp_path: Path) -> None:
    src = tmp_path / "v1"
    (src / "onnx").mkdir(parents=True)
    (src / "onnx" / "decoder.onnx").write_bytes(b"graph")
    (src / "onnx" / "manifest.json").write_text("{}")
    copy = copies.link_tree(src, tmp_path / "copy" / "1")
    assert (copy / "onnx" / "decoder.onnx").stat().st_ino == (src / "onnx" / "decoder.onnx").stat().st_ino
    (copy / "onnx" / "manifest.json").write_text('{"shortlist": 1}')  # as `mtserve shortlist` rewrites it
    assert (src / "onnx" / "manifest.json").read_text() == "{}"
    vmap = tmp_path / "vmap.txt"
    vmap.write_text("\t</s>\n")
    ct2 = copies.with_vmap(src / "onnx", vmap, tmp_path / "ct2-vmap")
    assert (ct2 / "vmap.txt").read_text() == "\t</s>\n" and not (src / "onnx" / "vmap.txt").exists()


class FakeTranslator:
    """Emits 50 tokens for every source, and records what it was asked."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def translate_batch(self, batch: list[list[str]], **kw: Any) -> list[Any]:
        self.calls.append({"batch": batch, **kw})
        return [SimpleNamespace(hypotheses=[[f"t{i}" for i in range(50)]]) for _ in batch]


class FakeTokenizer:
    """Source ids 0..n-1 for a text of n tokens (`LENGTHS`), pieces s0, s1, ..."""

    pad_token = "<pad>"
    LENGTHS = {"short": 3, "long": 9}

    def __call__(self, texts: list[str]) -> SimpleNamespace:
        return SimpleNamespace(input_ids=[list(range(self.LENGTHS[t])) for t in texts])

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [f"s{i}" for i in ids]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return " ".join(tokens)


def test_ct2_translate_keeps_mtserves_length_rule() -> None:
    tr = FakeTranslator()
    out = bs.ct2_translate(tr, FakeTokenizer(), ["long", "short"], beam=1, use_vmap=True, batch=1)
    # int(1.5 * source tokens + 10) tokens, </s> included: 22 and 13 before it
    assert [len(o.split()) for o in out] == [22, 13]
    assert [c["max_decoding_length"] for c in tr.calls] == [13, 22]  # by length, shortest first
    assert all(c["use_vmap"] and c["suppress_sequences"] == [["<pad>"]] for c in tr.calls)


def test_candidate_counts(tmp_path: Path) -> None:
    small_shortlist().save(tmp_path / "shortlist.npz")
    # a vocabulary of 10: every batch pads to 16 with repeats of a candidate; the count is the padded one
    got = copies.candidate_counts(tmp_path / "shortlist.npz", [[3, 0], [4, 0]], batch=2)
    assert got == {"k_single": 16.0, "k_batch2": 16.0, "vocab": 10}
    rows: list[list[int]] = [[] for _ in range(100)]
    rows[3], rows[4] = list(range(20, 40)), list(range(30, 60))
    Shortlist.from_rows(rows, [0, 1], 100, {}).save(tmp_path / "big.npz")
    got = copies.candidate_counts(tmp_path / "big.npz", [[3], [4]], batch=2)
    assert got["k_single"] == 32.0 and got["k_batch2"] == 48  # 22 and 32 padded; 2 + 40 -> 48
    assert got["k_batch2"] % PAD_MULTIPLE == 0


def test_bleu_table() -> None:
    def cells(b: float) -> dict[str, Any]:
        return {key: {"bleu": b, "sentences_per_s": 1.0} for key, _ in bs.COLUMNS}

    rows = [
        {"size": "none", "label": "none", **cells(26.0)},
        {"size": "p50-a100", "label": "50 : 100", "k_single": 700.0, "k_batch32": 2300.0, **cells(25.8)},
    ]
    table = bs.bleu_table(rows)
    assert table[0].startswith("| shortlist (per source : always) | mean K")
    assert table[2].startswith("| none | all | 26.0 |")
    assert table[3].startswith("| 50 : 100 | 700.0 / 2300.0 | 25.8 (-0.20) |")
    assert json.loads(json.dumps(rows)) == rows


def test_shortlist_cmd_names_the_corpus_and_size(tmp_path: Path) -> None:
    cmd = copies.shortlist_cmd(tmp_path / "v", copies.Size(20, 50), tmp_path / "vmap.txt", tmp_path)
    text = " ".join(cmd)
    assert "-m mtserve shortlist --model" in text and f"--source {tmp_path / 'train.de.gz'}" in text
    assert "--per-source 20 --always 50" in text and text.endswith(f"--vmap {tmp_path / 'vmap.txt'}")
    mono = " ".join(copies.shortlist_cmd(tmp_path / "v", copies.Size(20, 50, True), tmp_path / "vmap.txt", tmp_path))
    assert f"--monolingual {tmp_path / 'train.de.gz'} --per-source 20" in mono and "--target" not in mono
    assert np.all(small_shortlist().row(3) == [5, 7])


def test_speed_table() -> None:
    rows = [
        {"size": "none", "label": "none", "sentences_per_s": 100.0, "single_p50_ms": 80.0},
        {
            "size": "p20-a50",
            "label": "20 : 50",
            "k_single": 600.0,
            "k_batch32": 2000.0,
            "vocab": 58101,
            "sentences_per_s": 125.0,
            "single_p50_ms": 40.0,
        },
    ]
    table = bs.speed_table(rows)
    assert table[2] == "| none | 58,101 (all) | 100.0 (1.00) | 80.0 (1.00) |"
    assert table[3] == "| 20 : 50 | 600.0 / 2000.0 | 125.0 (1.25) | 40.0 (0.50) |"
