"""Joint German/English subword tokenizer (byte-level BPE from HF `tokenizers`).

Byte-level BPE never produces <unk> (every byte is in the base alphabet), and its decoder restores
the exact spacing of the input, so detokenised output has no stray spaces before punctuation.
The saved `tokenizer.json` is all the serving path needs (`tokenizers` only, no torch).

Imported Hugging Face models keep their own SentencePiece models instead (`SentencePieceTokenizer`):
the model gives pieces, a JSON vocabulary {piece: id} gives the ids, as transformers' Marian and
M2M100 tokenizers do. `load_model_tokenizer` reads whichever a model dir has.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import sentencepiece
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # ids 0, 1, 2, 3


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8000, min_frequency: int = 2) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {f"{name}_id": _token_id(tok, token) for name, token in zip(("pad", "bos", "eos", "unk"), SPECIAL_TOKENS)}


def _token_id(tok: Tokenizer, token: str) -> int:
    i = tok.token_to_id(token)
    if i is None:
        raise ValueError(f"the tokenizer has no {token}")
    return i


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


class SentencePieceTokenizer:
    """Source and target SentencePiece models with their {piece: id} vocabularies (the same files
    twice when shared). `drop`: the ids decoding leaves out (special and language tokens)."""

    def __init__(
        self,
        source_model: Path,
        target_model: Path,
        source_vocab: Path,
        target_vocab: Path,
        unk_id: int,
        drop: set[int],
    ):
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(source_model))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(target_model))
        self.source_vocab: dict[str, int] = json.loads(source_vocab.read_text(encoding="utf-8"))
        self.target_vocab: dict[str, int] = json.loads(target_vocab.read_text(encoding="utf-8"))
        self.pieces = {i: p for p, i in self.target_vocab.items()}
        self.unk_id, self.drop = unk_id, drop

    def encode(self, text: str, target: bool = False) -> list[int]:
        """Ids without special tokens. A leading `>>xx<<` language code (multi-target Marian models)
        stays one piece, as in transformers' MarianTokenizer."""
        code: list[str] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:
            code, text = [text[: end + 2]], text[end + 2 :]
        spm, vocab = (self.target, self.target_vocab) if target else (self.source, self.source_vocab)
        return [vocab.get(p, self.unk_id) for p in code + spm.encode(text, out_type=str)]

    def decode(self, ids: list[int]) -> str:
        pieces = [self.pieces[i] for i in ids if i not in self.drop and i in self.pieces]
        return self.target.decode_pieces(pieces).strip()


def load_model_tokenizer(model_dir: str | Path) -> Tokenizer | SentencePieceTokenizer:
    """The tokenizer of a model dir: tokenizer.json, or the SentencePiece files its config.json
    names (`"sentencepiece"`), with the special and language tokens left out of decoded text."""
    d = Path(model_dir)
    meta = json.loads((d / "config.json").read_text())
    spec = meta.get("sentencepiece")
    if spec is None:
        return load_tokenizer(d / "tokenizer.json")
    cfg, langs = meta["model"], meta.get("languages", {})
    drop = {cfg["pad_id"], cfg["bos_id"], cfg["eos_id"], cfg["unk_id"]}
    drop |= set(langs.get("source_tokens", {}).values()) | set(langs.get("target_tokens", {}).values())
    f = {k: d / v for k, v in spec.items()}
    return SentencePieceTokenizer(
        f["source_model"], f["target_model"], f["source_vocab"], f["target_vocab"], cfg["unk_id"], drop
    )


def encode_batch(tok: Tokenizer | SentencePieceTokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids without special tokens."""
    if isinstance(tok, SentencePieceTokenizer):
        return [tok.encode(t) for t in texts]
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def decode(tok: Tokenizer, ids: list[int]) -> str:
    """Ids (special tokens dropped) -> natural text; the byte-level prefix space is removed."""
    return tok.decode(ids, skip_special_tokens=True).strip()


def decode_batch(tok: Tokenizer | SentencePieceTokenizer, batch: list[list[int]]) -> list[str]:
    if isinstance(tok, SentencePieceTokenizer):
        return [tok.decode(ids) for ids in batch]
    return [s.strip() for s in tok.decode_batch(batch, skip_special_tokens=True)]
