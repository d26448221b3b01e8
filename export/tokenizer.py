"""Joint German/English subword tokenizer (byte-level BPE from HF `tokenizers`).

Byte-level BPE never produces <unk> (every byte is in the base alphabet), and its decoder restores
the exact spacing of the input, so detokenised output has no stray spaces before punctuation.
The saved `tokenizer.json` is all the serving path needs (`tokenizers` only, no torch).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

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
    return {
        "pad_id": tok.token_to_id("<pad>"),
        "bos_id": tok.token_to_id("<s>"),
        "eos_id": tok.token_to_id("</s>"),
        "unk_id": tok.token_to_id("<unk>"),
    }


def load_tokenizer(path: str | Path) -> Tokenizer:
    return Tokenizer.from_file(str(path))


def encode_batch(tok: Tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids without special tokens."""
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def decode(tok: Tokenizer, ids: list[int]) -> str:
    """Ids (special tokens dropped) -> natural text; the byte-level prefix space is removed."""
    return tok.decode(ids, skip_special_tokens=True).strip()


def decode_batch(tok: Tokenizer, batch: list[list[int]]) -> list[str]:
    return [s.strip() for s in tok.decode_batch(batch, skip_special_tokens=True)]
