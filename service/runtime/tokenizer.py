"""Text <-> token ids on the serving path, whichever tokenizer the export ships (no torch).

`TextTokenizer` is what the engine and the offline translator use. Two implement it:
- `BpeTokenizer`: mtserve's own byte-level BPE (`tokenizer.json`, the `tokenizers` library);
- `SentencePieceTokenizer`: an imported Hugging Face model's SentencePiece models and vocabularies
  (the manifest's `sentencepiece`): the source model cuts a text into pieces, the source vocabulary
  maps each piece to its id (a piece it lacks is `unk_id`); decoding maps ids to pieces through the
  target vocabulary and joins them with the target model (a leading "▁" is a space). Special and
  language tokens are dropped from decoded text, as `transformers`' decode(skip_special_tokens=True).

Ids without a vocabulary entry: an imported model's embedding may have rows that no vocabulary entry
names (M2M100's made-up words past its language codes, the padding of OPUS-MT's vocabularies), and a
search may emit them. Each is the token `<unk>` (`TextTokenizer.token`), and `<unk>` in decoded
text, glued to its neighbours: what `M2M100Tokenizer.batch_decode(skip_special_tokens=True)` writes
for them, for every imported model alike (MarianTokenizer before transformers 5 wrote `<unk>` and a
space; transformers 5's falls back to the SentencePiece piece of the same number, or raises past its
size; NLLB's fast tokenizer drops them). The real `<unk>` id stays out of the text, as in
transformers. `unmapped_ids` are these ids, computed at load from the vocabularies and the model's
size; a version whose manifest records them (`SentencePieceSpec.unmapped_ids`) must record the same.

Control tokens never come from user text: `</s>`, `<pad>`, `<s>`, `<unk>` and language tags
(`__de__`, `>>fr<<`, `deu_Latn`) written in a source text or a target prefix are characters like
any others. The BPE tokenizer encodes its special tokens' strings as ordinary text
(`encode_special_tokens`); a SentencePiece model never matches its control symbols in text, and a
piece that the vocabulary maps to a control id (pad, bos, eos, a language token) is `unk_id`.

`load_tokenizer` reads the one the manifest names and checks that it is the model's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import sentencepiece as spm
from tokenizers import Tokenizer, decoders

from contract.byte_level import BYTE_OF_CHARACTER
from contract.manifest import Manifest

WORD_STARTS = ("▁", "Ġ")  # SentencePiece's and byte-level BPE's mark of a token that begins a word
UNK = "<unk>"  # the token string (and decoded text) of an id without a vocabulary entry


class TextTokenizer(Protocol):
    """Texts to token ids (no special tokens added, none read from the text) and back."""

    @property
    def vocab_size(self) -> int:
        """Entries of the vocabulary, special and language tokens included."""

    def encode(self, text: str) -> list[int]:
        """The ids of `text`'s tokens, nothing added."""

    def encode_target(self, text: str) -> list[int]:
        """The ids of `text`'s tokens as a translation (a forced target prefix), nothing added."""

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """`encode(text)` and each token's span of `text` in code points, end exclusive (a token
        that stands for no character of the text, as SentencePiece's lone "▁", has an empty span
        where it stands)."""

    def decode(self, ids: Iterable[int]) -> str:
        """The text of `ids` without special or language tokens, not stripped."""

    def decode_prefixes(self, ids: list[int]) -> list[str]:
        """`decode(ids[:k])` for k from 1 to len(ids): the text as it grows token by token."""

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry of `token_id` (a subword piece), None when it has none."""

    def token(self, token_id: int) -> str:
        """The token string of an id: its vocabulary entry, else `<unk>` (module doc)."""

    @property
    def unmapped_ids(self) -> frozenset[int]:
        """The model's ids (0 to its vocabulary size) that no vocabulary entry names."""

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary entry, None when it is not one."""


class BpeTokenizer:
    """mtserve's own byte-level BPE tokenizer (`tokenizer.json`)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.tokenizer = Tokenizer.from_file(str(path))
        # "</s>" in a text is the four characters, not the end of sentence (module doc).
        self.tokenizer.encode_special_tokens = True
        self._bytes: dict[int, bytes] | None = None  # _token_bytes(), made on first use
        self._bytes_made = False

    @property
    def vocab_size(self) -> int:
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_target(self, text: str) -> list[int]:
        return self.encode(text)  # one vocabulary for both sides

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        found = self.tokenizer.encode(text, add_special_tokens=False)
        return list(found.ids), [_trimmed(text, int(a), int(b)) for a, b in found.offsets]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def decode_prefixes(self, ids: list[int]) -> list[str]:
        """Byte-level BPE's text is its tokens' bytes, decoded as UTF-8 with U+FFFD for what is not
        (the ByteLevel decoder's `from_utf8_lossy`): each prefix's bytes decoded, without a call
        into the tokenizer per prefix. Ids it has no bytes for (an added token that is not
        special), or a tokenizer with another decoder, decode prefix by prefix."""
        table = self._token_bytes() or {}
        out, data = [], b""
        for i in ids:
            chunk = table.get(i)
            if chunk is None:
                return [self.decode(ids[:k]) for k in range(1, len(ids) + 1)]
            data += chunk
            out.append(data.decode("utf-8", "replace"))
        return out

    def _token_bytes(self) -> dict[int, bytes] | None:
        """Each id's bytes (b"" for a special token, which decoding skips); None unless the
        decoder is plain ByteLevel."""
        if not self._bytes_made:
            if isinstance(self.tokenizer.decoder, decoders.ByteLevel):
                table: dict[int, bytes] = {}
                for token, i in self.tokenizer.get_vocab(with_added_tokens=False).items():
                    if all(c in BYTE_OF_CHARACTER for c in token):
                        table[i] = bytes(BYTE_OF_CHARACTER[c] for c in token)
                for i, added in self.tokenizer.get_added_tokens_decoder().items():
                    table.pop(i, None)
                    if added.special:
                        table[i] = b""
                self._bytes = table
            self._bytes_made = True
        return self._bytes

    def id_to_token(self, token_id: int) -> str | None:
        token = self.tokenizer.id_to_token(token_id)
        return None if token is None else str(token)

    def token(self, token_id: int) -> str:
        return self.id_to_token(token_id) or UNK

    @property
    def unmapped_ids(self) -> frozenset[int]:
        return frozenset()  # exactly the model's vocabulary (check_tokenizer)

    def token_to_id(self, token: str) -> int | None:
        found = self.tokenizer.token_to_id(token)
        return None if found is None else int(found)


