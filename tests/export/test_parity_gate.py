"""The export's fp32 parity gate on a model whose log-probabilities reach the thousands: most of its
vocabulary far below the rest through large output weights and bias (as a trained model's unlikely
tokens), <pad> at NEG_INF (OPUS-MT's bad_words_ids folded in). There fp32 rounding alone moves a log-prob by up to
2^-10 ≈ 1e-3, beyond the gate's 1e-4, though no search could ever pick those tokens: the gate
compares log-probs clipped at LOG_PROB_FLOOR, so the export passes, while every difference above the
floor still counts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from export import checks
from export.checkpoint import save_model_dir
from export.checks import FP32_TOLERANCE, LOG_PROB_FLOOR, fused_parity_check, log_prob_diff, parity_check
from export.model import NEG_INF, ModelConfig, Transformer
from export.to_onnx import export_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENIZER = Path(__file__).resolve().parents[2] / "models" / "de-en" / "1" / "tokenizer.json"
CONFIG = dict(
    vocab_size=96,
    d_model=32,
    n_heads=4,
    n_encoder_layers=2,
    n_decoder_layers=2,
    d_ff=64,
    dropout=0.0,
    max_positions=32,
    pre_norm=False,
    activation="swish",
    logits_bias=True,
    decoder_start_id=0,
    tie_embeddings=False,
)


def far_model() -> Transformer:
    """Tokens 40.. with output weights 500 times larger and a bias of -2e4: logits of -2e4 ± a few
    thousand, whose fp32 sums round differently in ONNX Runtime and PyTorch; <pad> at NEG_INF."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**CONFIG)).eval()
    assert model.generator is not None
    with torch.no_grad():
        model.generator.weight[40:] *= 500.0
        bias = model.final_logits_bias
        bias.normal_(0.0, 1.0)
        bias[40:] = -2e4
        bias[model.cfg.pad_id] = NEG_INF
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[Transformer, Path]:
    model = far_model()
    root = tmp_path_factory.mktemp("far")
    save_model_dir(model, root / "model", TOKENIZER)
    export_model(root / "model", root / "onnx", ["fp32"])  # raises when the gate refuses
    return model, root / "onnx"


def test_log_prob_diff_counts_what_a_search_can_see():
    want = np.array([[-0.5, -3.0, -49.0, -1000.0, -1e4]], np.float32)
    assert log_prob_diff(want + np.float32([[0, 0, 0, 1e-3, 1e-3]]), want) == 0.0  # below the floor
    assert log_prob_diff(want + np.float32([[2e-4, 0, 0, 0, 0]]), want) == pytest.approx(2e-4, rel=1e-3)
    assert log_prob_diff(want + np.float32([[0, 0, -2.0, 0, 0]]), want) == pytest.approx(1.0)  # to the floor
    assert log_prob_diff(np.float32([[-0.5, -3.0, -49.0, -40.0, -1e4]]), want) == pytest.approx(10.0)
    assert LOG_PROB_FLOOR == -50.0


def test_the_gate_passes_a_model_with_log_probs_in_the_thousands(exported, monkeypatch):
    model, out = exported
    fused = out / "decoder.fused.fp32.onnx"
    gated = (
        fused_parity_check(model, fused)["log_probs"],
        parity_check(model, out / "encoder.fp32.onnx", out / "decoder.fp32.onnx")["log_probs"],
    )
    assert max(gated) <= FP32_TOLERANCE
    # The same graphs and states measured over the whole vocabulary (the gate before the floor):
    # beyond the tolerance, from tokens no search can pick.
    monkeypatch.setattr(checks, "LOG_PROB_FLOOR", -np.inf)
    whole = (
        fused_parity_check(model, fused)["log_probs"],
        parity_check(model, out / "encoder.fp32.onnx", out / "decoder.fp32.onnx")["log_probs"],
    )
    assert max(whole) > FP32_TOLERANCE
