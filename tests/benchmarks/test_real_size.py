"""The real-size benchmark's plumbing (benchmarks/real_size*.py) on a TINY model of the same
build: the padded vocabulary, every engine forced to the same number of target tokens, the
summary's keys and the report's table."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from benchmarks import real_size
from benchmarks.real_size_model import Dims, padded_vocab, prepare, spm_pieces
from benchmarks.report import report_real_size
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
    # `make bench-quick`'s last line nests it as `real_size`; the report renders it beside the toy size's
    res = {"mode": "quick", "summary_by_beam": [{"beam": 4}], "ct2_check": {"identical": 1, "sentences": 1}}
    res |= {"plan": {"limits": {}}, "real_size": real}
    assert headline(res, 4)["real_size"] == s
    assert report_real_size(real)[0] == "## Real size (an OPUS-MT-sized model)" and report_real_size(None) == []
