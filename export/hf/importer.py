"""`mtserve import`: a LOCAL Hugging Face folder -> a version of the model repository.

Top to bottom: check the folder (config.json, the weights, the tokenizer files), map the config
and the weights to mtserve's own model, write the model dir and its ONNX export (every precision
and graph) in a scratch dir beside the target, compare the model with transformers (`parity`),
run the caller's last check on it (`mtserve import` loads it as the server does and translates
through it), and only then rename the scratch dir to REPOSITORY/NAME/VERSION. A folder that cannot
be taken leaves the repository as it was.

Every file is checked before anything is loaded or written: config.json's fields (`config`), the
weights' tensor shapes against them (`weights.check_weights`), the vocabularies against the
model's sizes (`tokenizer.check_tokenizer_files`). What differs between model families is each family's (`families.registry.Family`'s hooks), found
by config.json's `architectures`. The version is written only inside the repository.
The scratch dir (`.import-VERSION-PID-*`) goes on any failure; one left by a killed import (its
process gone) is removed by the next import into the repository."""

from __future__ import annotations

import gc
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.manifest import GRAPHS, PRECISIONS
from export.checkpoint import save_model_dir
from export.hf.config import HFImportError, read_json_object
from export.hf.families.registry import Family, family_for
from export.hf.parity import TOLERANCE, Parity, compare
from export.hf.tokenizer import ImportedTokenizer, check_tokenizer_files
from export.hf.weights import check_weights, convert_state_dict, weight_shapes
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
SCRATCH_PREFIX = ".import-"
_SCRATCH = re.compile(r"\.import-\d+-(\d+)-")
# The last check, on the finished model dir before it is renamed into place: (model dir, name,
# version) -> what it found, for the report; HFImportError when the version cannot serve.
FinalCheck = Callable[[Path, str, int], dict[str, Any]]


def _generation_config(src: Path) -> dict[str, Any]:
    path = src / "generation_config.json"
    return read_json_object(path) if path.exists() else {}


def check_folder(src: Path) -> tuple[dict[str, Any], Family]:
    """config.json and its model family, once every file is there and every setting is one mtserve
    takes; HFImportError naming the missing file or the field otherwise. Reads, never writes."""
    if not src.is_dir():
        raise HFImportError(f"{src} is not a folder (mtserve imports local Hugging Face folders only)")
    if not (src / "config.json").exists():
        raise HFImportError(f"{src}: config.json is missing (a local Hugging Face model folder is needed)")
    hf = read_json_object(src / "config.json")
    family = family_for(hf)
    weights = next((src / w for w in WEIGHT_FILES if (src / w).exists()), None)
    if weights is None:
        raise HFImportError(f"{src}: no weights ({' or '.join(WEIGHT_FILES)})")
    if not weights.is_file():
        raise HFImportError(f"{weights.name}: not a regular file")
    names = family.tokenizer_files(src)
    for name in names:
        if not (src / name).is_file():
            raise HFImportError(f"{src}: tokenizer file {name} is missing")
    cfg = family.model_config(hf, 0, _generation_config(src)).cfg  # the fields, before anything is written
    check_weights(weight_shapes(weights), cfg, weights.name)
    check_tokenizer_files(src, names, cfg.vocab_size, cfg.src_vocab_size)
    return hf, family


def remove_stale_scratch(repository: Path) -> list[Path]:
    """Remove the scratch dirs of imports whose process is gone (killed); returns them."""
    removed = []
    for d in repository.glob(f"*/{SCRATCH_PREFIX}*"):
        m = _SCRATCH.match(d.name)
        if d.is_dir() and m and not _alive(int(m.group(1))):
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def version_dir(repository: Path, name: str, version: int) -> Path:
    """REPOSITORY/NAME/VERSION, refused unless it lies inside the repository, one level per part."""
    root = repository.resolve()
    target = (root / name / str(version)).resolve()
    if target.parent.parent != root or target.parent.name != name or target.name != str(version):
        raise HFImportError(f"--name {name!r} and --version {version} do not name a folder inside {repository}")
    return target


def next_version(model_root: Path) -> int:
    versions = [int(p.name) for p in model_root.glob("*") if p.is_dir() and p.name.isdecimal()]
    return max(versions, default=0) + 1


def _load_hf(src: Path, family: Family) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local folder only, never the hub
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stderr is the command's one line of error

    return family.model_class().from_pretrained(str(src), local_files_only=True).float().eval()


