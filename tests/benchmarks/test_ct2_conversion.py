"""The CTranslate2 conversion of benchmarks/ct2_convert.py runs the same model: on the tiny model,
its greedy output equals the PyTorch reference's token for token. Skipped without ctranslate2 (the
`bench` extra)."""

from __future__ import annotations

import pytest

from benchmarks.ct2_convert import Ct2Translator, convert, sinusoidal_table

ctranslate2 = pytest.importorskip("ctranslate2")


def test_position_table_is_the_models():
    import numpy as np

    from export.model import sinusoidal_table as torch_table

    # numpy and torch round sin/exp differently in the last bit: close, not identical
    np.testing.assert_allclose(sinusoidal_table(256, 32), torch_table(256, 32).numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("compute_type", ["float32"])
def test_greedy_matches_reference(tiny_model_dir, tiny_model, test_split, tmp_path, compute_type):
    from export.generate import greedy_search
    from export.translator import TorchTranslator

    src_texts = test_split[0][:24]
    ref = TorchTranslator(tiny_model_dir)
    src = ref.source_ids(src_texts)
    want = [h.tokens for h in greedy_search(tiny_model, src)]
    ct2_dir = convert(tiny_model_dir, tmp_path / "ct2")
    got = Ct2Translator(ct2_dir, tiny_model_dir, compute_type=compute_type).translate_ids(src, beam=1)
    assert got == want


def test_length_rule_is_applied(tiny_model_dir, test_split, tmp_path):
    """Outputs never exceed our per-sentence limit (max_len - 1 tokens before </s>)."""
    from export.translator import TorchTranslator

    src = TorchTranslator(tiny_model_dir).source_ids(test_split[0][:8])
    ct = Ct2Translator(convert(tiny_model_dir, tmp_path / "ct2"), tiny_model_dir)
    for out in ct.translate_ids(src, beam=1, max_len_a=0.0, max_len_b=3):
        assert len(out) <= 2
