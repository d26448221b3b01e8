"""The real-size benchmark's plumbing (benchmarks/real_size*.py) on a TINY model of the same
build: the padded vocabulary, every engine forced to the same number of target tokens, the
summary's keys and the report's table."""

from __future__ import annotations

import gzip
import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import real_size
from benchmarks.plan import served_layout_real_size
from benchmarks.real_size_model import (
    Dims,
    code_of,
    export_code_hash,
    padded_vocab,
    prepare,
    spm_pieces,
)
from benchmarks.report import report_real_size
from benchmarks.shortlist_copies import prepare_shortlist
from benchmarks.summary import headline

TINY = Dims(d_model=32, layers=1, heads=2, ffn=64, vocab=2500, max_positions=64, spm_pieces=600, spm_lines=2000)


def test_padded_vocab_layout() -> None:
    vocab = padded_vocab(["▁a", "b", "▁a", "c"], 10)
    assert len(vocab) == 10 and sorted(vocab.values()) == list(range(10))
    assert vocab["</s>"] == 0 and vocab["<unk>"] == 1 and vocab["<pad>"] == 9
    assert [vocab[p] for p in ("▁a", "b", "c")] == [2, 3, 4]
    assert [t for t, i in vocab.items() if 5 <= i < 9] == [f"<dummy_{n}>" for n in range(4)]
    with pytest.raises(ValueError, match="do not fit"):
        padded_vocab([str(i) for i in range(20)], 10)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, data_dir) -> real_size.Prepared:
    return prepare(TINY, tmp_path_factory.mktemp("real-size"), Path(data_dir))


def test_tiny_build_is_padded_and_imported(tiny: real_size.Prepared) -> None:
    vocab = json.loads((tiny.hf / "vocab.json").read_text())
    config = json.loads((tiny.hf / "config.json").read_text())
    assert len(vocab) == config["vocab_size"] == TINY.vocab and vocab["<pad>"] == TINY.vocab - 1
    pieces = set(spm_pieces(tiny.hf / "source.spm")) | set(spm_pieces(tiny.hf / "target.spm"))
    assert not any(p.startswith("<dummy_") for p in pieces)  # the dummies never occur
    assert (tiny.model / "onnx" / "manifest.json").exists() and (tiny.ct2 / "model.bin").exists()


def test_the_export_code_hash_ignores_docs_and_comments() -> None:
    a = 'def f(x):\n    """Doc."""\n    return x + 1  # one\n'
    b = 'def f(x):\n    """Another doc."""\n\n    return x + 1\n'
    assert code_of(a) == code_of(b) != code_of(a.replace("+ 1", "+ 2"))


def test_the_int8_graphs_are_exported_again_when_the_export_code_changed(tiny: real_size.Prepared, data_dir) -> None:
    stamp, manifest = tiny.model.parent.parent / "export-code.sha256", tiny.model / "onnx" / "manifest.json"
    assert stamp.read_text() == export_code_hash()
    before = manifest.stat().st_mtime_ns
    assert prepare(TINY, tiny.hf.parent.parent, Path(data_dir)) == tiny and manifest.stat().st_mtime_ns == before
    stamp.write_text("the hash of older export code")
    assert prepare(TINY, tiny.hf.parent.parent, Path(data_dir)) == tiny
    assert stamp.read_text() == export_code_hash() and manifest.stat().st_mtime_ns > before


@pytest.mark.parametrize("beam", [1, 4])
def test_engines_emit_the_same_forced_length(tiny: real_size.Prepared, data_dir, beam: int, monkeypatch) -> None:
    monkeypatch.setattr(real_size, "DATA", Path(data_dir))
    plan = real_size.RealSizePlan(tokens=7, sentences={beam: 12}, hf_sentences={beam: 4})
    got = {}
    for engine, model_dir in (("mtserve", tiny.model), ("ct2", tiny.ct2), ("hf-torch", tiny.hf)):
        w = real_size.worker(engine, model_dir, tiny.hf, 1, 1, 8, sys.executable)
        try:
            out = real_size.offline(w, plan, beam, 12)  # raises unless every sentence has 7 tokens
            got[engine] = (out["min_tokens"], out["max_tokens"])
            assert w.ask(op="rss")["vm_hwm_kb"] > 0
        finally:
            w.close()
    assert got == {"mtserve": (7, 7), "ct2": (7, 7), "hf-torch": (7, 7)}


def test_shortlisted_engines_emit_the_forced_length(
    tiny: real_size.Prepared, data_dir, monkeypatch, tmp_path: Path
) -> None:
    """The shortlist rows' workers: the engine over the copy's shortlist and CTranslate2 with its
    vmap.txt (use_vmap) each emit the forced length; the original version has no shortlist."""
    monkeypatch.setattr(real_size, "DATA", Path(data_dir))
    pairs = tmp_path / "pairs"  # the first 2,000 training pairs: enough for a tiny model's shortlist
    pairs.mkdir()
    for lang in ("de", "en"):
        with (
            gzip.open(Path(data_dir) / f"train.{lang}.gz", "rt") as f,
            gzip.open(pairs / f"train.{lang}.gz", "wt") as g,
        ):
            g.writelines(line for _, line in zip(range(2000), f))
    model, ct2 = prepare_shortlist(tiny, (10, 20), pairs)
    assert (model / "onnx" / "shortlist.npz").exists() and (ct2 / "vmap.txt").exists()
    assert prepare_shortlist(tiny, (10, 20), pairs) == (model, ct2)  # reused
    plan = real_size.RealSizePlan(tokens=7, sentences={1: 12})
    for engine, model_dir in (("mtserve", model), ("ct2", ct2)):
        w = real_size.worker(engine, model_dir, tiny.hf, 1, 1, 8, sys.executable, shortlist=True)
        try:
            out = real_size.offline(w, plan, 1, 12)
            assert (out["min_tokens"], out["max_tokens"]) == (7, 7)
        finally:
            w.close()
    with pytest.raises(RuntimeError, match="exited with 1"):
        real_size.worker("mtserve", tiny.model, tiny.hf, 1, 1, 8, sys.executable, shortlist=True)


