"""The joint subword tokenizer."""

import pytest

from export.checkpoint import TOKENIZER
from export.tokenizer import (
    SPECIAL_TOKENS,
    decode,
    decode_batch,
    encode_batch,
    load_tokenizer,
    special_ids,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir / TOKENIZER)


def test_special_ids_are_first(tok):
    assert special_ids(tok) == {"pad_id": 0, "bos_id": 1, "eos_id": 2, "unk_id": 3}
    assert [tok.id_to_token(i) for i in range(4)] == SPECIAL_TOKENS


def test_round_trip_on_test_split(tok, test_split):
    """Every sentence of both sides of the test split decodes back to itself exactly, which also
    means no stray spaces before punctuation."""
    for texts in test_split:
        assert decode_batch(tok, encode_batch(tok, texts)) == texts


def test_no_unknown_tokens_for_any_unicode(tok):
    text = "Ein Hund 🐕 läuft — «schnell»! \u200f مرحبا 中文 e\u0301"
    ids = encode_batch(tok, [text])[0]
    assert tok.token_to_id("<unk>") not in ids
    assert decode(tok, ids) == text.replace("e\u0301", "\u00e9")  # NFC normalisation


def test_punctuation_detokenizes_naturally(tok):
    s = "A dog, a cat and a man (outside)."
    assert decode(tok, encode_batch(tok, [s])[0]) == s


def test_vocab_size_is_respected(data_dir):
    from export.data import read_parallel

    de, en = read_parallel(data_dir, "val")
    tok = train_tokenizer(de + en, vocab_size=700)
    assert tok.get_vocab_size() <= 700
