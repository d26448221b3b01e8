"""The NLLB size's tokenizer layout (benchmarks/real_size_nllb.py) at tiny dimensions: the padded
SentencePiece model's size, its dummies that no text yields, and the tokenizer's ids filling the
model as NLLB-200's fill its 256,206 rows."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.real_size_model import Dims, read_lines, train_spm
from benchmarks.real_size_nllb import NLLB_600M, UNUSED_ROWS, language_codes, nllb_spm_size, nllb_tokenizer, pad_spm

pytest.importorskip("transformers")


def test_the_spm_size_gives_nllb_200s_layout() -> None:
    assert len(language_codes()) == 202
    assert nllb_spm_size(256206, 202) == 256000  # NLLB-200's sentencepiece.bpe.model
    assert nllb_spm_size(1000, 4) == 1000 - 2 - 4 - 1 - 4 + 3
    with pytest.raises(ValueError, match="no room"):
        nllb_spm_size(209, 202)


def test_the_nllb_size_is_keyed_apart() -> None:
    assert NLLB_600M.key == "nllb-d1024-l12-h16-f4096-v256206-s1"
    assert replace(NLLB_600M, family="marian").key == "d1024-l12-h16-f4096-v256206-s1"
    assert Dims().key == "d512-l6-h8-f2048-v58101-s1"  # the OPUS-MT size's cache stays where it is


def test_padded_spm_encodes_as_before_and_never_yields_a_dummy(data_dir, tmp_path: Path) -> None:
    import sentencepiece

    lines = read_lines("de", limit=2000, data=Path(data_dir))
    spm = train_spm(lines, tmp_path / "de", 300, model_type="bpe")
    (tmp_path / "padded.model").write_bytes(pad_spm(spm.read_bytes(), 700))
    before = sentencepiece.SentencePieceProcessor(model_file=str(spm))
    after = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "padded.model"))
    assert (before.get_piece_size(), after.get_piece_size()) == (300, 700)
    assert [after.id_to_piece(i) for i in (300, 699)] == ["<dummy_0>", "<dummy_399>"]
    assert max(after.get_score(i) for i in range(300, 700)) < min(before.get_score(i) for i in range(3, 300))
    texts = read_lines("de", split="test_2016_flickr", data=Path(data_dir))
    assert after.encode(texts) == before.encode(texts)  # no id >= 300: no dummy
    with pytest.raises(ValueError, match="do not fit"):
        pad_spm(spm.read_bytes(), 299)


def test_the_tokenizer_fills_the_model_as_nllbs_does(data_dir, tmp_path: Path) -> None:
    from transformers import NllbTokenizer

    dims = replace(NLLB_600M, vocab=1500, spm_pieces=300, spm_lines=2000)
    size = nllb_tokenizer(tmp_path / "tok", dims, Path(data_dir))
    assert size == dims.vocab - UNUSED_ROWS
    tok = NllbTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert len(tok) == size and (tmp_path / "tok" / "sentencepiece.bpe.model").exists()
    assert [tok.convert_ids_to_tokens(i) for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    codes = tok.convert_tokens_to_ids(language_codes())
    assert sorted(codes) == list(range(size - 202, size))  # the 202 codes are the last ids
    texts = read_lines("de", split="test_2016_flickr", data=Path(data_dir))
    ids = tok(texts).input_ids
    assert all(row[0] == tok.convert_tokens_to_ids("deu_Latn") and row[-1] == 2 for row in ids)
    assert not any(p.startswith("<dummy_") for row in ids for p in tok.convert_ids_to_tokens(row))
