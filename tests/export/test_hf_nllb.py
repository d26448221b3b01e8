"""`mtserve import` of a local Hugging Face NLLB folder (an M2M100 model with `NllbTokenizer`):
the SentencePiece model and the vocab.json the import writes against transformers' tokenizer on
the 1,000 test sentences, the imported model against transformers, the languages under their
FLORES-200 codes, and the NLLB tokenizers it refuses.

The folder is a tiny random model built offline by the `hf_nllb_dir` session fixture."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest

from contract.manifest import load_manifest
from export.hf.config import HFImportError
from export.hf.importer import import_model
from export.hf.parity import TOLERANCE
from export.tokenizer import SentencePieceTokenizer
from tests.conftest import NLLB_LANGUAGES

pytest.importorskip("transformers")
N_PARITY = 200


def _test_lines(data_dir: Path, lang: str) -> list[str]:
    with gzip.open(data_dir / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f]


def test_nllb_ids_and_text_equal_transformers(hf_nllb_dir, data_dir, tmp_path):
    from transformers import NllbTokenizer

    from export.hf.tokenizer import import_nllb

    theirs = NllbTokenizer.from_pretrained(str(hf_nllb_dir))
    imported = import_nllb(hf_nllb_dir, tmp_path, "deu_Latn", "eng_Latn", texts=["Ein Hund."])
    tokens = imported.languages["source_tokens"]
    assert tokens == {code: theirs.convert_tokens_to_ids(code) for code in NLLB_LANGUAGES}
    assert imported.languages["target_tokens"] == tokens and imported.unk_id == theirs.unk_token_id == 3
    assert json.loads((tmp_path / "vocab.json").read_text()) == theirs.get_vocab()
    ours = SentencePieceTokenizer(
        tmp_path / "sentencepiece.bpe.model",
        tmp_path / "sentencepiece.bpe.model",
        tmp_path / "vocab.json",
        tmp_path / "vocab.json",
        imported.unk_id,
        {0, 1, 2, 3, *tokens.values()},
    )
    eos = theirs.eos_token_id
    for lang, code in (("de", "deu_Latn"), ("fr", "fra_Latn")):
        texts = _test_lines(data_dir, lang)
        assert len(texts) == 1000
        theirs.src_lang = code
        assert [[tokens[code], *ours.encode(t), eos] for t in texts] == theirs(texts)["input_ids"]
    theirs.tgt_lang = "eng_Latn"
    target_ids = theirs(text_target=_test_lines(data_dir, "en"))["input_ids"]
    assert target_ids[0][0] == tokens["eng_Latn"] and target_ids[0][-1] == eos
    # mtserve strips the text: transformers keeps the space before a word that followed a dropped <unk>
    theirs_text = [t.strip() for t in theirs.batch_decode(target_ids, skip_special_tokens=True)]
    assert [ours.decode(ids) for ids in target_ids] == theirs_text


@pytest.fixture(scope="module")
def imported_nllb(tmp_path_factory, data_dir, hf_nllb_dir) -> tuple[Path, dict]:
    repo = tmp_path_factory.mktemp("repo-nllb")
    texts = _test_lines(data_dir, "de")[:N_PARITY]
    report = import_model(hf_nllb_dir, repo, "nllb", tgt_lang="fra_Latn", texts=texts, precisions=("fp32",))
    return repo / "nllb" / "1", report


def test_nllb_import_matches_transformers(imported_nllb):
    _, report = imported_nllb
    assert (report["architecture"], report["src_lang"], report["tgt_lang"]) == (
        "M2M100ForConditionalGeneration",
        "deu_Latn",
        "fra_Latn",
    )
    assert report["languages"] == len(NLLB_LANGUAGES)
    assert report["parity"]["sentences"] == N_PARITY
    assert report["parity"]["greedy_identical"] == N_PARITY
    assert report["parity"]["max_abs_log_prob_diff"] <= TOLERANCE
    assert report["onnx_parity"]["fp32"]["log_probs"] <= 1e-4


def test_nllb_serving_tokenizer_and_translation(imported_nllb, hf_nllb_dir, data_dir):
    """The manifest's tokenizer on the serving path gives transformers' ids, and the torch
    translator (language code first, target code forced) gives transformers' greedy text."""
    from transformers import M2M100ForConditionalGeneration, NllbTokenizer

    from export.translator import TorchTranslator
    from service.runtime.tokenizer import load_tokenizer

    model_dir, _ = imported_nllb
    m = load_manifest(model_dir / "onnx")
    assert m.languages.source == NLLB_LANGUAGES and m.languages.target_tokens == m.languages.source_tokens
    assert m.special_ids.start_id == m.special_ids.eos_id == 2
    tok = NllbTokenizer.from_pretrained(str(hf_nllb_dir), src_lang="deu_Latn")
    texts = _test_lines(data_dir, "de")[:100]
    serving = load_tokenizer(model_dir / "onnx", m)
    code = m.languages.source_tokens["deu_Latn"]
    assert [[code, *serving.encode(t), tok.eos_token_id] for t in texts] == tok(texts)["input_ids"]
    hf = M2M100ForConditionalGeneration.from_pretrained(str(hf_nllb_dir)).eval()
    batch = tok(texts[:16], return_tensors="pt", padding=True)
    ces = tok.convert_tokens_to_ids("ces_Latn")
    # mtserve's length rule: </s> at the last allowed step (transformers' forced_eos_token_id)
    out = hf.generate(
        **batch,
        num_beams=1,
        do_sample=False,
        max_new_tokens=20,
        forced_bos_token_id=ces,
        forced_eos_token_id=tok.eos_token_id,
    )
    ours = TorchTranslator(model_dir).translate(
        texts[:16], src_lang="deu_Latn", tgt_lang="ces_Latn", beam=1, max_len_a=0, max_len_b=20
    )
    assert ours == [t.strip() for t in tok.batch_decode(out, skip_special_tokens=True)]
    assert len(set(ours)) > 1


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


REFUSALS = {
    "legacy_behaviour": lambda f: _edit_json(f / "tokenizer_config.json", legacy_behaviour=True),
    # without its normalizer the HF tokenizer keeps both spaces of "  " and no longer maps "ﬁ" to "fi"
    "normalizer": lambda f: _edit_json(f / "tokenizer.json", normalizer=None),
    "src_lang": lambda f: _edit_json(f / "tokenizer_config.json", src_lang="xho_Latn"),
    "sentencepiece.bpe.model": lambda f: (f / "sentencepiece.bpe.model").unlink(),
}


@pytest.mark.parametrize("field", list(REFUSALS))
def test_refused_nllb_folder_names_the_field_and_writes_nothing(field, tmp_path, hf_nllb_dir):
    folder = tmp_path / "hf"
    shutil.copytree(hf_nllb_dir, folder)
    REFUSALS[field](folder)
    repo = tmp_path / "repo"
    with pytest.raises(HFImportError, match=field.replace(".", r"\.")):
        import_model(folder, repo, "nllb", texts=["Zwei  Hunde spielen im Schnee.", "Ein ﬁx gebautes Haus."])
    assert not repo.exists()
