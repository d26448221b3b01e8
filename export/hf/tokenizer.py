"""The tokenizers an imported model may have, one importer per tokenizer class: its SentencePiece
models and {piece: id} vocabularies, copied (or, for M2M100 and NLLB, written from the HF
tokenizer's get_vocab(), language tokens included) into the model dir, and the languages it
translates with their tokens. Which tokenizer classes a model family takes, and which importer
runs, is the family's (export/hf/families/).

Marian (`MarianTokenizer`): source.spm, target.spm, vocab.json (target_vocab.json too when the
vocabularies are separate); one language pair, from tokenizer_config.json's source_lang/target_lang
unless given. M2M100 (`M2M100Tokenizer`): sentencepiece.bpe.model and vocab.json; every language of
the tokenizer, its `__xx__` token first on the source and forced first on the target.

NLLB (`NllbTokenizer`, an M2M100 model): sentencepiece.bpe.model (tokenizer.json when there is one)
with fairseq's ids (<s> 0, <pad> 1, </s> 2, <unk> 3, SentencePiece id + 1, then the added tokens);
vocab.json is written from get_vocab(). Every language code of the tokenizer (`deu_Latn`, ...) is a
language under its own name, its token first on the source and forced first on the target (the
non-legacy layout; `legacy_behaviour` is refused). The SentencePiece model must give the pieces
that the HF tokenizer gives: checked on the parity texts, stripped (for trailing whitespace the HF
tokenizer adds a "▁" that SentencePiece, and so mtserve, does not).

Every {piece: id} vocabulary is checked (`check_vocab`): a JSON object of pieces to integer ids,
each id given once, each below the model's vocabulary size. A vocabulary may cover fewer ids than
the model: real OPUS-MT and M2M100 checkpoints have embedding rows no piece names (M2M100's
made-up words). Those ids are `unmapped_ids` (config.json of the model dir, docs/models.md)."""

from __future__ import annotations

import json
import re
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from export.hf.config import BOUNDS, HFImportError, read_json, read_json_object

NLLB = "NllbTokenizer"
TOKENIZER_CONFIG = "tokenizer_config.json"
NLLB_LANGUAGE_CODE = re.compile(r"[a-z]{3}_[A-Z][a-z]{3}")  # FLORES-200: deu_Latn, zho_Hans
MAX_VOCAB_SIZE = BOUNDS["vocab_size"][1]
MAX_VOCAB_BYTES = 64 << 20  # a vocab.json: NLLB-200's 256k pieces are about 5 MB
# The command-line flag that gives each language field of tokenizer_config.json.
LANGUAGE_FLAGS = {
    "source_lang": "--src-lang",
    "src_lang": "--src-lang",
    "target_lang": "--tgt-lang",
    "tgt_lang": "--tgt-lang",
}


@dataclass
class ImportedTokenizer:
    files: dict[str, str]  # config.json's "sentencepiece": role -> file name in the model dir
    unk_id: int
    src_lang: str
    tgt_lang: str
    languages: dict[str, Any] = field(default_factory=dict)  # config.json's "languages" (LanguageSpec)
    unmapped: list[int] = field(default_factory=list)  # target ids below the model's size that nothing names


def tokenizer_config(src: Path) -> dict[str, Any]:
    path = src / TOKENIZER_CONFIG
    return read_json_object(path) if path.exists() else {}


def check_vocab(vocab: Any, size: int, name: str) -> dict[str, int]:
    """`vocab` if it is a {piece: id} object of unique ids below `size`; HFImportError naming the
    file and the entry at fault otherwise."""
    if not isinstance(vocab, dict) or not vocab:
        raise HFImportError(f"{name}: must be a non-empty JSON object of {{piece: id}}")
    seen: dict[int, str] = {}
    for piece, i in vocab.items():
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise HFImportError(f"{name}: the id of {piece[:40]!r} is {str(i)[:40]}; ids are integers from 0")
        if i >= size:
            raise HFImportError(
                f"{name}: {piece[:40]!r} has id {i}, past the model's vocabulary of {size} "
                "(a tokenizer may cover fewer ids than the model, never more)"
            )
        if i in seen:
            raise HFImportError(
                f"{name}: id {i} is given to both {seen[i][:40]!r} and {piece[:40]!r}; ids must be unique"
            )
        seen[i] = piece
    return vocab


def read_vocab(path: Path, size: int) -> dict[str, int]:
    """A vocabulary file, checked (`check_vocab`)."""
    return check_vocab(read_json(path, MAX_VOCAB_BYTES), size, path.name)