def _read_vocab(path: Path) -> dict[str, int]:
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a JSON vocabulary: {e}") from e
    if not isinstance(vocab, dict) or not all(isinstance(k, str) and isinstance(v, int) for k, v in vocab.items()):
        raise ValueError(f"{path}: a vocabulary is a JSON object of {{piece: id}}")
    return vocab


class SentencePieceTokenizer:
    """SentencePiece models and {piece: id} vocabularies of an imported model (module doc).
    `special_ids`: ids never shown in decoded text (pad, bos, eos, unk and language tokens);
    `named`: entries the vocabularies lack but the model has (language tokens), by id;
    `model_vocab_size`: the model's vocabulary (embedding rows), which `unmapped_ids` fill up to."""

    def __init__(
        self,
        source_model: Path,
        target_model: Path,
        source_vocab: Path,
        target_vocab: Path,
        unk_id: int,
        special_ids: Iterable[int],
        named: dict[int, str] | None = None,
        model_vocab_size: int = 0,
    ):
        self.source = spm.SentencePieceProcessor(model_file=str(source_model))
        self.target = spm.SentencePieceProcessor(model_file=str(target_model))
        self.source_vocab = _read_vocab(source_vocab)
        target = self.source_vocab if target_vocab == source_vocab else _read_vocab(target_vocab)
        self.pieces: dict[int, str] = {i: p for p, i in target.items()}
        for i, name in (named or {}).items():
            self.pieces.setdefault(i, name)
        self.ids: dict[str, int] = {**{p: i for i, p in self.pieces.items()}, **self.source_vocab}
        self.unk_id = unk_id
        self.special_ids = frozenset(special_ids)
        self._unmapped = frozenset(i for i in range(model_vocab_size) if i not in self.pieces)
        # A piece of text never maps to a control id (module doc): such entries read as unk_id.
        control = self.special_ids - {unk_id}
        self.source_vocab = {p: unk_id if i in control else i for p, i in self.source_vocab.items()}
        self.target_ids = {p: unk_id if i in control else i for p, i in target.items()}

    @property
    def vocab_size(self) -> int:
        return max(max(self.ids.values()), max(self.pieces)) + 1

    def encode(self, text: str) -> list[int]:
        vocab, unk = self.source_vocab, self.unk_id
        return [vocab.get(p, unk) for p in self.source.encode(text, out_type=str)]

    def encode_target(self, text: str) -> list[int]:
        vocab, unk = self.target_ids, self.unk_id
        return [vocab.get(p, unk) for p in self.target.encode(text, out_type=str)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        vocab, unk = self.source_vocab, self.unk_id
        pieces = self.source.encode(text, return_type="proto").pieces
        chars = _code_points(text)  # SentencePiece's spans are UTF-8 byte offsets into `text`
        last = len(chars) - 1
        spans = [_trimmed(text, chars[min(p.begin, last)], chars[min(p.end, last)]) for p in pieces]
        return [vocab.get(p.piece, unk) for p in pieces], spans

    def decode(self, ids: Iterable[int]) -> str:
        """The pieces' text; an id without a piece is `<unk>` between the texts of the pieces
        around it, each decoded on its own (as M2M100Tokenizer's convert_tokens_to_string)."""
        skip, pieces = self.special_ids, self.pieces
        run: list[str]
        text, run = "", []  # the text so far, the pieces not yet decoded
        for i in ids:
            if i in skip:
                continue
            piece = pieces.get(i)
            if piece is None:
                text += (str(self.target.decode_pieces(run)) if run else "") + UNK
                run = []
            else:
                run.append(piece)
        return (text + str(self.target.decode_pieces(run))) if run else text

    def decode_prefixes(self, ids: list[int]) -> list[str]:
        return [self.decode(ids[:k]) for k in range(1, len(ids) + 1)]

    def id_to_token(self, token_id: int) -> str | None:
        return self.pieces.get(token_id)

    def token(self, token_id: int) -> str:
        return self.pieces.get(token_id, UNK)

    @property
    def unmapped_ids(self) -> frozenset[int]:
        return self._unmapped

    def token_to_id(self, token: str) -> int | None:
        return self.ids.get(token)


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """A token's span without the whitespace it opens with (its word boundary), unless it is
    only whitespace."""
    while start < end - 1 and text[start].isspace():
        start += 1
    return start, end


def _code_points(text: str) -> list[int]:
    """For each UTF-8 byte offset of `text` (and its end), the code point it falls in."""
    table: list[int] = []
    for i, ch in enumerate(text):
        table += [i] * len(ch.encode("utf-8"))
    table.append(len(text))
    return table


def load_tokenizer(export_dir: Path, manifest: Manifest) -> TextTokenizer:
    """The tokenizer the manifest of `export_dir` names, checked against the model
    (`check_tokenizer`); RuntimeError when it is not the model's."""
    sp = manifest.sentencepiece
    tokenizer: TextTokenizer
    if sp is not None:
        ids, langs = manifest.special_ids, manifest.languages
        lang_ids = {**langs.source_tokens, **langs.target_tokens}
        tokenizer = SentencePieceTokenizer(
            export_dir / sp.source_model.file,
            export_dir / sp.target_model.file,
            export_dir / sp.source_vocab.file,
            export_dir / sp.target_vocab.file,
            unk_id=ids.unk_id,
            special_ids={ids.pad_id, ids.bos_id, ids.eos_id, ids.unk_id, *lang_ids.values()},
            named={i: lang for lang, i in lang_ids.items()},
            model_vocab_size=manifest.dims.vocab_size,
        )
        check_tokenizer(tokenizer, manifest, f"{export_dir / sp.source_vocab.file}", exact_size=False)
        check_unmapped(tokenizer, sp.unmapped_ids, f"{export_dir / sp.target_vocab.file}")
        return tokenizer
    if manifest.tokenizer is None:
        raise RuntimeError(f"{export_dir}: the manifest names no tokenizer")
    tokenizer = BpeTokenizer(export_dir / manifest.tokenizer.file)
    check_tokenizer(tokenizer, manifest, f"{export_dir / manifest.tokenizer.file}", exact_size=True)
    return tokenizer


def check_tokenizer(tokenizer: TextTokenizer, manifest: Manifest, where: str, exact_size: bool) -> None:
    """The tokenizer must be the model's: its vocabulary the model's size (`exact_size`; else no
    larger: an imported model's embedding may have rows no piece uses), the special tokens it
    names at the model's ids. A wrong one would load fine and translate garbage."""
    d, ids = manifest.dims, manifest.special_ids
    got = tokenizer.vocab_size
    if got > d.vocab_size or (exact_size and got != d.vocab_size):
        raise RuntimeError(f"wrong tokenizer: {where} has {got} tokens, the model {d.vocab_size}")
    for name, want in (("<pad>", ids.pad_id), ("<s>", ids.bos_id), ("</s>", ids.eos_id), ("<unk>", ids.unk_id)):
        found = tokenizer.token_to_id(name)
        if found != want and (exact_size or found is not None):
            raise RuntimeError(f"wrong tokenizer: {name} has id {found} in {where}, the model expects {want}")


def check_unmapped(tokenizer: TextTokenizer, recorded: Iterable[int] | None, where: str) -> None:
    """The ids without a vocabulary entry that the import recorded (None: none recorded, as in
    exports before the record) must be the ones the tokenizer leaves unmapped."""
    if recorded is None:
        return
    found, want = tokenizer.unmapped_ids, frozenset(recorded)
    if found != want:
        extra, missing = sorted(found - want), sorted(want - found)
        raise RuntimeError(
            f"wrong tokenizer: {where} leaves {len(found)} ids of the model without an entry, the manifest "
            f"records {len(want)} (unrecorded: {_ids(extra)}; recorded but mapped: {_ids(missing)})"
        )


def _ids(ids: list[int], shown: int = 10) -> str:
    text = ", ".join(map(str, ids[:shown])) or "none"
    return text if len(ids) <= shown else f"{text}, ... ({len(ids)} in all)"