def test_summary_keys_and_report() -> None:
    def pair(a: list[float], b: list[float]) -> dict:
        return {"a": a, "b": b, "ratio": round(sorted(x / y for x, y in zip(a, b))[1], 3)}

    row = {
        "beam": 1,
        "engine_loops": 2,
        "ct2_isa": "AVX512",
        "engine_over_ct2_int8": pair([10, 12, 11], [20, 20, 20]),
        "engine_latency_over_ct2": pair([100, 90, 95], [50, 50, 50]),
        "service_over_ct2_int8": pair([9, 9, 9], [10, 10, 10]),
        "latency_c1_over_ct2": pair([60, 60, 60], [50, 50, 50]),
        "engine_over_hf": pair([10, 10, 10], [5, 4, 5]),
        "hf": {"hf-torch": {"sentences_per_s": 3.0, "single_p50_ms": 400.0}},
    }
    s = real_size.summary([row], {"engine": 500.0, "ct2_int8": 300.0})
    beam1 = s["by_beam"]["1"]
    assert set(real_size.RATIOS) <= set(beam1)
    assert beam1["engine_over_ct2_int8"] == 0.55 and beam1["engine_over_hf"] == 2.0
    assert beam1["engine_sentences_per_s"] == 11 and beam1["hf_torch_sentences_per_s"] == 3.0
    assert s["peak_rss_mb"] == {"engine": 500.0, "ct2_int8": 300.0}
    real = {"plan": {"tokens": 30, "threads": 2, "rounds": 3}, "dims": asdict(Dims()), "summary": s}
    table = "\n".join(real_size.report_lines(real))
    assert "| 1 | **0.55** | **1.9** | **0.9** | **1.2** | 2.0 |" in table
    assert "engine 500.0, ct2_int8 300.0" in table
    assert "The server:" not in table  # a run from before the result kept the server's flags
    real["server_args"] = served_layout_real_size(2)
    shown = "\n".join(real_size.report_lines(real))
    assert "The server: `mtserve serve --decode-workers 2 --intra-op-threads 1 --max-queue-delay-ms 50`." in shown
    # `make bench-quick`'s last line nests it as `real_size`; the report renders it beside the toy size's
    res = {"mode": "quick", "summary_by_beam": [{"beam": 4}], "ct2_check": {"identical": 1, "sentences": 1}}
    res |= {"plan": {"limits": {}}, "real_size": real}
    assert headline(res, 4)["real_size"] == s
    assert "With a vocabulary shortlist" not in table


def test_shortlist_summary_keys_and_report() -> None:
    def pair(a: list[float], b: list[float]) -> dict:
        return {"a": a, "b": b, "ratio": round(sorted(x / y for x, y in zip(a, b))[1], 3)}

    sl = {k: pair([10, 10, 10], [10, 10, 10]) for k in real_size.SHORTLIST_RATIOS}
    sl["shortlist_engine_over_ct2_int8"] = pair([120, 110, 130], [100, 100, 100])
    sl["shortlist_latency_over_ct2"] = pair([40, 42, 41], [200, 200, 200])
    sl |= {"size": [50, 100], "k": {"k_single": 700.0, "k_batch32": 2300.0, "vocab": 58101}, "rss_mb": {}}
    row = {"beam": 1, "engine_loops": 2, "ct2_isa": "default", "ct2_single_isa": "AVX512", "shortlist": sl}
    s = real_size.summary([row], {})  # a --shortlist-only run: the shortlist rows alone
    beam1 = s["by_beam"]["1"]
    assert set(real_size.SHORTLIST_RATIOS) <= set(beam1) and "engine_over_ct2_int8" not in beam1
    assert beam1["shortlist_engine_over_ct2_int8"] == 1.2 and beam1["shortlist_latency_over_ct2"] == 0.205
    assert beam1["shortlist_engine_sentences_per_s"] == 120 and beam1["shortlist_ct2_int8_p50_ms"] == 200
    assert beam1["shortlist_k_single"] == 700.0 and beam1["shortlist_size"] == [50, 100]
    real = {"plan": {"tokens": 30, "threads": 2, "rounds": 3}, "dims": asdict(Dims()), "summary": s}
    table = "\n".join(real_size.report_lines(real))
    assert "--per-source 50 --always 100" in table
    assert "| 1 | **1.2** | **0.205** | 1.0 | 1.0 | 1.0 | 1.0 | 120, 100, 10 | 41, 200, 10 | 700.0 / 2300.0 |" in table
    assert "engine / CT2 int8 offline (>= 1.0)" in table and "| 1 | **" not in table.split("With a vocabulary")[0]
    # a whole run's beam: the plain rows and the shortlist rows side by side
    plain = {k: pair([10, 10, 10], [10, 10, 10]) for k in real_size.RATIOS} | {"hf": {}}
    both = real_size.summary([{**row, **plain}], {})["by_beam"]["1"]
    assert both["engine_over_ct2_int8"] == 1.0 and both["shortlist_engine_over_ct2_int8"] == 1.2
    real["summary"] = {"by_beam": {"1": both}, "peak_rss_mb": {}}
    assert "\n".join(real_size.report_lines(real)).count("| 1 | **") == 2
    assert report_real_size(real)[0] == "## Real size (an OPUS-MT-sized model)" and report_real_size(None) == []
