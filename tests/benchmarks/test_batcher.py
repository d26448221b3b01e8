"""benchmarks/batcher.py drives the real scheduler in-process: every sentence it submits is
answered, never more than `concurrency` are in flight, and the step figures come from the
scheduler's own metrics."""

from __future__ import annotations

import pytest

from benchmarks.batcher import run


@pytest.mark.parametrize("continuous", [True, False])
def test_closed_loop_answers_every_sentence(tiny_onnx_dir, tiny_model_dir, test_split, continuous):
    concurrency, beam = 6, 2
    row = run(
        tiny_model_dir,
        test_split[0][:40],
        concurrency=concurrency,
        beam=beam,
        sentences=30,
        continuous_batching=continuous,
        decode_workers=2,
        precision="fp32",
    )
    assert row["errors"] == 0
    assert row["sentences"] == 30 and row["sentences_per_s"] > 0
    assert row["decoder_steps"] > 0
    # rows in one step: at most the sentences in flight, beam rows each
    assert 1 <= row["rows_per_step"] <= concurrency * beam
    assert row["p50_ms"] <= row["p99_ms"]
