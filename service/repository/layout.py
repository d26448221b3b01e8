"""The model repository on disk, in Triton's layout: `REPOSITORY/NAME/VERSION/`, each version a
model directory (config.json, tokenizer.json, onnx/ with its manifest). VERSION is a positive
integer written in ASCII digits without leading zeros; other entries are ignored, as Triton ignores
them. NAME is at most MAX_NAME_CHARS of [A-Za-z0-9._-], not starting with a dot: what a request
names is checked against that at the edge (`check_name`, `parse_model_ref`). A model directory given on its own
(`--model-dir`) is a repository of one version, served under its manifest's name.

`NAME/serving.json`, when present, holds the model's own values of the per-model settings
(`PER_MODEL`: its decode workers, batching, queue and request limits), as Triton's
config.pbtxt does; the server's settings give the rest. Its `"load"` says when the model is loaded:
`"at_start"` (the default) or `"on_demand"`, on its first request (service/repository/residency.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from service.errors import InvalidArgument, ModelLoadError, NotFound, quote

MAX_NAME_CHARS = 128
_NAME = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{MAX_NAME_CHARS - 1}}}")
_VERSION = re.compile(r"[1-9][0-9]{0,17}")  # ASCII digits, no leading zero, fits an int64

SERVING_FILE = "serving.json"
LOAD_KEY = "load"
LOAD_MODES = ("at_start", "on_demand")
PER_MODEL = frozenset(
    {
        "precision",
        "graph",
        "shortlist",
        "decode_workers",
        "intra_op_threads",
        "inter_op_threads",
        "engine_process",
        "share_sessions",
        "continuous_batching",
        "max_batch_sentences",
        "max_batch_tokens",
        "max_queue_delay_ms",
        "admit_fraction",
        "admit_delay_ms",
        "compact_fraction",
        "max_queue_size",
        "max_texts_per_request",
        "max_input_tokens",
        "max_output_tokens",
        "max_text_bytes",
        "max_glossary_terms",
        "max_beam_size",
        "default_beam_size",
    }
)


@dataclass(frozen=True)
class VersionDir:
    name: str
    version: str
    path: Path  # the model directory
    onnx_dir: Path | None = None  # None: path/onnx


def is_version(entry: str) -> bool:
    """A positive integer in ASCII digits without leading zeros ('1', '12'; not '01', '１', '+1')."""
    return _VERSION.fullmatch(entry) is not None


def is_name(entry: str) -> bool:
    return _NAME.fullmatch(entry) is not None


def check_name(name: str, field: str) -> str:
    """`name` if it can name a model; else INVALID_ARGUMENT naming `field`."""
    if not is_name(name):
        raise InvalidArgument(
            field,
            f"{quote(name)} is not a model name (at most {MAX_NAME_CHARS} characters of A-Z a-z 0-9 . _ -, "
            "not starting with '.')",
        )
    return name


def check_version(version: str, field: str) -> str:
    """`version` if it is one (`is_version`); else INVALID_ARGUMENT naming `field`."""
    if not is_version(version):
        raise InvalidArgument(field, f"{quote(version)} is not a positive integer (ASCII digits, no leading zero)")
    return version


def scan(repository: Path) -> dict[str, list[VersionDir]]:
    """Every model's versions on disk, lowest first."""
    if not repository.is_dir():
        raise NotFound(f"model_repository: {repository} is not a directory")
    found: dict[str, list[VersionDir]] = {}
    for model in sorted(p for p in repository.iterdir() if p.is_dir() and is_name(p.name)):
        versions = sorted((p for p in model.iterdir() if p.is_dir() and is_version(p.name)), key=lambda p: int(p.name))
        if versions:
            found[model.name] = [VersionDir(model.name, v.name, v) for v in versions]
    return found


def parse_model_ref(ref: str, field: str = "model") -> tuple[str, str]:
    """'NAME' or 'NAME:VERSION' (what TranslateResponse.model reports) as (name, version); an
    empty version means the name's default version."""
    name, colon, version = ref.partition(":")
    if ref and not name:
        raise InvalidArgument(field, f"{quote(ref)} has no model name before ':'")
    if name:
        check_name(name, field)
    if colon and not is_version(version):
        raise InvalidArgument(
            field, f"version {quote(version)} of {quote(ref)} is not a positive integer (ASCII digits, no leading zero)"
        )
    return name, version


def wanted(repository: dict[str, list[VersionDir]], names: list[str]) -> list[VersionDir]:
    """What the server loads at start: the latest version of every model, or of those `names`
    lists (MTSERVE_MODELS; 'NAME:VERSION' picks a version)."""
    if not names:
        return [versions[-1] for versions in repository.values()]
    chosen = []
    for ref in names:
        name, version = parse_model_ref(ref, "models")
        if name not in repository:
            raise NotFound(f"models: {quote(name)} is not in the repository (found: {', '.join(repository) or 'none'})")
        versions = repository[name]
        match = [v for v in versions if v.version == version] if version else versions[-1:]
        if not match:
            raise NotFound(
                f"models: {quote(name)} has no version {quote(version)} (found: {', '.join(v.version for v in versions)})"
            )
        chosen.append(match[0])
    return chosen


def model_overrides(source: VersionDir) -> dict:
    """The model's own settings from NAME/serving.json (empty without one); ModelLoadError for a
    file that is not a JSON object or names a setting that is not per model."""
    values = _serving_file(source)
    values.pop(LOAD_KEY, None)
    foreign = sorted(set(values) - PER_MODEL)
    if foreign:
        path = source.path.parent / SERVING_FILE
        raise ModelLoadError(
            f"{path}: {', '.join(foreign)} cannot be set per model (per model: {', '.join(sorted(PER_MODEL))}, and {LOAD_KEY})"
        )
    return values


def load_mode(source: VersionDir) -> str:
    """When the model is loaded: NAME/serving.json's "load" ("at_start" without one); ModelLoadError
    for another value or an unreadable file."""
    mode = _serving_file(source).get(LOAD_KEY, "at_start")
    if mode not in LOAD_MODES:
        path = source.path.parent / SERVING_FILE
        raise ModelLoadError(f"{path}: {LOAD_KEY} must be one of {', '.join(LOAD_MODES)}, not {quote(str(mode))}")
    return str(mode)


def _serving_file(source: VersionDir) -> dict:
    path = source.path.parent / SERVING_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not readable JSON: {e}") from e
    if not isinstance(values, dict):
        raise ModelLoadError(f"{path}: must hold a JSON object of settings")
    return values
