"""`mtserve import`: a LOCAL Hugging Face folder -> a version of the model repository.

Top to bottom: check the folder (config.json, the weights, the tokenizer files), map the config
and the weights to mtserve's own model, write the model dir and its ONNX export (every precision
and graph) in a scratch dir beside the target, compare the model with transformers (`parity`),
and only then rename the scratch dir to REPOSITORY/NAME/VERSION. A folder that cannot be taken
leaves the repository as it was."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from contract.manifest import PRECISIONS
from export.checkpoint import save_model_dir
from export.hf.config import MARIAN, HFImportError, architecture, model_config
from export.hf.parity import TOLERANCE, Parity, compare
from export.hf.tokenizer import ImportedTokenizer, import_tokenizer, required_files
from export.hf.weights import convert_state_dict
from export.model import Transformer
from export.to_onnx import export_model
from export.tokenizer import encode_batch, load_model_tokenizer

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# Sentences the parity check translates when none are given: any text in the source language does.
PROBE_SENTENCES = [
    "Ein Mann fährt mit dem Fahrrad durch die Stadt.",
    "Two dogs are playing in the snow.",
    "Une femme lit un livre sur un banc.",
    "Kinder spielen am Strand.",
    "A group of people is standing in front of a building.",
    "Le chat dort sur le canapé.",
    "Eine Frau mit einem roten Hut singt.",
    "The man is cooking dinner in the kitchen.",
]


def _generation_config(src: Path) -> dict[str, Any]:
    path = src / "generation_config.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def check_folder(src: Path) -> tuple[dict[str, Any], str]:
    """config.json and its architecture, once every file is there and every setting is one mtserve
    takes; HFImportError naming the missing file or the field otherwise. Reads, never writes."""
    if not (src / "config.json").is_file():
        raise HFImportError(f"{src}: config.json is missing (a local Hugging Face model folder is needed)")
    hf = json.loads((src / "config.json").read_text(encoding="utf-8"))
    arch = architecture(hf)
    if not any((src / w).is_file() for w in WEIGHT_FILES):
        raise HFImportError(f"{src}: no weights ({' or '.join(WEIGHT_FILES)})")
    for name in required_files(src, arch):
        if not (src / name).is_file():
            raise HFImportError(f"{src}: tokenizer file {name} is missing")
    model_config(hf, 0, _generation_config(src))  # the fields, before anything is written
    return hf, arch


def next_version(model_root: Path) -> int:
    versions = [int(p.name) for p in model_root.glob("*") if p.is_dir() and p.name.isdecimal()]
    return max(versions, default=0) + 1


def _load_hf(src: Path, arch: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only, never the hub
    from transformers import M2M100ForConditionalGeneration, MarianMTModel

    cls = MarianMTModel if arch == MARIAN else M2M100ForConditionalGeneration
    return cls.from_pretrained(str(src), local_files_only=True).float().eval()


def _build(
    src: Path, work: Path, hf_config: dict[str, Any], arch: str, langs: tuple[str | None, str | None], texts: list[str]
) -> tuple[Transformer, Any, ImportedTokenizer, list[int]]:
    """Write the model dir into `work`: weights, config.json and the tokenizer files (an NLLB
    tokenizer's SentencePiece pieces checked against transformers' on `texts`)."""
    work.mkdir()
    tok = import_tokenizer(src, work, arch, langs, texts)
    spec = model_config(hf_config, tok.unk_id, _generation_config(src))
    hf = _load_hf(src, arch)
    model = Transformer(spec.cfg)
    model.load_state_dict(convert_state_dict(hf, arch, spec.cfg, spec.suppressed))
    model.eval()
    extra = {
        "src_lang": tok.src_lang,
        "tgt_lang": tok.tgt_lang,
        "sentencepiece": tok.files,
        "languages": tok.languages,
        "imported_from": {"architecture": arch, "path": str(src.resolve())},
    }
    save_model_dir(model, work, extra=extra)
    return model, hf, tok, spec.suppressed


def _parity(
    model_dir: Path, model: Transformer, hf: Any, tok: ImportedTokenizer, suppressed: list[int], texts: list[str]
) -> Parity:
    """Our model against transformers on `texts`, tokenized as the model dir will tokenize them."""
    lang_tokens = tok.languages.get("source_tokens", {})
    prefix = [lang_tokens[tok.src_lang]] if tok.src_lang in lang_tokens else []
    limit = model.cfg.max_positions - 2 - len(prefix)
    ids = encode_batch(load_model_tokenizer(model_dir), texts)
    src = [prefix + t[:limit] + [model.cfg.eos_id] for t in ids]
    forced = tok.languages.get("target_tokens", {}).get(tok.tgt_lang)
    return compare(hf, model, src, forced, suppressed)


def import_model(
    src: str | Path,
    repository: str | Path,
    name: str,
    version: int | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    texts: list[str] | None = None,
    precisions: tuple[str, ...] = PRECISIONS,
) -> dict[str, Any]:
    """Import the HF folder `src` as REPOSITORY/NAME/VERSION (VERSION: one past the highest there)
    and return the report: where, what, and the parity figures. HFImportError, with nothing
    written, when the folder cannot be imported or the model differs from transformers."""
    src = Path(src)
    hf_config, arch = check_folder(src)
    root = Path(repository) / name
    version = version if version is not None else next_version(root)
    target = root / str(version)
    if target.exists():
        raise HFImportError(f"{target} exists already; choose another --version")
    created = [d for d in (root, *root.parents) if not d.exists()]  # removed again if the import fails
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".import-{version}-", dir=root))
    try:
        work, texts = scratch / "model", texts or PROBE_SENTENCES
        model, hf, tok, suppressed = _build(src, work, hf_config, arch, (src_lang, tgt_lang), texts)
        parity = _parity(work, model, hf, tok, suppressed, texts)
        if not parity.ok():
            raise HFImportError(
                f"the imported model differs from transformers: {parity.identical}/{parity.sentences} greedy outputs "
                f"identical, max |Δ log p| {parity.max_abs_log_prob_diff:.2e} (tolerance {TOLERANCE:.0e})"
            )
        manifest = export_model(work, work / "onnx", precisions, name=name, version=str(version))
        work.rename(target)
        created = []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        for d in created:  # innermost first
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
    return {
        "name": name,
        "version": version,
        "path": str(target),
        "architecture": arch,
        "src_lang": tok.src_lang,
        "tgt_lang": tok.tgt_lang,
        "languages": len(tok.languages["source"]),
        "parity": {
            "sentences": parity.sentences,
            "greedy_identical": parity.identical,
            "max_abs_log_prob_diff": float(f"{parity.max_abs_log_prob_diff:.3g}"),
        },
        "onnx_parity": {key: v.parity for key, v in manifest.variants.items()},
    }
