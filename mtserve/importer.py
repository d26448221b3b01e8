"""`mtserve import PATH --name NAME [--version N] [--repository DIR]`: import a LOCAL Hugging Face
Marian (OPUS-MT) or M2M100/NLLB checkpoint into the model repository (`export.hf.importer`), with
its ONNX export and a parity check against transformers, reported as one JSON line on stdout.
Never downloads: PATH is a folder on disk.

NAME and VERSION must be ones the server serves (`service.repository.layout`: its own rules), and
the version is written only inside REPOSITORY. The last step loads the finished version as the
server does and translates the parity sentences through it (`mtserve.served`). SIGTERM ends the
import as a failure (its scratch dir removed); a SIGKILL'd import's scratch dir is removed by the
next import.

By default it writes what the server runs and nothing more (`--precision served`): the precision it
loads (MTSERVE_PRECISION, int8 unless set) and of it the decoder step it runs (the fused graphs on
the CPU; the portable ones for MTSERVE_GRAPH=portable or on CUDA). A version is what a pod
downloads and a container carries."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mtserve.corpus import read_lines
from service.repository.layout import MAX_NAME_CHARS, is_name, is_version

MAX_SENTENCE_CHARS = 2000  # of a --sentences line


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
    p.add_argument(
        "--limit", type=int, default=200, help="compare at most this many of --sentences (1 to 10000, default 200)"
    )
    p.add_argument(
        "--precision",
        default="served",
        help="the precisions to export: served (the default: the one the server loads, MTSERVE_PRECISION, int8 "
        "unless set, and only the decoder step it runs: fused on the CPU), all (fp32, int8, fp16) or a "
        "comma-separated list, e.g. fp32,int8 (each with its portable and fused graphs)",
    )


def _precisions(value: str) -> tuple[str, ...]:
    from contract.manifest import PRECISIONS

    if value == "served":
        precision = served_precision()
        if precision not in PRECISIONS:
            raise argparse.ArgumentTypeError(
                f"--precision served: MTSERVE_PRECISION {precision[:40]!r} is not one of {', '.join(PRECISIONS)}"
            )
        return (precision,)
    if value == "all":
        return PRECISIONS
    chosen = tuple(dict.fromkeys(v.strip() for v in value.split(",")))
    unknown = [v for v in chosen if v not in PRECISIONS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"--precision {value[:40]!r}: each must be one of {', '.join(PRECISIONS)} (or served, or all)"
        )
    return chosen


def check_arguments(args: argparse.Namespace) -> None:
    """NAME and VERSION by the server's rules, the rest by their ranges: ArgumentTypeError (bad usage)."""
    if not is_name(args.name):
        raise argparse.ArgumentTypeError(
            f"--name {args.name[:40]!r} is not a name the server serves (1 to {MAX_NAME_CHARS} characters of "
            "A-Z a-z 0-9 . _ -, not starting with '.')"
        )
    if args.version is not None and not is_version(str(args.version)):
        raise argparse.ArgumentTypeError(
            f"--version {args.version}: a version is a positive integer of at most 18 digits"
        )
    if not 1 <= args.limit <= 10000:
        raise argparse.ArgumentTypeError(f"--limit {args.limit}: give 1 to 10000 sentences")
    if not Path(args.path).is_dir():
        raise argparse.ArgumentTypeError(
            f"{args.path} is not a folder (mtserve imports local Hugging Face folders only)"
        )
    if Path(args.repository).exists() and not Path(args.repository).is_dir():
        raise argparse.ArgumentTypeError(f"--repository {args.repository} is not a folder")


def read_sentences(path: str | None, limit: int) -> list[str] | None:
    """The non-blank lines among the first `limit` of `path` (`mtserve.corpus`: bounded, gzip when
    it ends in .gz); ValueError naming the file when it cannot be read or has no sentence."""
    if path is None:
        return None
    try:
        sentences = [line.strip() for line in read_lines(path, limit, max_line_chars=MAX_SENTENCE_CHARS)]
    except ValueError as e:
        raise ValueError(f"--sentences {e}") from None
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError(f"--sentences {path}: no sentence in it")
    return sentences


def _graphs(value: str) -> tuple[str, ...]:
    """The decoder steps to write: with `--precision served` the one the server runs (fused on the
    CPU, where the precision has it; the portable graphs for MTSERVE_GRAPH=portable or on CUDA),
    else both."""
    from contract.manifest import GRAPHS

    if value != "served":
        return GRAPHS
    graph = os.environ.get("MTSERVE_GRAPH", "").strip() or "auto"
    if graph not in ("auto", *GRAPHS):
        raise argparse.ArgumentTypeError(
            f"--precision served: MTSERVE_GRAPH {graph[:40]!r} is not auto, portable or fused"
        )
    if graph == "auto":
        return ("portable",) if _on_cuda() else ("fused",)
    return (graph,)


def _on_cuda() -> bool:
    """Whether the server would run on CUDA here (MTSERVE_PROVIDER, auto unless set)."""
    from service.runtime.onnx_model import choose_provider

    return choose_provider(os.environ.get("MTSERVE_PROVIDER", "").strip() or "auto") == "cuda"


def served_precision() -> str:
    """The precision the server loads: MTSERVE_PRECISION, else the server's default."""
    from service.settings import Settings

    return os.environ.get("MTSERVE_PRECISION", "").strip() or str(Settings.model_fields["precision"].default)


# The signals that asked the import to stop. The handler's SystemExit unwinds the import (its
# scratch dir is removed); where it lands in a finalizer that Python runs during a collection,
# Python prints and drops it, and the import went on to write the version and exit 0: the
# final check stops it too (`_stop_if_signalled`).
_signalled: list[int] = []


def _terminated(signum: int, frame: object) -> None:
    _signalled.append(signum)
    raise SystemExit(128 + signum)


def _stop_if_signalled() -> None:
    if _signalled:
        raise SystemExit(128 + _signalled[0])


def _checked(final: Callable[..., dict], *args: Any) -> dict:
    """`final` (the import's last step, before the version is moved into place), stopped by a
    signal that came before or during it."""
    _stop_if_signalled()
    report = final(*args)
    _stop_if_signalled()
    return report


def run(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    check_arguments(args)
    precisions, graphs = _precisions(args.precision), _graphs(args.precision)
    try:
        from export.hf.importer import PROBE_SENTENCES, import_model
        from mtserve.served import check_serves
    except ModuleNotFoundError as e:
        sys.exit(f"mtserve import: needs the export extra ({e.name} is missing): pip install 'mtserve[export]'")
    texts = read_sentences(args.sentences, args.limit)
    serving_file = Path(args.repository) / args.name / "serving.json"
    final = functools.partial(_checked, functools.partial(check_serves, texts or PROBE_SENTENCES, serving_file))
    main_thread = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
    previous = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        report = import_model(
            args.path,
            args.repository,
            args.name,
            args.version,
            args.src_lang,
            args.tgt_lang,
            texts,
            precisions,
            final_check=final,
            graphs=graphs,
        )
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    print(json.dumps(report))
    return report
