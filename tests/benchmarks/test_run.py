"""python -m benchmarks.run: the headline ratios measured in interleaved pairs (CTranslate2 offline next to
a real server, the ORT engine offline, and the same server decoding with CTranslate2), and the
summary that turns the parts into the targets' ratios and the last line's keys."""

from __future__ import annotations

import dataclasses

from benchmarks.plan import quick_plan
from benchmarks.report import report_tracing
from benchmarks.runners import run_pairs
from benchmarks.summary import HEADLINE_FIGURES, HEADLINE_RATIOS, Summary, headline, summarize


def test_pairs_measure_ct2_and_the_server_side_by_side(tiny_onnx_dir, tiny_model_dir, data_dir, test_split):
    plan = dataclasses.replace(
        quick_plan(),
        online_beams=[1, 2],
        pairs=2,
        pair_sentences=12,
        pair_requests=70,
        rounds=1,
        latency_n=3,
        offline_layouts={"ct2": [(1, 8)], "ort": [(1, 8)]},
    )
    texts, refs = test_split
    rows = run_pairs(plan, str(tiny_model_dir), 1, texts, refs, offline_rows=[], data_dir=data_dir)
    assert [(r["beam"], r["pair"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    for r in rows:
        assert "error" not in r, r.get("error")
        assert r["ct2_sentences_per_s"] > 0 and r["service_c64_sentences_per_s"] > 0
        assert r["ct2_single_p50_ms"] > 0 and r["service_c1_p50_ms"] > 0
        assert r["throughput_ratio"] == round(r["service_c64_sentences_per_s"] / r["ct2_sentences_per_s"], 3)
        assert r["latency_ratio"] == round(r["service_c1_p50_ms"] / r["ct2_single_p50_ms"], 3)
        # the ORT engine offline and the CTranslate2-served server, in the same pairs
        assert "errors" not in r, r.get("errors")
        assert r["engine_sentences_per_s"] > 0 and r["engine_single_p50_ms"] > 0
        assert r["ct2_served_c64_sentences_per_s"] > 0 and r["ct2_served_c1_p50_ms"] > 0
        assert r["engine_throughput_ratio"] == round(r["engine_sentences_per_s"] / r["ct2_sentences_per_s"], 3)
        assert r["engine_latency_ratio"] == round(r["engine_single_p50_ms"] / r["ct2_single_p50_ms"], 3)
        assert r["served_throughput_ratio"] == round(
            r["service_c64_sentences_per_s"] / r["ct2_served_c64_sentences_per_s"], 3
        )
        assert r["served_latency_ratio"] == round(r["service_c1_p50_ms"] / r["ct2_served_c1_p50_ms"], 3)


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


def _full_pair(i: int, svc, ct2, c1_svc, c1_ct2, engine, engine1, served, served1) -> dict:
    row = {
        "beam": 1,
        "pair": i,
        "ct2_sentences_per_s": ct2,
        "service_c64_sentences_per_s": svc,
        "ct2_single_p50_ms": c1_ct2,
        "service_c1_p50_ms": c1_svc,
        "engine_sentences_per_s": engine,
        "engine_single_p50_ms": engine1,
        "ct2_served_c64_sentences_per_s": served,
        "ct2_served_c1_p50_ms": served1,
    }
    for key, num, den in (
        ("throughput_ratio", svc, ct2),
        ("latency_ratio", c1_svc, c1_ct2),
        ("engine_throughput_ratio", engine, ct2),
        ("engine_latency_ratio", engine1, c1_ct2),
        ("served_throughput_ratio", svc, served),
        ("served_latency_ratio", c1_svc, served1),
    ):
        row[key] = round(num / den, 3)
    return row


def test_summary_takes_the_median_of_the_engine_and_ct2_served_pairs():
    pairs = [
        _full_pair(0, 300, 600, 12, 10, 540, 8, 400, 15),  # engine 0.9, 0.8; served 0.75, 0.8
        _full_pair(1, 330, 500, 15, 10, 550, 12, 300, 10),  # engine 1.1, 1.2; served 1.1, 1.5
        _full_pair(2, 200, 800, 30, 12, 400, 12, 250, 20),  # engine 0.5, 1.0; served 0.8, 1.5
    ]
    # a pair whose CTranslate2-served server failed still counts for the other ratios ...
    partial = _full_pair(3, 300, 300, 10, 10, 300, 10, 1, 1)  # ratios 1.0 and 1.0
    for k in (
        "ct2_served_c64_sentences_per_s",
        "ct2_served_c1_p50_ms",
        "served_throughput_ratio",
        "served_latency_ratio",
    ):
        del partial[k]
    partial["errors"] = {"ct2_served": "did not start"}
    # ... and one whose server failed counts for the engine's alone, not for the service's ratios
    failed = {
        k: v
        for k, v in _full_pair(4, 1, 300, 1, 10, 600, 20, 1, 1).items()
        if not k.startswith(("service", "served", "throughput", "latency", "ct2_served"))
    }
    failed.update(error="service errors", errors={"service": "service errors"})
    s = summarize(_results(pairs + [partial, failed]), 1)
    assert s["pairs"] == 4  # CTranslate2 offline and the server both measured
    assert s["service_over_ct2_int8"] == 0.58  # ratios 0.5, 0.66, 0.25, 1.0
    assert s["engine_over_ct2_int8"] == 1.0  # 0.9, 1.1, 0.5, 1.0, 2.0
    assert s["engine_latency_over_ct2"] == 1.0  # 0.8, 1.2, 1.0, 1.0, 2.0
    assert s["service_over_ct2_served"] == 0.8  # 0.75, 1.1, 0.8
    assert s["latency_c1_over_ct2_served"] == 1.5  # 0.8, 1.5, 1.5
    assert s["pairs_engine_sentences_per_s"] == 540 and s["pairs_engine_single_p50_ms"] == 12
    assert s["pairs_ct2_served_c64_sentences_per_s"] == 300 and s["pairs_ct2_served_c1_p50_ms"] == 15


def test_the_last_line_keeps_its_keys_and_gains_the_new_ratios_per_beam():
    res = _results([_full_pair(0, 300, 600, 12, 10, 540, 8, 400, 15)])
    res.update(
        mode="quick",
        plan={"online_beams": [1], "limits": {"default": 200}},
        ct2_check={"identical": 24, "sentences": 24},
    )
    res["summary_by_beam"] = [summarize(res, 1)]
    line = headline(res, 1)
    kept = [
        "service_over_ct2_int8",
        "latency_c1_over_ct2",
        "service_over_torch_eager",
        "service_over_torch_eager_single",
        "service_many_over_ct2_int8",
        "service_default_over_ct2_int8",
        "service_best_over_ct2_int8",
        "latency_c1_best_over_ct2",
        "pairs",
        "pairs_service_c64_sentences_per_s",
        "pairs_ct2_int8_sentences_per_s",
        "pairs_service_c1_p50_ms",
        "pairs_ct2_single_p50_ms",
        "service_c64_sentences_per_s",
        "service_default_c64_sentences_per_s",
        "service_many_c64_sentences_per_s",
        "ct2_int8_sentences_per_s",
        "service_c1_p50_ms",
        "ct2_single_p50_ms",
        "torch_eager_sentences_per_s",
        "torch_eager_single_sentences_per_s",
    ]
    new = ["engine_over_ct2_int8", "engine_latency_over_ct2", "service_over_ct2_served", "latency_c1_over_ct2_served"]
    assert set(kept + new) <= set(line) and set(kept[:8] + new) <= set(HEADLINE_RATIOS)
    assert line["mode"] == "quick" and line["beam"] == 1 and line["pairs"] == 1
    assert line["ct2_greedy_identical"] == "24/24" and line["offline_sentences"] == {"default": 200}
    assert line["service_over_ct2_int8"] == 0.5 and line["latency_c1_over_ct2"] == 1.2
    assert (line["engine_over_ct2_int8"], line["engine_latency_over_ct2"]) == (0.9, 0.8)
    assert (line["service_over_ct2_served"], line["latency_c1_over_ct2_served"]) == (0.75, 0.8)
    assert line["by_beam"] == {"1": {k: line[k] for k in HEADLINE_RATIOS}}


def test_the_summary_has_every_key_of_its_type_and_the_last_line_only_those():
    s = summarize(_results([_full_pair(0, 300, 600, 12, 10, 540, 8, 400, 15)]), 1)
    assert list(s) == list(Summary.__annotations__)
    assert set(HEADLINE_RATIOS + HEADLINE_FIGURES) <= set(Summary.__annotations__)


def test_the_plan_is_recorded_as_the_dict_a_report_reads_back():
    recorded = dataclasses.asdict(quick_plan())
    assert recorded["online_beams"][-1] == 4 and recorded["limits"]["default"] == 200
    assert quick_plan().limit("torch-eager") == 12 and quick_plan().limit("ort-int8") == 200


def test_summary_without_pairs_uses_the_best_samples():
    s = summarize(_results([]), 1)
    assert s["pairs"] == 0 and s["pairs_service_c64_sentences_per_s"] is None
    assert s["engine_over_ct2_int8"] is None and s["service_over_ct2_served"] is None
    assert s["service_over_ct2_int8"] == 0.5 and s["latency_c1_over_ct2"] == 1.3
    assert s["service_over_torch_eager"] == 10.0 and s["service_over_torch_eager_single"] == 50.0


def test_the_last_line_carries_the_tracing_figures_when_they_were_measured():
    """c64 throughput with tracing off and on (benchmarks/tracing_overhead.py) reaches the JSON
    line and the report; without a tracing part neither has it."""
    res = _results([_full_pair(0, 300, 600, 12, 10, 540, 8, 400, 15)])
    res.update(
        mode="quick",
        plan={"online_beams": [1], "limits": {"default": 200}},
        ct2_check={"identical": 24, "sentences": 24},
    )
    res["summary_by_beam"] = [summarize(res, 1)]
    assert "tracing_overhead" not in headline(res, 1)
    res["tracing"] = {
        "concurrency": 64,
        "beam": 1,
        "requests": 400,
        "pairs": 1,
        "off_sentences_per_s": 200.0,
        "on_sentences_per_s": 190.0,
        "overhead": 0.05,
        "cpu_overhead": 0.04,
    }
    line = headline(res, 1)
    assert line["service_c64_tracing_off_sentences_per_s"] == 200.0
    assert line["service_c64_tracing_on_sentences_per_s"] == 190.0 and line["tracing_overhead"] == 0.05
    text = "\n".join(report_tracing(res))
    assert text.startswith("## Tracing") and "200.0 against 190.0 sent/s" in text and "overhead 5.0%" in text
    assert report_tracing({}) == []


def test_offline_batches_split_evenly_over_the_workers():
    """Both engines batch offline by `balanced_batch`: a multiple of the workers' count of batches of
    nearly equal size, none over the layout's batch size."""
    from benchmarks.offline import balanced_batch

    assert balanced_batch(200, 64, 2) == 50  # not 64, 64, 64, 8: one worker 128 sentences, the other 72
    assert balanced_batch(200, 32, 2) == 25
    assert balanced_batch(1000, 32, 1) == 32
    assert balanced_batch(5, 64, 2) == 3
    for n, size, workers in [(200, 64, 2), (1000, 64, 2), (1000, 32, 2), (37, 8, 3), (1, 32, 2)]:
        b = balanced_batch(n, size, workers)
        batches = -(-n // b)
        assert 1 <= b <= size
        loads = [sum(min(b, n - i * b) for i in range(w, batches, workers)) for w in range(workers)]
        assert max(loads) - min(loads) <= b, (n, size, workers, loads)


def test_the_report_shows_the_newest_translation_service_run(tmp_path):
    import json

    from benchmarks.report import report_translation_service

    assert report_translation_service(tmp_path) == []
    cost = {"median_of_ratios": 1.2, "median_of_ratios_by_group": {"one_pass": 1.1}}
    old = {
        "glossary": {
            "matched": {"in_place": 0.5, "cost": {"median_of_ratios": 9.0}},
            "do_not_translate": {"verbatim": 0.0},
        }
    }
    new = {
        "machine": {"commit": "abc1234", "date": "2026-11-28"},
        "html": {"tags_preserved": 1.0, "text_as_plain_applicable": 1.0, "cost_html_vs_plain": cost},
        "glossary": {
            "matched": {"in_place": 0.95, "cost": {"median_of_ratios": 1.45}},
            "do_not_translate": {"verbatim": 1.0},
        },
    }
    (tmp_path / "translation-service-20260101T000000Z.json").write_text(json.dumps(old))
    (tmp_path / "translation-service-20260102T000000Z.json").write_text(json.dumps(new))
    (tmp_path / "translation-service-real-size-20260102T000000Z.json").write_text(
        json.dumps({"glossary_cost": {"median_of_ratios": 1.3}})
    )
    text = "\n".join(report_translation_service(tmp_path))
    assert "translation-service-20260102T000000Z.json" in text and "abc1234" in text
    assert "| 1.2 (1.1) | ≤ 1.15 |" in text and "| 0.95 | ≥ 0.95 |" in text and "| 1.45 | ≤ 1.5 |" in text
    assert "9.0" not in text and "placement" not in text  # the newest run only, its parts only
    assert "a one-entry glossary 1.3x" in text
