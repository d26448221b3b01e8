"""`mtserve export`: a model dir -> a self-contained ONNX export dir for the serving path.

The command, top to bottom: export the raw fp32 graphs (`export.graphs`, as `contract.graphs`
specifies them), derive each precision from them (`export.precision`), write the fused decoder
step of the CPU precisions (`export.fused`), check the graphs and their parity with PyTorch
(`export.checks`; the variants: `export.variants`), and write the graphs, the tokenizer
(tokenizer.json, or the SentencePiece models and vocabularies of an imported model) and
`manifest.json` (`contract.manifest`) into the export dir (`export.export_dir`), the graphs of
each precision sharing one weights file (`export.shared_weights`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from contract.manifest import (
    GRAPHS,
    MANIFEST,
    PRECISIONS,
    Manifest,
    ManifestError,
    Variant,
    load_manifest,
    sha256_file,
)
from export.checkpoint import WEIGHTS, load_model, read_meta
from export.export_dir import assemble_manifest, copy_tokenizer, kept_shortlist, reusable_variants, write_export
from export.graphs import EXPORTERS
from export.shared_weights import share_weights
from export.shortlist import with_shortlist
from export.variants import export_variants

log = logging.getLogger("mtserve.export")


def default_out_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / "onnx"


def _validate_precisions(precisions) -> list[str]:
    """The precisions asked for, each once, in order; ValueError on an unknown one."""
    precisions = list(dict.fromkeys(precisions))
    for p in precisions:
        if p not in PRECISIONS:
            raise ValueError(f"unknown precision {p!r}; choose from {PRECISIONS}")
    return precisions


def export_model(
    model_dir: str | Path,
    out_dir: str | Path | None = None,
    precisions=("fp32",),
    exporter: str = "dynamo",
    name: str | None = None,
    version: str | None = None,
    check: bool = True,
    graphs: Sequence[str] = GRAPHS,
) -> Manifest:
    """Export `precisions` of the model in `model_dir` into `out_dir` (default MODEL_DIR/onnx) and
    update its manifest. Variants exported from other weights are dropped. `graphs`: the decoder
    steps to keep of each precision (a precision without a fused form keeps its portable graphs
    whatever it says; the fused graphs are checked against the portable ones either way)."""
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir else default_out_dir(model_dir)
    precisions = _validate_precisions(precisions)
    meta = read_meta(model_dir)
    model = load_model(model_dir, "cpu")
    weights_sha = sha256_file(model_dir / WEIGHTS)
    out.mkdir(parents=True, exist_ok=True)

    variants = reusable_variants(out, weights_sha, precisions)
    variants.update(kept_graphs(export_variants(model, out, precisions, exporter, check), graphs))
    shortlist = kept_shortlist(out, weights_sha)
    variants = {k: v.model_copy(update={"shortlist_steps": {}}) for k, v in variants.items()}
    tokenizer = copy_tokenizer(model_dir, meta, out)
    manifest = assemble_manifest(model_dir, meta, model.cfg, weights_sha, variants, tokenizer, name, version)
    if shortlist is not None:
        manifest = with_shortlist(model, out, manifest, shortlist)
    write_export(out, share_weights(out, manifest))
    log.info("export done in %.1fs", time.perf_counter() - t0)
    return manifest


def kept_graphs(variants: dict[str, Variant], graphs: Sequence[str]) -> dict[str, Variant]:
    """`variants` less the graphs not in `graphs`, where their precision has another."""
    unknown = set(graphs) - set(GRAPHS)
    if unknown or not graphs:
        raise ValueError(f"graphs: {sorted(unknown) or 'none'}; choose from {', '.join(GRAPHS)}")
    out = {}
    for key, v in variants.items():
        others = [k for k, w in variants.items() if w.precision == v.precision and k != key]
        if v.graph in graphs or not others:
            out[key] = v
    return out


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
        shared = [manifest.weights[v.precision].file] if v.precision in manifest.weights else []
        sizes = sum(os.path.getsize(out / f) for f in (v.encoder.file, v.decoder.file, *shared)) / 2**20
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