def _build(
    src: Path,
    work: Path,
    hf_config: dict[str, Any],
    family: Family,
    langs: tuple[str | None, str | None],
    texts: list[str],
) -> tuple[Transformer, Any, ImportedTokenizer, list[int]]:
    """Write the model dir into `work`: weights, config.json and the tokenizer files (an NLLB
    tokenizer's SentencePiece pieces checked against transformers' on `texts`)."""
    work.mkdir()
    vocab_size = family.model_config(hf_config, 0).cfg.vocab_size
    try:
        tok = family.import_tokenizer(src, work, langs, texts, vocab_size)
    except HFImportError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers' or sentencepiece's error on a file it cannot read
        raise HFImportError(f"the tokenizer files cannot be loaded: {type(e).__name__}: {e}") from None
    spec = family.model_config(hf_config, tok.unk_id, _generation_config(src))
    try:
        hf = _load_hf(src, family)
    except Exception as e:  # noqa: BLE001 - any error of transformers' loading
        raise HFImportError(f"the weights cannot be loaded by transformers: {type(e).__name__}: {e}") from None
    model = Transformer(spec.cfg)
    model.load_state_dict(convert_state_dict(hf, family, spec.cfg, spec.suppressed))
    model.eval()
    extra = {
        "src_lang": tok.src_lang,
        "tgt_lang": tok.tgt_lang,
        "sentencepiece": tok.files,
        "languages": tok.languages,
        "unmapped_ids": tok.unmapped,
        "imported_from": {"architecture": family.architecture, "path": str(src.resolve())},
    }
    save_model_dir(model, work, extra=extra)
    return model, hf, tok, spec.suppressed


def _parity(
    model_dir: Path,
    model: Transformer,
    hf: Any,
    family: Family,
    tok: ImportedTokenizer,
    suppressed: list[int],
    texts: list[str],
) -> Parity:
    """Our model against transformers on `texts`, tokenized as the model dir will tokenize them and
    decoded by the family's generation rules."""
    prefix = family.source_prefix(tok)
    limit = model.cfg.max_positions - 2 - len(prefix)
    ids = encode_batch(load_model_tokenizer(model_dir), texts)
    src = [prefix + t[:limit] + [model.cfg.eos_id] for t in ids]
    return compare(hf, model, src, family.forced_first(tok), suppressed)


def import_model(
    src: str | Path,
    repository: str | Path,
    name: str,
    version: int | None = None,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    texts: list[str] | None = None,
    precisions: tuple[str, ...] = PRECISIONS,
    final_check: FinalCheck | None = None,
    graphs: tuple[str, ...] = GRAPHS,
) -> dict[str, Any]:
    """Import the HF folder `src` as REPOSITORY/NAME/VERSION (VERSION: one past the highest there)
    and return the report: where, what, and the parity figures (with `final_check`'s under
    "served"). HFImportError, with nothing written, when the folder cannot be imported, the model
    differs from transformers or `final_check` refuses it."""
    src = Path(src)
    if Path(repository).is_dir():
        remove_stale_scratch(Path(repository))
    hf_config, family = check_folder(src)
    root = Path(repository) / name
    version = version if version is not None else next_version(root)
    target = version_dir(Path(repository), name, version)
    if target.exists():
        raise HFImportError(f"{target} exists already; choose another --version")
    created = [d for d in (root, *root.parents) if not d.exists()]  # removed again if the import fails
    root.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{version}-{os.getpid()}-", dir=root))
    try:
        work, texts = scratch / "model", texts or PROBE_SENTENCES
        model, hf, tok, suppressed = _build(src, work, hf_config, family, (src_lang, tgt_lang), texts)
        parity = _parity(work, model, hf, family, tok, suppressed, texts)
        if not parity.ok():
            raise HFImportError(
                f"the imported model differs from transformers: {parity.identical}/{parity.sentences} greedy outputs "
                f"identical, max |Δ log p| {parity.max_abs_log_prob_diff:.2e} (tolerance {TOLERANCE:.0e})"
            )
        # The export loads the model dir's weights itself: both models in memory here would add
        # twice the fp32 weights to its peak (4.9 GB at NLLB-600M's size).
        del model, hf
        gc.collect()
        manifest = export_model(work, work / "onnx", precisions, name=name, version=str(version), graphs=graphs)
        served = final_check(work, name, version) if final_check is not None else None
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
        "architecture": family.architecture,
        "src_lang": tok.src_lang,
        "tgt_lang": tok.tgt_lang,
        "languages": len(tok.languages["source"]),
        "unmapped_ids": len(tok.unmapped),
        "parity": {
            "sentences": parity.sentences,
            "greedy_identical": parity.identical,
            "max_abs_log_prob_diff": float(f"{parity.max_abs_log_prob_diff:.3g}"),
        },
        "onnx_parity": {key: v.parity for key, v in manifest.variants.items()},
        **({"served": served} if served is not None else {}),
    }