def check_tokenizer_files(src: Path, names: list[str], vocab_size: int, src_vocab_size: int | None) -> None:
    """The tokenizer files `names` of the folder before transformers loads them: each SentencePiece
    model one sentencepiece reads, each vocabulary checked against the model's sizes (the source one
    against the encoder's embedding, the target one against the decoder's)."""
    import sentencepiece

    for name in (n for n in names if not n.endswith(".json")):
        if (src / name).stat().st_size > MAX_VOCAB_BYTES:
            raise HFImportError(f"{name}: larger than {MAX_VOCAB_BYTES} bytes; not a SentencePiece model")
        try:
            sentencepiece.SentencePieceProcessor(model_file=str(src / name))
        except (OSError, RuntimeError) as e:
            raise HFImportError(f"{name}: not a SentencePiece model ({str(e)[:80]})") from None
    names = [n for n in names if n.endswith(".json")]
    for name in names:
        source_side = name == "vocab.json" and "target_vocab.json" in names
        read_vocab(src / name, (src_vocab_size or vocab_size) if source_side else vocab_size)


def unmapped_ids(vocab_size: int, *named: dict[str, int]) -> list[int]:
    """The ids below `vocab_size` that none of the `named` {name: id} maps gives a name."""
    mapped = {i for names in named for i in names.values()}
    return [i for i in range(vocab_size) if i not in mapped]


def tokenizer_class(src: Path, arch: str, classes: tuple[str, ...]) -> str:
    """The tokenizer class of the folder (without `Fast`), one of `classes` (those architecture
    `arch` takes; the first is the one a folder without tokenizer_config.json's `tokenizer_class`
    has); HFImportError for another."""
    tok_cfg = tokenizer_config(src)
    cls = str(tok_cfg.get("tokenizer_class") or classes[0]).removesuffix("Fast")
    if cls not in classes:
        raise HFImportError(
            f"{TOKENIZER_CONFIG}: `tokenizer_class` {cls!r} is not supported for {arch}; "
            f"mtserve imports {' or '.join(classes)}"
        )
    if cls == NLLB and tok_cfg.get("legacy_behaviour"):
        raise HFImportError(
            f"{TOKENIZER_CONFIG}: `legacy_behaviour` is true (the language code after </s> on the source); "
            "mtserve takes the default layout, the language code first"
        )
    return cls


def marian_files(src: Path) -> list[str]:
    """The files a MarianTokenizer folder needs."""
    separate = tokenizer_config(src).get("separate_vocabs") or (src / "target_vocab.json").is_file()
    return ["source.spm", "target.spm", "vocab.json", *(["target_vocab.json"] if separate else [])]


def sentencepiece_bpe_files(cls: str) -> list[str]:
    """The files an M2M100Tokenizer or NllbTokenizer (`cls`) folder needs."""
    if cls == NLLB:  # the vocabulary is in tokenizer.json, or made from the model
        return ["sentencepiece.bpe.model"]
    return ["sentencepiece.bpe.model", "vocab.json"]


def _language(given: str | None, tok_cfg: dict[str, Any], key: str) -> str:
    lang = given or tok_cfg.get(key)
    if not lang or not isinstance(lang, str):
        raise HFImportError(
            f"{TOKENIZER_CONFIG}: `{key}` is {'missing' if not lang else repr(lang)[:40]}; "
            f"give the language with {LANGUAGE_FLAGS[key]}"
        )
    return lang


def import_marian(
    src: Path, dst: Path, src_lang: str | None, tgt_lang: str | None, vocab_size: int | None = None
) -> ImportedTokenizer:
    """`vocab_size`: the model's target vocabulary (None: as large as the vocabulary's ids need)."""
    from transformers import MarianTokenizer

    with warnings.catch_warnings():  # "Recommended: pip install sacremoses": mtserve never uses it
        warnings.filterwarnings("ignore", message=".*sacremoses", category=UserWarning)
        tok = MarianTokenizer.from_pretrained(str(src))
    names = marian_files(src)
    for name in names:
        shutil.copyfile(src / name, dst / name)
    target_vocab = "target_vocab.json" if "target_vocab.json" in names else "vocab.json"
    tok_cfg = tokenizer_config(src)
    source, target = _language(src_lang, tok_cfg, "source_lang"), _language(tgt_lang, tok_cfg, "target_lang")
    files = {
        "source_model": "source.spm",
        "target_model": "target.spm",
        "source_vocab": "vocab.json",
        "target_vocab": target_vocab,
    }
    languages = {"source": [source], "target": [target]}
    target_ids = read_vocab(dst / target_vocab, vocab_size or MAX_VOCAB_SIZE)
    unmapped = unmapped_ids(vocab_size or max(target_ids.values()) + 1, target_ids)
    return ImportedTokenizer(files, tok.unk_token_id, source, target, languages, unmapped)


