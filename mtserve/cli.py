"""The `mtserve` console script.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args)`; only the
chosen one is imported, so serving commands never load torch."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "train": (
        "export.train",
        "train a model on a Multi30k-style corpus (needs the export extra)",
        "add_arguments",
        "run",
    ),
    "evaluate": (
        "mtserve.evaluate",
        "translate a split of a data dir and score it with sacreBLEU",
        "add_arguments",
        "run",
    ),
    "export": (
        "export.to_onnx",
        "export a model dir to ONNX graphs + manifest (needs the export extra)",
        "add_arguments",
        "run",
    ),
    "import": (
        "mtserve.importer",
        "import a local Hugging Face Marian or M2M100/NLLB model into the repository (needs the export extra)",
        "add_arguments",
        "run",
    ),
    "shortlist": (
        "mtserve.shortlist",
        "derive a vocabulary shortlist for a model version and store it with it (needs the export extra)",
        "add_arguments",
        "run",
    ),
    "verify": (
        "mtserve.verify",
        "check an ONNX export against PyTorch: log-prob diffs, greedy agreement",
        "add_arguments",
        "run",
    ),
    "serve": ("service.replicas", "run the gRPC translation server", "add_arguments", "run"),
    "translate": ("service.client.cli", "translate texts with a running server", "add_arguments", "run"),
    "encode": ("service.client.cli", "encode texts with a running server", "add_encode_arguments", "run_encode"),
}


def _load(name: str):
    module = COMMANDS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in {"torch", "safetensors", "onnx", "onnxscript"}:
            sys.exit(f"mtserve {name}: needs the export extra ({e.name} is missing): pip install 'mtserve[export]'")
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser("mtserve", description="Transformer translation: train, evaluate, export, serve")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text, add, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:
            getattr(_load(name), add)(p)
    args = parser.parse_args(argv)
    try:
        getattr(_load(args.command), COMMANDS[args.command][3])(args)
    except FileNotFoundError as e:  # a missing model, data split or graph: one clear line
        sys.exit(f"mtserve {args.command}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
