"""`mtserve export`: a model dir -> a self-contained ONNX export dir for the serving path.

The command, top to bottom: export the raw fp32 graphs (`export.graphs`, as `contract.graphs`
specifies them), derive each precision from them (`export.precision`), write the fused decoder
step of the CPU precisions (`export.fused`), check the graphs and their parity with PyTorch
(`export.checks`), and write the graphs, the tokenizer (tokenizer.json, or the SentencePiece models
and vocabularies of an imported model) and `manifest.json` (`contract.manifest`) into the export dir.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import cast

import onnx
import onnxruntime
import torch

from contract.graphs import decoder_io, encoder_io, fused_decoder_io
from contract.manifest import (
    GRAPHS,
    MANIFEST,
    PRECISIONS,
    Dims,
    FileSpec,
    GenerationDefaults,
    GraphSpec,
    LanguageSpec,
    Manifest,
    ManifestError,
    Precision,
    SentencePieceSpec,
    ShortlistSpec,
    SpecialIds,
    TensorSpec,
    Variant,
    load_manifest,
    sha256_file,
    variant_key,
    write_manifest,
)
from export.checkpoint import TOKENIZER, WEIGHTS, load_model, read_meta
from export.checks import (
    FP32_TOLERANCE,
    LOG_PROB_FLOOR,
    check_graph,
    encoder_parity_check,
    fused_parity_check,
    parity_check,
)
from export.fused.decoder import build_fused_decoder
from export.fused.encoder import build_fused_encoder
from export.graphs import EXPORTERS, OPSET, export_raw
from export.model import ModelConfig, Transformer
from export.precision import VARIANT_RECIPES, build_variant, variant_level
from export.shortlist import with_shortlist

try:
    import onnxscript

    ONNXSCRIPT_VERSION: str | None = onnxscript.__version__
except ImportError:  # only the dynamo exporter needs it; the manifest then leaves its version out
    ONNXSCRIPT_VERSION = None

log = logging.getLogger("mtserve.export")

# The precisions that get a fused decoder step too, and how its linear layers multiply. fp16 is
# for CUDA, where the portable graph serves.
FUSED = {"fp32": "fp32", "int8": "int8"}
# ... and those that get a second fused step for batches of one row (MatMulNBits, 8 bits).
FUSED_ONE_ROW = {"int8": "nbits8"}


# ----------------------------------------------------------------------------- the export dir


def _tool_versions() -> dict[str, str]:
    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    if ONNXSCRIPT_VERSION is not None:
        versions["onnxscript"] = ONNXSCRIPT_VERSION
    try:
        versions["mtserve"] = importlib.metadata.version("mtserve")
    except importlib.metadata.PackageNotFoundError:  # running from a checkout without an install
        pass
    return versions


def default_out_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / "onnx"


def _validate_precisions(precisions) -> list[str]:
    """The precisions asked for, each once, in order; ValueError on an unknown one."""
    precisions = list(dict.fromkeys(precisions))
    for p in precisions:
        if p not in PRECISIONS:
            raise ValueError(f"unknown precision {p!r}; choose from {PRECISIONS}")
    return precisions


def _reusable_variants(out: Path, weights_sha: str, precisions: list[str]) -> dict[str, Variant]:
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


def _kept_shortlist(out: Path, weights_sha: str) -> ShortlistSpec | None:
    """The vocabulary shortlist of the export in `out` (`mtserve shortlist`) where it stays: exported
    from the same weights, its file intact. Its decoder steps are built again for every fused
    variant; a shortlist of other weights is removed."""
    old: Manifest | None = None
    if (out / MANIFEST).is_file():
        try:
            old = load_manifest(out, verify_checksums=False)
        except ManifestError:
            return None  # `_reusable_variants` has said why
    spec = old.shortlist if old is not None else None
    if spec is None:
        return None
    if old is not None and old.source_weights_sha256 == weights_sha and (out / spec.file).is_file():
        if sha256_file(out / spec.file) == spec.sha256:
            return spec
    log.warning("dropping the vocabulary shortlist of other weights: run `mtserve shortlist` again")
    (out / spec.file).unlink(missing_ok=True)
    return None


def _check_variant(model: Transformer, precision: str, enc: Path, dec: Path) -> dict[str, float]:
    """The contract checks and the parity figures of one precision's graphs; RuntimeError when the
    fp32 graphs differ from PyTorch beyond FP32_TOLERANCE (log-probs: above LOG_PROB_FLOOR)."""
    cfg = model.cfg
    check_graph(enc, *encoder_io(cfg))
    check_graph(dec, *decoder_io(cfg))
    checks = parity_check(model, enc, dec)
    if precision == "fp32" and checks["log_probs"] > FP32_TOLERANCE:
        raise RuntimeError(
            f"fp32 export differs from PyTorch: max |Δ log_probs| = {checks['log_probs']:.2e} "
            f"(log-probs clipped at {LOG_PROB_FLOOR:g}, tolerance {FP32_TOLERANCE:.0e})"
        )
    return checks


def _place(path: Path, out: Path, io: tuple[list[TensorSpec], list[TensorSpec]]) -> GraphSpec:
    """Move a built (and checked) graph from the scratch dir into `out`, and describe it."""
    path.replace(out / path.name)
    return GraphSpec(file=path.name, sha256=sha256_file(out / path.name), inputs=io[0], outputs=io[1])


def _export_variant(
    model: Transformer, precision: str, raw_enc: Path, raw_dec: Path, work: Path, out: Path, exporter: str, check: bool
) -> Variant:
    """Build `precision`'s graphs from the raw ones in `work`, check them, move them into `out` and
    describe them."""
    cfg = model.cfg
    target, _, notes = VARIANT_RECIPES[precision]
    level = variant_level(precision)[1]
    enc, dec = build_variant(precision, raw_enc, raw_dec, work)
    checks = _check_variant(model, precision, enc, dec) if check else {}
    return Variant(
        precision=cast(Precision, precision),
        opset=OPSET,
        exporter=f"torch.onnx.export(dynamo={exporter == 'dynamo'})",
        optimization=f"ORT_ENABLE_{level.upper()}" if level else "none (ORT optimises at load)",
        target=target,
        notes=notes,
        parity={k: float(f"{v:.3g}") for k, v in checks.items()},
        encoder=_place(enc, out, encoder_io(cfg)),
        decoder=_place(dec, out, decoder_io(cfg)),
    )


def _export_fused_variant(model: Transformer, portable: Variant, work: Path, out: Path, check: bool) -> Variant:
    """The fused graphs of `portable`'s precision beside its graphs: the encoder, and the decoder
    step for every batch, for batches of one row where it has one, and each again unscored (greedy
    search when no sentence asks for its score)."""
    cfg, precision = model.cfg, portable.precision
    checks: dict[str, float] = {}

    def build(suffix: str, linear_kind: str) -> tuple[GraphSpec, GraphSpec]:
        """The step and its unscored twin, checked against PyTorch and each other. The one-row step
        ranks in one pass: for a single row the two-pass ranking costs as much in more nodes."""
        scored, unscored = (
            work / f"decoder.fused.{precision}{suffix}.onnx",
            work / f"decoder.fused.{precision}{suffix}.unscored.onnx",
        )
        build_fused_decoder(model, scored, linear_kind, blocks=not suffix)
        build_fused_decoder(model, unscored, linear_kind, scored=False, blocks=not suffix)
        if check:
            check_graph(scored, *fused_decoder_io(cfg))
            check_graph(unscored, *fused_decoder_io(cfg, scored=False))
            prefix = "one_row_" if suffix else ""
            checks.update(
                {f"{prefix}{k}": v for k, v in fused_parity_check(model, scored, unscored_path=unscored).items()}
            )
        return _place(scored, out, fused_decoder_io(cfg)), _place(unscored, out, fused_decoder_io(cfg, scored=False))

    decoder, decoder_unscored = build("", FUSED[precision])
    if check and precision == "fp32" and checks["log_probs"] > FP32_TOLERANCE:
        raise RuntimeError(
            f"fused fp32 step differs from PyTorch: max |Δ log_probs| = {checks['log_probs']:.2e} "
            f"(log-probs clipped at {LOG_PROB_FLOOR:g}, tolerance {FP32_TOLERANCE:.0e})"
        )
    encoder = work / f"encoder.fused.{precision}.onnx"
    build_fused_encoder(model, encoder, FUSED[precision])
    if check:
        check_graph(encoder, *encoder_io(cfg))
        enc_checks = encoder_parity_check(model, encoder, out / portable.encoder.file)
        if precision == "fp32" and max(enc_checks["encoder_memory"], enc_checks["cross_kv"]) > FP32_TOLERANCE:
            raise RuntimeError(f"fused fp32 encoder differs from PyTorch: {enc_checks}")
        checks.update(enc_checks)
    encoder_spec = _place(encoder, out, encoder_io(cfg))
    one_row, one_row_unscored = (
        build(".one-row", FUSED_ONE_ROW[precision]) if precision in FUSED_ONE_ROW else (None, None)
    )
    return portable.model_copy(
        update={
            "graph": "fused",
            "exporter": "export.fused.build_fused_encoder and build_fused_decoder (onnx.helper, com.microsoft "
            "contrib operators)",
            "optimization": "none baked in (written fused; ORT's own passes find nothing more to fuse)",
            "target": "cpu",
            "notes": f"{portable.notes}; encoder and decoder step fused: MultiHeadAttention for the encoder and "
            "the cross-attention, DecoderMaskedMultiHeadAttention over an in-place cache with cache_indirection",
            "parity": {k: float(f"{v:.3g}") for k, v in checks.items()},
            "encoder": encoder_spec,
            "decoder": decoder,
            "decoder_unscored": decoder_unscored,
            "decoder_one_row": one_row,
            "decoder_one_row_unscored": one_row_unscored,
        }
    )


def _export_variants(
    model: Transformer, out: Path, precisions: list[str], exporter: str, check: bool
) -> dict[str, Variant]:
    """One torch export of the raw fp32 graphs, in a scratch dir inside `out` (so that the final
    moves stay on one file system), and every precision derived from it."""
    cfg = model.cfg
    variants: dict[str, Variant] = {}
    with tempfile.TemporaryDirectory(prefix=".export-", dir=out) as tmp:
        work = Path(tmp)
        raw_enc, raw_dec = export_raw(model, work, exporter)
        if check:
            check_graph(raw_enc, *encoder_io(cfg))
            check_graph(raw_dec, *decoder_io(cfg))
        for precision in precisions:
            portable = _export_variant(model, precision, raw_enc, raw_dec, work, out, exporter, check)
            variants[precision] = portable
            if precision in FUSED:
                variants[variant_key(precision, "fused")] = _export_fused_variant(model, portable, work, out, check)
            log.info("exported %s into %s", precision, out)
    return variants


def _copy_tokenizer(model_dir: Path, meta: dict, out: Path) -> tuple[FileSpec | None, SentencePieceSpec | None]:
    """Copy the model's tokenizer files into `out`: tokenizer.json, or the SentencePiece models
    and vocabularies of an imported model (the other one is None)."""

    def copy(file: str) -> FileSpec:
        shutil.copyfile(model_dir / file, out / file)
        return FileSpec(file=file, sha256=sha256_file(out / file))

    spm = meta.get("sentencepiece")
    if spm is None:
        return copy(TOKENIZER), None
    return None, SentencePieceSpec(**{role: copy(file) for role, file in spm.items()})


def _assemble_manifest(
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


def _write_export(out: Path, manifest: Manifest) -> None:
    """Remove the graphs no variant refers to any more (e.g. from older weights) and write the manifest."""
    keep = {f.file for f in manifest.files()}
    for f in out.glob("*.onnx"):
        if f.name not in keep:
            f.unlink()
    write_manifest(out, manifest)


def export_model(
    model_dir: str | Path,
    out_dir: str | Path | None = None,
    precisions=("fp32",),
    exporter: str = "dynamo",
    name: str | None = None,
    version: str | None = None,
    check: bool = True,
) -> Manifest:
    """Export `precisions` of the model in `model_dir` into `out_dir` (default MODEL_DIR/onnx) and
    update its manifest. Variants exported from other weights are dropped."""
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir else default_out_dir(model_dir)
    precisions = _validate_precisions(precisions)
    meta = read_meta(model_dir)
    model = load_model(model_dir, "cpu")
    weights_sha = sha256_file(model_dir / WEIGHTS)
    out.mkdir(parents=True, exist_ok=True)

    variants = _reusable_variants(out, weights_sha, precisions)
    variants.update(_export_variants(model, out, precisions, exporter, check))
    shortlist = _kept_shortlist(out, weights_sha)
    variants = {k: v.model_copy(update={"shortlist_steps": {}}) for k, v in variants.items()}
    tokenizer = _copy_tokenizer(model_dir, meta, out)
    manifest = _assemble_manifest(model_dir, meta, model.cfg, weights_sha, variants, tokenizer, name, version)
    if shortlist is not None:
        manifest = with_shortlist(model, out, manifest, shortlist)
    _write_export(out, manifest)
    log.info("export done in %.1fs", time.perf_counter() - t0)
    return manifest


def ensure_exported(
    model_dir: str | Path, precision: str = "fp32", out_dir: str | Path | None = None, exporter: str = "dynamo"
) -> Path:
    """Reuse an up-to-date export (same weights, checksums fine) or export `precision` now."""
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir else default_out_dir(model_dir)
    try:
        m = load_manifest(out, verify_checksums=True, precision=precision)
        if m.source_weights_sha256 == sha256_file(model_dir / WEIGHTS):
            return out
    except ManifestError:
        pass
    export_model(model_dir, out, [precision], exporter=exporter)
    return out


# ----------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default="models/de-en/1", help="model dir (model.safetensors, config.json, tokenizer.json)"
    )
    p.add_argument("--out", help="export dir (default: MODEL/onnx)")
    p.add_argument(
        "--precision",
        default="fp32",
        choices=[*PRECISIONS, "all"],
        help="fp32 (reference), int8 (CPU, dynamic quantisation), fp16 (CUDA), or all three",
    )
    p.add_argument(
        "--exporter",
        default="dynamo",
        choices=EXPORTERS,
        help="torch.onnx.export(dynamo=True) (default) or the legacy TorchScript tracer",
    )
    p.add_argument("--name", help="model name for the manifest (default: config.json's name or the dir name)")
    p.add_argument(
        "--version", help="model version for the manifest (default: config.json's version or the weights' hash)"
    )
    p.add_argument("--no-check", action="store_true", help="skip onnx.checker and the parity check against PyTorch")


def run(args) -> Manifest:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    precisions = list(PRECISIONS) if args.precision == "all" else [args.precision]
    t0 = time.perf_counter()
    manifest = export_model(
        args.model,
        args.out,
        precisions,
        exporter=args.exporter,
        name=args.name,
        version=args.version,
        check=not args.no_check,
    )
    out = Path(args.out) if args.out else default_out_dir(args.model)
    for key, v in manifest.variants.items():
        if v.precision not in precisions:
            continue
        sizes = sum(os.path.getsize(out / g.file) for g in (v.encoder, v.decoder)) / 2**20
        print(
            f"{key}: {out / v.encoder.file}, {out / v.decoder.file} ({sizes:.1f} MiB, {v.optimization}); "
            f"max |diff| vs PyTorch: {json.dumps(v.parity)}"
        )
    print(
        f"manifest: {out / MANIFEST} (model {manifest.name} {manifest.version}) in {time.perf_counter() - t0:.1f}s",
        file=sys.stdout,
    )
    return manifest


def main(argv=None) -> None:
    p = argparse.ArgumentParser("mtserve export")
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
