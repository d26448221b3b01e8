"""The random OPUS-MT-sized Marian of the real-size benchmark (benchmarks/real_size.py), built once
into a cache dir and prepared for every engine:

    python -m benchmarks.real_size_model            # build (or reuse) benchmarks/.cache/real-size/

- `hf/`: a Hugging Face Marian folder: transformers' `MarianConfig` with OPUS-MT's dimensions
  (d_model 512, 6+6 layers, 8 heads, ffn 2048, swish, max_position_embeddings 512, one shared
  vocabulary of 58,101), weights drawn from a seed; German and English SentencePiece models trained
  on the shipped corpus; `vocab.json` holds their pieces and is padded to the vocabulary size with
  dummy pieces that never occur (`padded_vocab`), `<pad>` last as in OPUS-MT;
- `models/opus-size/1/`: the same folder imported by `mtserve import` (fp32 and int8, portable
  and fused graphs); its int8 graphs (the engine's and the server's) are exported again
  (`mtserve export --precision int8`) whenever the code that writes them changed since, docs and
  comments aside (`export_code_hash` against `models/export-code.sha256`);
- `ct2-int8/`: the same folder converted by `ct2-transformers-converter --quantization int8`;
- `shortlist-p50-a100/` (benchmarks/shortlist_copies.py's `prepare_shortlist`, the real-size shortlist rows): a linked copy of the
  imported version that `mtserve shortlist` gave a vocabulary shortlist from the training pairs,
  and `ct2-int8` with the same mapping as its vmap.txt.

Everything else is keyed by the dimensions and seed (`Dims.key`), so a changed setting builds afresh.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from export.data import DEFAULT_DATA_DIR

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / "benchmarks" / ".cache"
DATA = DEFAULT_DATA_DIR
NAME = "opus-size"
SPECIAL = ("</s>", "<unk>")  # ids 0 and 1, as OPUS-MT's; <pad> is the last id


@dataclass(frozen=True)
class Dims:
    """The model's dimensions (OPUS-MT's by default) and the seeds of its weights."""

    d_model: int = 512
    layers: int = 6
    heads: int = 8
    ffn: int = 2048
    vocab: int = 58101
    max_positions: int = 512
    spm_pieces: int = 6000  # per language (the English side of the corpus holds fewer than 8,000)
    spm_lines: int = 29000  # training lines per language
    seed: int = 1
    family: str = "marian"  # or "nllb" (benchmarks/real_size_nllb.py): keyed apart in the cache

    def config(self) -> dict[str, Any]:
        """The dimensions as a transformers encoder-decoder config's fields."""
        return dict(
            d_model=self.d_model,
            encoder_layers=self.layers,
            decoder_layers=self.layers,
            encoder_attention_heads=self.heads,
            decoder_attention_heads=self.heads,
            encoder_ffn_dim=self.ffn,
            decoder_ffn_dim=self.ffn,
            max_position_embeddings=self.max_positions,
        )

    @property
    def key(self) -> str:
        lead = "" if self.family == "marian" else f"{self.family}-"
        return f"{lead}d{self.d_model}-l{self.layers}-h{self.heads}-f{self.ffn}-v{self.vocab}-s{self.seed}"


@dataclass(frozen=True)
class Prepared:
    """Where each engine's copy of the model lies."""

    hf: Path  # the Hugging Face folder (transformers, optimum)
    model: Path  # the mtserve model version dir (the engine, the server)
    ct2: Path  # the CTranslate2 int8 model dir
    tgt_lang: str = ""  # a multilingual model's target language token, forced first on every engine


@dataclass(frozen=True)
class Family:
    """How a model family's folder is built and imported: `build(out, dims, data)` writes the
    Hugging Face folder, `mtserve import` takes it with these flags into REPOSITORY/name/1."""

    build: Callable[[Path, Dims, Path], Path]
    name: str = NAME
    precision: str = "fp32,int8"
    src_lang: str = ""
    tgt_lang: str = ""


def padded_vocab(pieces: list[str], size: int) -> dict[str, int]:
    """OPUS-MT's shared layout: </s> 0, <unk> 1, the pieces (first occurrence wins), dummy pieces
    up to `size - 1` entries, and <pad> at `size - 1`. The dummies (`<dummy_N>`) are no
    SentencePiece output, so they never occur in a source or a translation's ids."""
    vocab = {t: i for i, t in enumerate(SPECIAL)}
    for p in pieces:
        vocab.setdefault(p, len(vocab))
    if len(vocab) > size - 1:
        raise ValueError(f"{len(vocab) + 1} tokens do not fit a vocabulary of {size}")
    n = 0
    while len(vocab) < size - 1:
        vocab.setdefault(f"<dummy_{n}>", len(vocab))
        n += 1
    vocab["<pad>"] = size - 1
    return vocab


