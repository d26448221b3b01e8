"""The NLLB-200-distilled-600M-sized model of the real-size benchmark (`python -m benchmarks.real_size
--size nllb-600m`): a seeded random `M2M100ForConditionalGeneration` of NLLB-600M's dimensions
(d_model 1024, 12+12 layers, 16 heads, ffn 4096, ReLU, scale_embedding, max_position_embeddings
1024, a vocabulary of 256,206) with a tokenizer of NLLB's layout, built into the real-size cache
(benchmarks/real_size_model.py's `prepare` with the `NLLB` family, keyed `nllb-d1024-...`).

The tokenizer (`nllb_tokenizer`): a BPE SentencePiece model trained on the shipped corpus's German
and English training lines, padded (`pad_spm`) with dummy pieces (`<dummy_N>`, below every real
piece's score, which no merge of real pieces forms, so that no text ever yields one) to the size
that makes the tokenizer's ids fill the model as NLLB's fill it (`nllb_spm_size`): fairseq's 4
special ids, SentencePiece id + 1 for every piece past SentencePiece's own 3 specials, then
`<mask>` and FLORES-200's 202 language codes (`FAIRSEQ_LANGUAGE_CODES`: deu_Latn, eng_Latn, ...),
and 2 embedding rows no token names. (transformers writes `<mask>` before the codes when it
builds the tokenizer from the SentencePiece model, where the hub's tokenizer.json has it after
them: the codes sit one id higher than the real model's, the sizes are the same.) The folder is an
NllbTokenizer folder as the hub ships one: tokenizer.json, tokenizer_config.json and
sentencepiece.bpe.model beside the weights.

`mtserve import` takes it int8 only (`--precision int8`, to keep disk and time down) from German
to English (`--src-lang deu_Latn --tgt-lang eng_Latn`), and every engine forces `eng_Latn` first.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path

from benchmarks.real_size_model import DATA, Dims, Family, read_lines, train_spm

NAME = "nllb-size"
SPECIAL = 4  # fairseq's <s> <pad> </s> <unk>; SentencePiece's own <unk> <s> </s> are ids 0..2
UNUSED_ROWS = 2  # NLLB-200's embedding has 256,206 rows for its 256,204 tokens
DUMMY = "<dummy_{}>"

NLLB_600M = Dims(
    d_model=1024,
    layers=12,
    heads=16,
    ffn=4096,
    vocab=256206,
    max_positions=1024,
    spm_pieces=8000,  # the joint BPE model's (German and English)
    spm_lines=29000,
    family="nllb",
)


def language_codes() -> list[str]:
    """FLORES-200's 202 language codes, in NLLB's order (transformers' FAIRSEQ_LANGUAGE_CODES)."""
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    return list(FAIRSEQ_LANGUAGE_CODES)


def nllb_spm_size(vocab: int, languages: int) -> int:
    """The SentencePiece model's size whose tokenizer fills a model of `vocab` rows as NLLB's does:
    the tokenizer has SPECIAL + (size - 3) pieces + <mask> + the language codes, and the model
    UNUSED_ROWS more rows (NLLB-200: 256,206 rows, 202 codes -> 256,000 pieces)."""
    size = vocab - UNUSED_ROWS - SPECIAL - 1 - languages + 3
    if size <= 3:
        raise ValueError(f"a vocabulary of {vocab} leaves no room for {languages} language codes")
    return size


def pad_spm(model: bytes, size: int) -> bytes:
    """A SentencePiece model (its serialised proto) with dummy pieces appended up to `size` pieces,
    each scored below the one before and below every real piece."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    proto = pb.ModelProto()  # type: ignore[attr-defined]  # generated protobuf code
    proto.ParseFromString(model)
    have = len(proto.pieces)
    if have > size:
        raise ValueError(f"{have} pieces do not fit a SentencePiece model of {size}")
    low, normal = min(p.score for p in proto.pieces), pb.ModelProto.SentencePiece.NORMAL  # type: ignore[attr-defined]
    for n in range(size - have):
        piece = proto.pieces.add()
        piece.piece, piece.score, piece.type = DUMMY.format(n), low - 1.0 - n, normal
    return bytes(proto.SerializeToString())


def nllb_tokenizer(out: Path, dims: Dims, data: Path = DATA, codes: list[str] | None = None) -> int:
    """The NllbTokenizer folder at `out` (made): the padded SentencePiece model, tokenizer.json and
    tokenizer_config.json (deu_Latn -> eng_Latn by default). Returns the tokenizer's size."""
    from transformers import NllbTokenizer

    codes = language_codes() if codes is None else codes
    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="mtserve-spm-") as tmp:
        lines = read_lines("de", limit=dims.spm_lines, data=data) + read_lines("en", limit=dims.spm_lines, data=data)
        spm = train_spm(lines, Path(tmp) / "joint", dims.spm_pieces, model_type="bpe")
        spm_only = Path(tmp) / "spm-only"
        spm_only.mkdir()
        padded = pad_spm(spm.read_bytes(), nllb_spm_size(dims.vocab, len(codes)))
        (spm_only / "sentencepiece.bpe.model").write_bytes(padded)
        tok = NllbTokenizer.from_pretrained(
            str(spm_only), src_lang="deu_Latn", tgt_lang="eng_Latn", extra_special_tokens=codes
        )
        tok.save_pretrained(str(out))
        shutil.copyfile(spm_only / "sentencepiece.bpe.model", out / "sentencepiece.bpe.model")
    if len(tok) != dims.vocab - UNUSED_ROWS:
        raise ValueError(f"the tokenizer has {len(tok)} ids, not {dims.vocab - UNUSED_ROWS}")
    return len(tok)


def build_nllb_folder(out: Path, dims: Dims, data: Path = DATA) -> Path:
    """The Hugging Face NLLB folder of `dims` at `out` (made here; must not exist): the tokenizer
    (`nllb_tokenizer`) and a seeded random M2M100ForConditionalGeneration with NLLB's special ids
    (<s> 0, <pad> 1, </s> 2 starting the decoder and ending it)."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    nllb_tokenizer(out, dims, data)
    config = M2M100Config(
        vocab_size=dims.vocab,
        **dims.config(),
        activation_function="relu",
        scale_embedding=True,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        tie_word_embeddings=True,
        architectures=["M2M100ForConditionalGeneration"],
    )
    config.forced_eos_token_id = 2  # as NLLB's: </s> at the last step allowed
    torch.manual_seed(dims.seed)
    M2M100ForConditionalGeneration(config).save_pretrained(str(out))
    (out / "dims.json").write_text(json.dumps(asdict(dims)))
    return out


NLLB = Family(build=build_nllb_folder, name=NAME, precision="int8", src_lang="deu_Latn", tgt_lang="eng_Latn")
