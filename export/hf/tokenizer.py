"""The tokenizer of an imported model: its SentencePiece models and {piece: id} vocabularies, copied
(or, for M2M100, written from the HF tokenizer's get_vocab(), language tokens included) into the
model dir, and the languages it translates with their tokens.

Marian (`MarianTokenizer`): source.spm, target.spm, vocab.json (target_vocab.json too when the
vocabularies are separate); one language pair, from tokenizer_config.json's source_lang/target_lang
unless given. M2M100 (`M2M100Tokenizer`): sentencepiece.bpe.model and vocab.json; every language of
the tokenizer, its `__xx__` token first on the source and forced first on the target."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from export.hf.config import M2M100, MARIAN, HFImportError

TOKENIZER_CLASSES = {MARIAN: "MarianTokenizer", M2M100: "M2M100Tokenizer"}
TOKENIZER_CONFIG = "tokenizer_config.json"


@dataclass
class ImportedTokenizer:
    files: dict[str, str]  # config.json's "sentencepiece": role -> file name in the model dir
    unk_id: int
    src_lang: str
    tgt_lang: str
    languages: dict[str, Any] = field(default_factory=dict)  # config.json's "languages" (LanguageSpec)


def tokenizer_config(src: Path) -> dict[str, Any]:
    path = src / TOKENIZER_CONFIG
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def required_files(src: Path, arch: str) -> list[str]:
    """The tokenizer files `arch` needs; HFImportError for another tokenizer class."""
    tok_cfg = tokenizer_config(src)
    cls = tok_cfg.get("tokenizer_class") or TOKENIZER_CLASSES[arch]
    if cls.removesuffix("Fast") != TOKENIZER_CLASSES[arch]:
        raise HFImportError(
            f"{TOKENIZER_CONFIG}: `tokenizer_class` {cls!r} is not supported for {arch}; "
            f"mtserve imports {TOKENIZER_CLASSES[arch]}"
        )
    if arch == MARIAN:
        separate = tok_cfg.get("separate_vocabs") or (src / "target_vocab.json").is_file()
        return ["source.spm", "target.spm", "vocab.json", *(["target_vocab.json"] if separate else [])]
    return ["sentencepiece.bpe.model", "vocab.json"]


def _language(given: str | None, tok_cfg: dict[str, Any], key: str) -> str:
    lang = given or tok_cfg.get(key)
    if not lang:
        raise HFImportError(f"{TOKENIZER_CONFIG}: `{key}` is missing; give the language on the command line")
    return lang


def import_marian(src: Path, dst: Path, src_lang: str | None, tgt_lang: str | None) -> ImportedTokenizer:
    from transformers import MarianTokenizer

    tok = MarianTokenizer.from_pretrained(str(src))
    names = required_files(src, MARIAN)
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
    return ImportedTokenizer(files, tok.unk_token_id, source, target, languages)


def import_m2m100(src: Path, dst: Path, src_lang: str | None, tgt_lang: str | None) -> ImportedTokenizer:
    from transformers import M2M100Tokenizer

    tok = M2M100Tokenizer.from_pretrained(str(src))
    shutil.copyfile(src / "sentencepiece.bpe.model", dst / "sentencepiece.bpe.model")
    vocab = {**tok.get_vocab(), **tok.lang_token_to_id}  # the spm vocabulary and the `__xx__` tokens
    (dst / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    tokens = dict(tok.lang_code_to_id)
    tok_cfg = tokenizer_config(src)
    source, target = _language(src_lang, tok_cfg, "src_lang"), _language(tgt_lang, tok_cfg, "tgt_lang")
    for key, lang in (("src_lang", source), ("tgt_lang", target)):
        if lang not in tokens:
            raise HFImportError(f"`{key}` {lang!r} is not a language of the tokenizer ({', '.join(tokens)})")
    files = {
        "source_model": "sentencepiece.bpe.model",
        "target_model": "sentencepiece.bpe.model",
        "source_vocab": "vocab.json",
        "target_vocab": "vocab.json",
    }
    languages = {"source": list(tokens), "target": list(tokens), "source_tokens": tokens, "target_tokens": tokens}
    return ImportedTokenizer(files, tok.unk_token_id, source, target, languages)


def import_tokenizer(src: Path, dst: Path, arch: str, src_lang: str | None, tgt_lang: str | None) -> ImportedTokenizer:
    """Write the tokenizer files of the HF folder `src` into the model dir `dst`."""
    if arch == MARIAN:
        return import_marian(src, dst, src_lang, tgt_lang)
    return import_m2m100(src, dst, src_lang, tgt_lang)