def import_m2m100(
    src: Path, dst: Path, src_lang: str | None, tgt_lang: str | None, vocab_size: int | None = None
) -> ImportedTokenizer:
    from transformers import M2M100Tokenizer

    tok = M2M100Tokenizer.from_pretrained(str(src))
    shutil.copyfile(src / "sentencepiece.bpe.model", dst / "sentencepiece.bpe.model")
    vocab = {**tok.get_vocab(), **tok.lang_token_to_id}  # the spm vocabulary and the `__xx__` tokens
    tokens = dict(tok.lang_code_to_id)
    return _multilingual(src, dst, vocab, tokens, tok.unk_token_id, (src_lang, tgt_lang), vocab_size)


def _multilingual(
    src: Path,
    dst: Path,
    vocab: dict[str, int],
    tokens: dict[str, int],
    unk_id: int,
    langs: tuple[str | None, str | None],
    vocab_size: int | None,
) -> ImportedTokenizer:
    """M2M100's and NLLB's common part: one SentencePiece model for both sides, `vocab` (checked
    against the model's `vocab_size`; None: as large as its ids need) written as vocab.json, every
    language of `tokens` (language -> its token) on both sides."""
    check_vocab(vocab, vocab_size or MAX_VOCAB_SIZE, "the tokenizer's vocabulary (vocab.json and its language tokens)")
    vocab_size = vocab_size or max(vocab.values()) + 1
    src_lang, tgt_lang = langs
    (dst / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    tok_cfg = tokenizer_config(src)
    source, target = _language(src_lang, tok_cfg, "src_lang"), _language(tgt_lang, tok_cfg, "tgt_lang")
    for key, lang in (("src_lang", source), ("tgt_lang", target)):
        if lang not in tokens:
            raise HFImportError(
                f"`{key}` {lang[:40]!r} is not a language of the tokenizer ({', '.join(tokens)}); "
                f"give one of them with {LANGUAGE_FLAGS[key]}"
            )
    files = {
        "source_model": "sentencepiece.bpe.model",
        "target_model": "sentencepiece.bpe.model",
        "source_vocab": "vocab.json",
        "target_vocab": "vocab.json",
    }
    languages = {"source": list(tokens), "target": list(tokens), "source_tokens": tokens, "target_tokens": tokens}
    return ImportedTokenizer(files, unk_id, source, target, languages, unmapped_ids(vocab_size, vocab, tokens))


def _check_pieces(tok: Any, model: Path, vocab: dict[str, int], texts: list[str]) -> None:
    """The SentencePiece model and vocab.json must give the HF tokenizer's ids: every piece is in
    the vocabulary, and each (stripped) text has the same ids both ways."""
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    missing = [p for p in pieces if p not in vocab]
    if missing:
        raise HFImportError(
            f"tokenizer.json: its vocabulary lacks {len(missing)} pieces of {model.name} (e.g. {missing[0]!r}); "
            "they are not the same tokenizer"
        )
    for text in (t.strip() for t in texts):
        ours = [vocab.get(p, tok.unk_token_id) for p in sp.encode(text, out_type=str)]
        theirs = list(tok(text, add_special_tokens=False)["input_ids"])
        if ours != theirs:
            raise HFImportError(
                f"tokenizer.json: its `normalizer`/`model` tokenizes {text!r} as {tok.convert_ids_to_tokens(theirs)}, "
                f"{model.name} as {sp.encode(text, out_type=str)}; mtserve needs them equal"
            )


def import_nllb(
    src: Path, dst: Path, src_lang: str | None, tgt_lang: str | None, texts: list[str], vocab_size: int | None = None
) -> ImportedTokenizer:
    from transformers import NllbTokenizer

    tok = NllbTokenizer.from_pretrained(str(src))
    vocab = {str(p): int(i) for p, i in tok.get_vocab().items()}  # pieces, specials, language codes, <mask>
    extra = tok.extra_special_tokens  # the language codes (a list; a dict when the tokens are named)
    added = map(str, extra.values() if isinstance(extra, dict) else extra)
    tokens = {code: vocab[code] for code in added if NLLB_LANGUAGE_CODE.fullmatch(code) and code in vocab}
    if not tokens:
        raise HFImportError(f"{TOKENIZER_CONFIG}: `extra_special_tokens` has no language code (like deu_Latn)")
    shutil.copyfile(src / "sentencepiece.bpe.model", dst / "sentencepiece.bpe.model")
    _check_pieces(tok, dst / "sentencepiece.bpe.model", vocab, texts)
    return _multilingual(src, dst, vocab, tokens, tok.unk_token_id, (src_lang, tgt_lang), vocab_size)