def read_lines(lang: str, split: str = "train", limit: int = 0, data: Path = DATA) -> list[str]:
    with gzip.open(data / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return lines[:limit] if limit else lines


def train_spm(lines: list[str], prefix: Path, pieces: int, model_type: str = "unigram") -> Path:
    """A SentencePiece model over `lines` (unigram, Marian's kind, unless given): PREFIX.model."""
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=pieces,
        model_type=model_type,
        character_coverage=1.0,
        num_threads=2,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def spm_pieces(spm_file: Path) -> list[str]:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def build_folder(out: Path, dims: Dims, data: Path = DATA) -> Path:
    """The Hugging Face Marian folder of `dims` at `out` (made here; must not exist)."""
    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="mtserve-spm-") as tmp:
        de = train_spm(read_lines("de", limit=dims.spm_lines, data=data), Path(tmp) / "de", dims.spm_pieces)
        en = train_spm(read_lines("en", limit=dims.spm_lines, data=data), Path(tmp) / "en", dims.spm_pieces)
        vocab = padded_vocab(spm_pieces(de) + spm_pieces(en), dims.vocab)
        (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
        tok = MarianTokenizer(
            source_spm=str(de), target_spm=str(en), vocab=str(out / "vocab.json"), source_lang="de", target_lang="en"
        )
        tok.save_pretrained(str(out))
    pad = vocab["<pad>"]
    config = MarianConfig(
        vocab_size=dims.vocab,
        decoder_vocab_size=dims.vocab,
        share_encoder_decoder_embeddings=True,
        **dims.config(),
        activation_function="swish",
        scale_embedding=True,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
        architectures=["MarianMTModel"],
    )
    torch.manual_seed(dims.seed)
    MarianMTModel(config).save_pretrained(str(out))
    gen = json.loads((out / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gen, "bad_words_ids": [[pad]]}))
    (out / "dims.json").write_text(json.dumps(asdict(dims)))
    return out


def import_folder(hf: Path, repository: Path, family: Family | None = None) -> Path:
    """`mtserve import` of the folder into REPOSITORY/NAME/1 (replaced when there), NAME and the
    flags the family's (MARIAN's: opus-size, fp32 and int8)."""
    fam = family or MARIAN
    shutil.rmtree(repository / fam.name, ignore_errors=True)
    cmd = [sys.executable, "-m", "mtserve", "import", str(hf), "--name", fam.name, "--version", "1"]
    cmd += ["--precision", fam.precision, "--repository", str(repository)]
    cmd += [
        *(["--src-lang", fam.src_lang] if fam.src_lang else []),
        *(["--tgt-lang", fam.tgt_lang] if fam.tgt_lang else []),
    ]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return repository / fam.name / "1"


# The code that writes an imported version's graphs: a change to any of them exports them again.
EXPORT_CODE = (
    "export/fused/__init__.py",
    "export/fused/builder.py",
    "export/fused/ranking.py",
    "export/fused/decoder.py",
    "export/fused/encoder.py",
    "export/to_onnx.py",
    "export/variants.py",
    "export/export_dir.py",
    "export/model.py",
    "export/checks.py",
)
_WITH_DOCSTRINGS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def code_of(source: str) -> str:
    """A module's code without its comments, docstrings and layout (its syntax tree, dumped)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, _WITH_DOCSTRINGS) and node.body and isinstance(node.body[0], ast.Expr):
            first = node.body[0].value
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree)


def export_code_hash(repo: Path = REPO) -> str:
    """The hash of EXPORT_CODE's code: edits to their docs and comments leave it as it is."""
    h = hashlib.sha256()
    for name in EXPORT_CODE:
        h.update(code_of((repo / name).read_text()).encode())
    return h.hexdigest()


def export_int8(model: Path) -> Path:
    """`mtserve export --precision int8` of the imported version: its int8 graphs (portable and
    fused) written again by the present code, its fp32 ones kept (same weights)."""
    cmd = [sys.executable, "-m", "mtserve", "export", "--model", str(model), "--precision", "int8"]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return model


