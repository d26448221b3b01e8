"""`mtserve import PATH --name NAME [--version N] [--repository DIR]`: import a LOCAL Hugging Face
Marian (OPUS-MT) or M2M100/NLLB checkpoint into the model repository (`export.hf.importer`), with
its ONNX export and a parity check against transformers, reported as one JSON line on stdout.
Never downloads: PATH is a folder on disk."""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a local Hugging Face model folder (config.json, weights, tokenizer files)")
    p.add_argument("--name", required=True, help="the model's name in the repository")
    p.add_argument("--version", type=int, help="version number (default: one past the highest in REPOSITORY/NAME)")
    p.add_argument("--repository", default="models", help="model repository dir (default: models)")
    p.add_argument("--src-lang", help="source language (default: the tokenizer's)")
    p.add_argument("--tgt-lang", help="target language (default: the tokenizer's)")
    p.add_argument(
        "--sentences", help="source sentences for the parity check, one a line (.gz ok; default: a few built in)"
    )
    p.add_argument("--limit", type=int, default=200, help="compare at most this many of --sentences (default 200)")
    p.add_argument(
        "--precision",
        default="all",
        help="the precisions to export: all (default: fp32, int8, fp16) or a comma-separated list, e.g. fp32,int8",
    )


def _precisions(value: str) -> tuple[str, ...]:
    from contract.manifest import PRECISIONS

    if value == "all":
        return PRECISIONS
    chosen = tuple(dict.fromkeys(v.strip() for v in value.split(",")))
    unknown = [v for v in chosen if v not in PRECISIONS]
    if unknown or not chosen:
        sys.exit(f"mtserve import: --precision {value!r}: each must be one of {', '.join(PRECISIONS)} (or all)")
    return chosen


def _read_sentences(path: str | None, limit: int) -> list[str] | None:
    if path is None:
        return None
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:limit]


def run(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        from export.hf.config import HFImportError
        from export.hf.importer import import_model
    except ModuleNotFoundError as e:
        sys.exit(f"mtserve import: needs the export extra ({e.name} is missing): pip install 'mtserve[export]'")
    if not Path(args.path).is_dir():
        sys.exit(f"mtserve import: {args.path} is not a folder (mtserve imports local Hugging Face folders only)")
    try:
        report = import_model(
            args.path,
            args.repository,
            args.name,
            args.version,
            args.src_lang,
            args.tgt_lang,
            _read_sentences(args.sentences, args.limit),
            _precisions(args.precision),
        )
    except HFImportError as e:
        sys.exit(f"mtserve import: {e}")
    print(json.dumps(report))
    return report
