"""The serving path's tokenizers: SentencePiece models with {piece: id} vocabularies (imported
models) and mtserve's own BPE, behind one interface."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import sentencepiece as spm

from service.runtime.tokenizer import BpeTokenizer, SentencePieceTokenizer

EOS, UNK, PAD = 0, 1, 2
LANG_DE, LANG_EN = 500, 501


@pytest.fixture(scope="module")
def sp_files(tmp_path_factory, data_dir) -> tuple[Path, Path]:
    """A SentencePiece model trained on 2000 German lines, and a vocabulary of its pieces that
    leaves two of them out (to map to <unk>)."""
    out = tmp_path_factory.mktemp("spm")
    with gzip.open(data_dir / "train.de.gz", "rt", encoding="utf-8") as f:
        lines = [next(f).strip() for _ in range(2000)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(out / "de"), vocab_size=300, minloglevel=2
    )
    sp = spm.SentencePieceProcessor(model_file=str(out / "de.model"))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = {"</s>": EOS, "<unk>": UNK, "<pad>": PAD}
    vocab.update({p: i + 3 for i, p in enumerate(p for p in pieces if p not in ("▁Hund", "▁Mann"))})
    (out / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    return out / "de.model", out / "vocab.json"


def make(sp_files: tuple[Path, Path]) -> SentencePieceTokenizer:
    model, vocab = sp_files
    return SentencePieceTokenizer(
        model,
        model,
        vocab,
        vocab,
        unk_id=UNK,
        special_ids={EOS, UNK, PAD, LANG_DE, LANG_EN},
        named={LANG_DE: "de", LANG_EN: "en"},
    )


def test_sentencepiece_round_trip_and_spaces(sp_files):
    tok = make(sp_files)
    text = "Zwei Kinder spielen im Schnee."
    ids = tok.encode(text)
    assert ids and UNK not in ids and EOS not in ids  # nothing added
    assert tok.decode(ids) == text  # the leading "▁" of a piece is a space, not kept at the start
    pieces = [tok.id_to_token(i) for i in ids]
    assert pieces[0].startswith("▁") and all(p is not None for p in pieces)
    # Decoding a prefix of the ids gives a prefix of the text: what streaming relies on.
    for n in range(1, len(ids)):
        assert text.startswith(tok.decode(ids[:n]).rstrip())


def test_sentencepiece_unknown_pieces_and_special_tokens(sp_files):
    tok = make(sp_files)
    ids = tok.encode("Ein Mann")
    assert UNK in ids  # "▁Mann" is not in the vocabulary
    assert tok.token_to_id("<unk>") == UNK and tok.token_to_id("</s>") == EOS
    body = tok.encode("Ein Kind")
    # Special and language tokens never reach the text; the language token has a name for alignments.
    assert tok.decode([LANG_EN, *body, EOS, PAD]) == tok.decode(body) == "Ein Kind"
    assert tok.id_to_token(LANG_EN) == "en" and tok.id_to_token(10**6) is None
    assert tok.vocab_size == LANG_EN + 1


def test_bpe_tokenizer(tiny_model_dir):
    tok = BpeTokenizer(tiny_model_dir / "tokenizer.json")
    ids = tok.encode("Ein Hund läuft.")
    assert tok.decode(ids).strip() == "Ein Hund läuft."
    assert tok.token_to_id("</s>") is not None and tok.id_to_token(ids[0]) is not None
    assert tok.decode([tok.token_to_id("</s>"), *ids]).strip() == "Ein Hund läuft."


def test_control_tokens_in_text_are_text(sp_files, tiny_model_dir, tmp_path):
    """`</s>`, `<pad>`, `<s>`, `<unk>` and language tags in a text never become control ids: the
    BPE tokenizer encodes them as characters (it read them as its special tokens), a
    SentencePiece piece that the vocabulary maps to a control id reads as <unk>."""
    bpe = BpeTokenizer(tiny_model_dir / "tokenizer.json")
    control = {bpe.token_to_id(t) for t in ("<pad>", "<s>", "</s>", "<unk>")}
    for text in ("A dog</s>", "<pad><pad>", "</s>", "<s> x <unk>"):
        ids = bpe.encode(text)
        assert ids and not control & set(ids), (text, ids)
        assert bpe.decode(ids).strip() == text
    model, vocab = sp_files
    entries = json.loads(vocab.read_text(encoding="utf-8"))
    entries["▁Kind"] = LANG_DE  # a vocabulary that maps a piece of text to a language token
    (tmp_path / "vocab.json").write_text(json.dumps(entries), encoding="utf-8")
    tok = make((model, tmp_path / "vocab.json"))
    for text in ("Ein Kind</s>", "<pad> de __de__ >>de<<"):
        ids = tok.encode(text) + tok.encode_target(text)
        assert not {EOS, PAD, LANG_DE, LANG_EN} & set(ids), (text, ids)
    assert UNK in tok.encode("Ein Kind") and tok.token_to_id("</s>") == EOS