def convert_ct2(hf: Path, out: Path) -> Path:
    """`ct2-transformers-converter --quantization int8` of the folder (the console script next to
    this interpreter, else CTranslate2's module)."""
    script = Path(sys.executable).with_name("ct2-transformers-converter")
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "ctranslate2.converters.transformers"]
    cmd += ["--model", str(hf), "--output_dir", str(out), "--quantization", "int8", "--force"]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return out


HF_VENV_PACKAGES = ("optimum-onnx[onnxruntime]", "transformers==4.57.*", "torch==2.13.0", "sentencepiece")
QUANTIZE = """
import shutil, sys
from pathlib import Path
from onnxruntime.quantization import QuantType, quantize_dynamic
src, out = Path(sys.argv[1]), Path(sys.argv[2])
shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.onnx", "*.onnx_data"))
for graph in src.glob("*.onnx"):
    quantize_dynamic(graph, out / graph.name, weight_type=QuantType.QInt8)
"""


def hf_venv(cache: Path = CACHE) -> Path:
    """The optimum venv's python (optimum-onnx 0.1 needs transformers 4.57, the main venv has 5),
    made with `python -m venv` and pip on first use."""
    venv = cache / ".venv-hf"
    python = venv / "bin" / "python"
    if not (venv / "ok").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *HF_VENV_PACKAGES], check=True)
        (venv / "ok").write_text(" ".join(HF_VENV_PACKAGES))
    return python


def export_optimum(hf: Path, root: Path, python: Path) -> tuple[Path, Path]:
    """optimum's ONNX export of the folder (`optimum-cli export onnx`, with the key/value cache)
    and a copy of it with every graph dynamically quantised to int8 (onnxruntime's
    quantize_dynamic, what optimum's ORTQuantizer runs): (fp32 dir, int8 dir)."""
    fp32, int8 = root / "optimum-fp32", root / "optimum-int8"
    if not (fp32 / "config.json").exists():
        cli = [str(python), "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(hf)]
        subprocess.run([*cli, "--task", "text2text-generation-with-past", str(fp32)], check=True, cwd=root)
    if not (int8 / "config.json").exists():
        shutil.rmtree(int8, ignore_errors=True)
        subprocess.run([str(python), "-c", QUANTIZE, str(fp32), str(int8)], check=True)
    return fp32, int8


def timed(step: str, times: dict[str, float], fn: Callable[[], object]) -> None:
    """Run one preparation step, logging and recording (in `times`) the seconds it took."""
    t0 = time.time()
    print(f"real size: {step}...", file=sys.stderr, flush=True)
    fn()
    times[step] = round(time.time() - t0, 1)
    print(f"real size: {step} took {times[step]} s", file=sys.stderr, flush=True)


def prepare(dims: Dims = Dims(), cache: Path = CACHE, data: Path = DATA, family: Family | None = None) -> Prepared:
    """The model of `dims` built, imported and converted, each step only when its output is missing
    (the int8 graphs also when the export code changed); the family's build and import flags
    (MARIAN's by default). The seconds each step took go to ROOT/prepare-seconds.json."""
    fam = family or MARIAN
    root = cache / f"real-size-{dims.key}"
    hf, model, ct2 = root / "hf", root / "models" / fam.name / "1", root / "ct2-int8"
    times: dict[str, float] = {}
    if not (hf / "model.safetensors").exists():
        shutil.rmtree(hf, ignore_errors=True)
        timed("build", times, lambda: fam.build(hf, dims, data))
    stamp, code = root / "models" / "export-code.sha256", export_code_hash()
    if not (model / "onnx" / "manifest.json").exists():
        timed("import", times, lambda: import_folder(hf, root / "models", fam))
        stamp.write_text(code)
    elif not stamp.exists() or stamp.read_text() != code:
        timed("export int8", times, lambda: export_int8(model))
        stamp.write_text(code)
    if not (ct2 / "model.bin").exists():
        timed("ct2 convert", times, lambda: convert_ct2(hf, ct2))
    if times:
        log = root / "prepare-seconds.json"
        old = json.loads(log.read_text()) if log.exists() else {}
        log.write_text(json.dumps({**old, **times}))
    return Prepared(hf=hf, model=model, ct2=ct2, tgt_lang=fam.tgt_lang)


MARIAN = Family(build=build_folder)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--cache", default=str(CACHE))
    args = ap.parse_args(argv)
    print(json.dumps({k: str(v) for k, v in asdict(prepare(cache=Path(args.cache))).items()}))


if __name__ == "__main__":
    main()
