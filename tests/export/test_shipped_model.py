"""The German→English model that ships in models/de-en: present, small, sensible, exportable."""

import json

import pytest

from export.checkpoint import CONFIG, TOKENIZER, WEIGHTS

MODEL_DIR_FILES = (WEIGHTS, CONFIG, TOKENIZER, "MODEL_CARD.md")


@pytest.fixture(scope="module")
def model_dir():
    from pathlib import Path

    d = Path(__file__).resolve().parents[2] / "models" / "de-en"
    assert d.is_dir(), "the default model must ship in models/de-en"
    return d


@pytest.fixture(scope="module")
def translator(model_dir):
    import torch

    from export.translator import TorchTranslator

    torch.set_num_threads(1)
    return TorchTranslator(model_dir)


def test_files_and_size(model_dir):
    for name in MODEL_DIR_FILES:
        assert (model_dir / name).is_file(), name
    size = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
    assert size < 40 * 1024 * 1024


def test_config_records_training_and_stays_small(model_dir, translator):
    from export.model import count_parameters

    meta = json.loads((model_dir / CONFIG).read_text())
    assert meta["src_lang"] == "de" and meta["tgt_lang"] == "en"
    assert meta["training"]["parameters"] == count_parameters(translator.model) < 25_000_000
    assert translator.tokenizer.get_vocab_size() == meta["model"]["vocab_size"]


def test_it_translates(translator):
    out = translator.translate(["Ein Hund rennt durch den Schnee.", "Zwei Männer sitzen auf einer Bank."], beam=4)
    assert "dog" in out[0].lower() and "snow" in out[0].lower()
    assert "two men" in out[1].lower() and "bench" in out[1].lower()


def test_onnx_export_matches_pytorch_greedy(model_dir, translator, tmp_path, test_split):
    from export.to_onnx import export_model
    from service.decoding.translator import OnnxTranslator

    export_model(model_dir, tmp_path / "onnx", ["fp32"])
    onnx = OnnxTranslator(tmp_path / "onnx", precision="fp32")
    src = test_split[0][:60]
    assert onnx.translate(src, beam=1) == translator.translate(src, beam=1)


@pytest.mark.slow
def test_quality_bar_on_the_full_test_split(model_dir, translator, test_split):
    import sacrebleu

    de, en = test_split
    greedy = sacrebleu.corpus_bleu(translator.translate(de, beam=1), [en]).score
    beam4 = sacrebleu.corpus_bleu(translator.translate(de, beam=4), [en]).score
    assert greedy >= 34.0 and beam4 >= 36.0, (greedy, beam4)
