"""The export dir around the graphs: the variants and the vocabulary shortlist of an earlier
export that stay (same weights), the tokenizer files copied in, the manifest assembled
(`contract.manifest`) and written, and the graphs no variant refers to any more removed.
"""

from __future__ import annotations

import importlib.metadata
import logging
import shutil
from pathlib import Path

import onnx
import onnxruntime
import torch

from contract.manifest import (
    GRAPHS,
    MANIFEST,
    PRECISIONS,
    Dims,
    FileSpec,
    GenerationDefaults,
    LanguageSpec,
    Manifest,
    ManifestError,
    SentencePieceSpec,
    ShortlistSpec,
    SpecialIds,
    Variant,
    load_manifest,
    sha256_file,
    write_manifest,
)
from contract.weights import weights_file
from export.checkpoint import TOKENIZER
from export.graphs import OPSET
from export.model import ModelConfig

try:
    import onnxscript

    ONNXSCRIPT_VERSION: str | None = onnxscript.__version__
except ImportError:  # only the dynamo exporter needs it; the manifest then leaves its version out
    ONNXSCRIPT_VERSION = None


log = logging.getLogger("mtserve.export")


def _tool_versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    if ONNXSCRIPT_VERSION is not None:
        versions["onnxscript"] = ONNXSCRIPT_VERSION
    try:
        versions["mtserve"] = importlib.metadata.version("mtserve")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout without an install
        pass
    return versions


def reusable_variants(out: Path, weights_sha: str, precisions: list[str]) -> dict[str, Variant]:
    """The variants of the manifest already in `out` that stay: those exported from the same weights
    with the same opset, and not about to be exported again."""
    old: Manifest | None = None
    if (out / MANIFEST).is_file():
        try:
            old = load_manifest(out, verify_checksums=False)
        except ManifestError as e:
            log.warning("ignoring the existing manifest: %s", e)
    if old is None or old.source_weights_sha256 != weights_sha:
        return {}
    return {k: v for k, v in old.variants.items() if v.precision not in precisions and v.opset == OPSET}


def kept_shortlist(out: Path, weights_sha: str) -> ShortlistSpec | None:
    """The vocabulary shortlist of the export in `out` (`mtserve shortlist`) where it stays: exported
    from the same weights, its file intact. Its decoder steps are built again for every fused
    variant; a shortlist of other weights is removed."""
    old: Manifest | None = None
    if (out / MANIFEST).is_file():
        try:
            old = load_manifest(out, verify_checksums=False)
        except ManifestError:
            return None  # `reusable_variants` has said why
    spec = old.shortlist if old is not None else None
    if spec is None:
        return None
    if old is not None and old.source_weights_sha256 == weights_sha and (out / spec.file).is_file():
        if sha256_file(out / spec.file) == spec.sha256:
            return spec
    log.warning("dropping the vocabulary shortlist of other weights: run `mtserve shortlist` again")
    (out / spec.file).unlink(missing_ok=True)
    return None


def copy_tokenizer(model_dir: Path, meta: dict, out: Path) -> tuple[FileSpec | None, SentencePieceSpec | None]:
    """Copy the model's tokenizer files into `out`: tokenizer.json, or the SentencePiece models
    and vocabularies of an imported model (the other one is None)."""

    def copy(file: str) -> FileSpec:
        shutil.copyfile(model_dir / file, out / file)
        return FileSpec(file=file, sha256=sha256_file(out / file))

    spm = meta.get("sentencepiece")
    if spm is None:
        return copy(TOKENIZER), None
    files = {role: copy(file) for role, file in spm.items()}
    # The ids no vocabulary entry names (`mtserve import` records them), for the server to check.
    return None, SentencePieceSpec.model_validate({**files, "unmapped_ids": meta.get("unmapped_ids")})


def assemble_manifest(
    model_dir: Path,
    meta: dict,
    cfg: ModelConfig,
    weights_sha: str,
    variants: dict[str, Variant],
    tokenizer: tuple[FileSpec | None, SentencePieceSpec | None],
    name: str | None,
    version: str | None,
) -> Manifest:
    """The manifest of `out`: the model's identity, languages, dims and special ids, the tokenizer
    already copied into `out`, and `variants` in the order of PRECISIONS."""
    here = model_dir.resolve()
    # In a repository (NAME/VERSION/) the model's name is its parent directory's.
    default_name = here.parent.name if here.name.isdecimal() else here.name
    src_lang, tgt_lang = meta.get("src_lang", "de"), meta.get("tgt_lang", "en")
    return Manifest(
        name=name or meta.get("name") or default_name,
        version=version or str(meta.get("version") or weights_sha[:12]),
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        languages=LanguageSpec(**meta.get("languages", {"source": [src_lang], "target": [tgt_lang]})),
        source_weights_sha256=weights_sha,
        special_ids=SpecialIds(
            pad_id=cfg.pad_id,
            bos_id=cfg.bos_id,
            eos_id=cfg.eos_id,
            unk_id=cfg.unk_id,
            decoder_start_id=cfg.decoder_start_id,
        ),
        dims=Dims(
            vocab_size=cfg.vocab_size,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_k=cfg.d_k,
            n_encoder_layers=cfg.n_encoder_layers,
            n_decoder_layers=cfg.n_decoder_layers,
            max_positions=cfg.max_positions,
        ),
        generation=GenerationDefaults(**meta.get("generation", {})),
        tokenizer=tokenizer[0],
        sentencepiece=tokenizer[1],
        tool_versions=_tool_versions(),
        opset=OPSET,
        variants=dict(
            sorted(variants.items(), key=lambda kv: (PRECISIONS.index(kv[1].precision), GRAPHS.index(kv[1].graph)))
        ),
    )


def write_export(out: Path, manifest: Manifest) -> None:
    """Remove the graphs, their external data files (`export.onnx_files`) and the weights files no
    variant refers to any more (e.g. from older weights) and write the manifest."""
    keep = {f.file for f in manifest.files()}
    for f in [*out.glob("*.onnx"), *out.glob("*.onnx.data"), *out.glob(weights_file("*"))]:
        if f.name not in keep:
            f.unlink()
    write_manifest(out, manifest)
