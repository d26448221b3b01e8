"""The `mtserve` console script.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args)`; only the
chosen one is imported, so serving commands never load torch.

`main` is the one error boundary of every subcommand: whatever goes wrong ends as one line on
stderr naming the problem, never a traceback. Exit status 2 for bad usage (argparse's errors, and
`argparse.ArgumentTypeError` raised by a subcommand for a value it refuses), 1 for a failed
operation (`SystemExit` with a message, OSError, ValueError, RuntimeError, and anything
unexpected, which says so and how to see its traceback: MTSERVE_TRACEBACK=1)."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

USAGE, FAILED = 2, 1
TRACEBACK_ENV = "MTSERVE_TRACEBACK"

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


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line (`mtserve COMMAND: error: ...`), status 2."""

    def error(self, message: str) -> NoReturn:
        _exit(USAGE, f"{self.prog}: {message} (see {self.prog} --help)")


def one_line(message: str) -> str:
    return "; ".join(line.strip() for line in message.splitlines() if line.strip())


def _exit(status: int, message: str) -> NoReturn:
    print(one_line(message), file=sys.stderr)
    raise SystemExit(status)


def _load(name: str):
    module = COMMANDS[name][0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] in {"torch", "safetensors", "onnx", "onnxscript"}:
            sys.exit(f"mtserve {name}: needs the export extra ({e.name} is missing): pip install 'mtserve[export]'")
        raise


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = OneLineParser("mtserve", description="Transformer translation: train, evaluate, export, serve")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text, add, _) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if argv and argv[0] == name:
            getattr(_load(name), add)(p)
    return parser.parse_args(argv)


def _run(args: argparse.Namespace) -> None:
    getattr(_load(args.command), COMMANDS[args.command][3])(args)


def _status(e: BaseException) -> int:
    return USAGE if isinstance(e, argparse.ArgumentTypeError) else FAILED


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    where = f"mtserve {argv[0]}" if argv and argv[0] in COMMANDS else "mtserve"
    try:
        _run(_parse(argv))
    except SystemExit as e:  # sys.exit(message) or sys.exit(status): the message on one line
        if e.code is None or isinstance(e.code, int):
            raise
        _exit(FAILED, str(e.code) if str(e.code).startswith("mtserve") else f"{where}: {e.code}")
    except KeyboardInterrupt:
        _exit(130, f"{where}: interrupted")
    except (argparse.ArgumentTypeError, OSError, ValueError, RuntimeError) as e:
        _exit(_status(e), f"{where}: {e}" if str(e) else f"{where}: {type(e).__name__}")
    except Exception as e:  # a bug: still one line, and how to see where it came from
        if os.environ.get(TRACEBACK_ENV):
            raise
        _exit(FAILED, f"{where}: unexpected {type(e).__name__}: {e} (a bug; {TRACEBACK_ENV}=1 shows its traceback)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
