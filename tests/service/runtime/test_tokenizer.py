"""The serving path's tokenizers: SentencePiece models with {piece: id} vocabularies (imported
models) and mtserve's own BPE, behind one interface."""

from __future__ import annotations

import gzip
import json
import random
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
    assert tok.decode_prefixes(ids) == [tok.decode(ids[:n]) for n in range(1, len(ids) + 1)]


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


def test_bpe_decode_prefixes_are_the_prefixes_decoded(tiny_model_dir):
    """Each prefix's text, read from the tokens' bytes, is what decoding that prefix gives: for
    random ids (pieces of a character among them, U+FFFD until the character is complete, and the
    special tokens, which decoding skips), and with an added token that is not special (whose
    text the tokenizer writes: decoded prefix by prefix)."""
    tok = BpeTokenizer(tiny_model_dir / "tokenizer.json")
    rng = random.Random(0)
    cases = [tok.encode("A dog — über 3€ naïve 😀"), [0, 1, 2, 3]]
    cases += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 12))] for _ in range(2000)]
    assert sum("\ufffd" in tok.decode(ids) for ids in cases) > 100
    for ids in cases:
        assert tok.decode_prefixes(ids) == [tok.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    added = tok.vocab_size
    assert tok.tokenizer.add_tokens(["<x-added>"]) == 1
    ids = [*tok.encode("Ein Hund"), added, *tok.encode(" läuft")]
    assert tok.decode_prefixes(ids) == [tok.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    assert "<x-added>" in tok.decode_prefixes(ids)[-1]


TEXTS = ["Ein Hund läuft über die Straße.", "Zwei   Männer (ACME) spielen.", "  Café \ufb01 x 😀 ", ""]


def _check_offsets(tok, text: str) -> None:
    ids, spans = tok.encode_with_offsets(text)
    assert ids == tok.encode(text) and len(spans) == len(ids)
    at = 0
    for start, end in spans:  # in order, within the text, none opening with whitespace unless all is
        assert at <= start <= end <= len(text)
        assert not text[start:end][:1].isspace() or not text[start:end].strip()
        at = start
    for word in text.split():  # every word's characters lie in the spans of some tokens
        w = text.index(word)
        assert any(s <= w < e for s, e in spans) or not tok.encode(word)


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_offsets(sp_files, text):
    tok = make(sp_files)
    _check_offsets(tok, text)
    ids, spans = tok.encode_with_offsets("Zwei Kinder spielen im Schnee.")
    assert [tok.decode([i]).strip() for i in ids] == ["Zwei Kinder spielen im Schnee."[s:e] for s, e in spans]


@pytest.mark.parametrize("text", TEXTS)
def test_bpe_offsets(tiny_model_dir, text):
    tok = BpeTokenizer(tiny_model_dir / "tokenizer.json")
    _check_offsets(tok, text)
    ids, spans = tok.encode_with_offsets("Ein Hund läuft.")
    assert [tok.decode([i]).strip() for i in ids] == ["Ein Hund läuft."[s:e] for s, e in spans]


# ----------------------------------------------------------------------------- ids without an entry
# M2M100's made-up words: the embedding rows after the language codes that vocab.json does not name
# (tests/service/conftest.py's `padded_repository`).


@pytest.fixture(scope="module")
def padded_export(padded_repository) -> Path:
    from tests.service.imported import M2M100_PADDED

    return padded_repository / M2M100_PADDED / "1" / "onnx"


def test_ids_without_an_entry_are_unk_as_in_transformers(padded_export, hf_m2m100_padded_dir):
    """1,000 seeds, each drawing ids uniformly over the whole vocabulary (sampling at an infinite
    temperature): the tokens are transformers' M2M100Tokenizer's (`<unk>` for a made-up word), the
    text is its batch_decode(skip_special_tokens=True), less the language tokens it keeps."""
    import numpy as np
    from transformers import M2M100Tokenizer

    from contract.manifest import load_manifest
    from service.runtime.tokenizer import load_tokenizer

    manifest = load_manifest(padded_export)
    ours = load_tokenizer(padded_export, manifest)
    theirs = M2M100Tokenizer.from_pretrained(str(hf_m2m100_padded_dir))
    size = manifest.dims.vocab_size
    assert ours.unmapped_ids == set(range(size - 8, size))  # the 8 made-up words, found at load
    languages = set(theirs.lang_code_to_id.values())
    rows, hits = [], 0
    for seed in range(1, 1001):
        ids = [int(i) for i in np.random.default_rng(seed).integers(0, size, 24)]
        rows.append([i for i in ids if i not in languages])
        assert [ours.token(i) for i in ids] == theirs.convert_ids_to_tokens(ids)
        hits += sum(i in ours.unmapped_ids for i in ids)
    assert hits > 50
    texts = theirs.batch_decode(rows, skip_special_tokens=True)
    assert [ours.decode(r).strip() for r in rows] == [t.strip() for t in texts]
    assert sum("<unk>" in t for t in texts) > 50


def test_a_recorded_list_of_unmapped_ids_must_agree(padded_export):
    from contract.manifest import load_manifest
    from service.runtime.tokenizer import load_tokenizer

    manifest = load_manifest(padded_export)
    assert manifest.sentencepiece is not None
    found = sorted(load_tokenizer(padded_export, manifest).unmapped_ids)

    def recording(ids: list[int]):
        sp = manifest.sentencepiece.model_copy(update={"unmapped_ids": ids})
        return manifest.model_copy(update={"sentencepiece": sp})

    assert sorted(load_tokenizer(padded_export, recording(found)).unmapped_ids) == found
    with pytest.raises(RuntimeError, match=r"^wrong tokenizer: .* leaves 8 ids .* the manifest records 7 "):
        load_tokenizer(padded_export, recording(found[1:]))
    with pytest.raises(RuntimeError, match=r"recorded but mapped: 5\b"):
        load_tokenizer(padded_export, recording([5, *found]))


def test_a_padded_marian_vocabulary(hf_marian_separate_dir):
    """OPUS-MT pads its vocabulary past vocab.json: the padding ids are `<unk>`, in the tokens and
    in the text (between the texts of the pieces around them), never dropped or an error."""
    folder = hf_marian_separate_dir
    source, target = (json.loads((folder / f).read_text()) for f in ("vocab.json", "target_vocab.json"))
    size = len(target) + 4  # the model's output layer: 4 rows past the target vocabulary
    tok = SentencePieceTokenizer(
        folder / "source.spm",
        folder / "target.spm",
        folder / "vocab.json",
        folder / "target_vocab.json",
        unk_id=source["<unk>"],
        special_ids={source["</s>"], source["<pad>"], source["<unk>"]},
        model_vocab_size=size,
    )
    assert tok.unmapped_ids == set(range(len(target), size))
    before, after = tok.encode_target("Ein Hund"), tok.encode_target("rennt schnell")
    ids = [*before, len(target), *after, size - 1]
    assert [tok.token(i) for i in ids] == [
        *(tok.id_to_token(i) for i in before),
        "<unk>",
        *(tok.id_to_token(i) for i in after),
        "<unk>",
    ]
    assert tok.decode(ids) == f"{tok.decode(before)}<unk>{tok.decode(after)}<unk>"
    assert tok.decode([source["<unk>"], *before]) == tok.decode(
        before
    )  # the real <unk> id: dropped, as transformers does


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
