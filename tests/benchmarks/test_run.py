"""benchmarks/run.py: the headline ratios measured in interleaved pairs (CTranslate2 offline next to
a real server), and the summary that turns the parts into the targets' ratios."""

from __future__ import annotations

from benchmarks.run import run_pairs, summarize


def test_pairs_measure_ct2_and_the_server_side_by_side(tiny_onnx_dir, tiny_model_dir, data_dir, test_split):
    plan = {
        "online_beams": [1, 2],
        "pairs": 2,
        "pair_sentences": 12,
        "pair_requests": 70,
        "rounds": 1,
        "latency_n": 3,
        "offline_layouts": {"ct2": [(1, 8)]},
    }
    texts, refs = test_split
    rows = run_pairs(plan, str(tiny_model_dir), 1, texts, refs, offline_rows=[], data_dir=data_dir)
    assert [(r["beam"], r["pair"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["ct2_sentences_per_s"] > 0 and r["service_c64_sentences_per_s"] > 0
        assert r["ct2_single_p50_ms"] > 0 and r["service_c1_p50_ms"] > 0
        assert r["throughput_ratio"] == round(r["service_c64_sentences_per_s"] / r["ct2_sentences_per_s"], 3)
        assert r["latency_ratio"] == round(r["service_c1_p50_ms"] / r["ct2_single_p50_ms"], 3)


def _level(c: int, sent_s: float, p50: float) -> dict:
    return {"concurrency": c, "sentences_per_s": sent_s, "p50_ms": p50, "errors": {}}


def _results(pairs: list[dict]) -> dict:
    offline = [
        {
            "engine": "ct2-int8",
            "beam": 1,
            "workers": 2,
            "threads": 2,
            "batch_size": 32,
            "sentences_per_s": 800.0,
            "latency_single": {"p50_ms": 10.0},
        },
        {"engine": "torch-eager", "beam": 1, "workers": 1, "threads": 2, "batch_size": 64, "sentences_per_s": 40.0},
        {"engine": "torch-eager", "beam": 1, "workers": 1, "threads": 2, "batch_size": 1, "sentences_per_s": 8.0},
    ]
    online = {"runs": [{"beam": 1, "server_args": [], "levels": [_level(1, 70.0, 13.0), _level(64, 400.0, 150.0)]}]}
    return {"offline": offline, "online": online, "sweep": [], "pairs": pairs}


def test_summary_takes_the_median_of_the_pairs():
    pairs = [
        {
            "beam": 1,
            "pair": i,
            "ct2_sentences_per_s": ct2,
            "service_c64_sentences_per_s": svc,
            "ct2_single_p50_ms": c1_ct2,
            "service_c1_p50_ms": c1_svc,
            "throughput_ratio": round(svc / ct2, 3),
            "latency_ratio": round(c1_svc / c1_ct2, 3),
        }
        for i, (svc, ct2, c1_svc, c1_ct2) in enumerate([(300, 600, 12, 10), (330, 500, 15, 10), (200, 800, 30, 12)])
    ]
    pairs.append({"beam": 1, "pair": 3, "error": "server errors"})  # a failed pair does not count
    s = summarize(_results(pairs), 1)
    assert s["pairs"] == 3
    assert s["service_over_ct2_int8"] == 0.5  # ratios 0.5, 0.66, 0.25
    assert s["latency_c1_over_ct2"] == 1.5  # ratios 1.2, 1.5, 2.5
    assert s["pairs_service_c64_sentences_per_s"] == 300
    # the best samples of the separate parts, kept beside the pairs
    assert s["service_best_over_ct2_int8"] == 0.5 and s["latency_c1_best_over_ct2"] == 1.3
    # the textbook loop: batched and one sentence at a time, against the pairs' median service throughput
    assert s["service_over_torch_eager"] == 7.5 and s["service_over_torch_eager_single"] == 37.5
    assert s["torch_eager_sentences_per_s"] == 40.0 and s["torch_eager_single_sentences_per_s"] == 8.0


def test_summary_without_pairs_uses_the_best_samples():
    s = summarize(_results([]), 1)
    assert s["pairs"] == 0 and s["pairs_service_c64_sentences_per_s"] is None
    assert s["service_over_ct2_int8"] == 0.5 and s["latency_c1_over_ct2"] == 1.3
    assert s["service_over_torch_eager"] == 10.0 and s["service_over_torch_eager_single"] == 50.0
