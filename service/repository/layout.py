"""The model repository on disk, in Triton's layout: `REPOSITORY/NAME/VERSION/`, each version a
model directory (config.json, tokenizer.json, onnx/ with its manifest). VERSION is a positive
integer; other entries are ignored, as Triton ignores them. A model directory given on its own
(`--model-dir`) is a repository of one version, served under its manifest's name.

`NAME/serving.json`, when present, holds the model's own values of the per-model settings
(`PER_MODEL`: its decode workers, batching, queue and request limits), as Triton's
config.pbtxt does; the server's settings give the rest."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from service.errors import InvalidArgument, ModelLoadError, NotFound

SERVING_FILE = "serving.json"
PER_MODEL = frozenset(
    {
        "precision",
        "graph",
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
    return entry.isdecimal() and int(entry) > 0


def scan(repository: Path) -> dict[str, list[VersionDir]]:
    """Every model's versions on disk, lowest first."""
    if not repository.is_dir():
        raise NotFound(f"model_repository: {repository} is not a directory")
    found: dict[str, list[VersionDir]] = {}
    for model in sorted(p for p in repository.iterdir() if p.is_dir() and not p.name.startswith(".")):
        versions = sorted((p for p in model.iterdir() if p.is_dir() and is_version(p.name)), key=lambda p: int(p.name))
        if versions:
            found[model.name] = [VersionDir(model.name, v.name, v) for v in versions]
    return found


def parse_model_ref(ref: str, field: str = "model") -> tuple[str, str]:
    """'NAME' or 'NAME:VERSION' (what TranslateResponse.model reports) as (name, version); an
    empty version means the name's default version."""
    name, _, version = ref.partition(":")
    if ref and not name:
        raise InvalidArgument(field, f"{ref!r} has no model name before ':'")
    if version and not is_version(version):
        raise InvalidArgument(field, f"version {version!r} of {ref!r} is not a positive integer")
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
            raise NotFound(f"models: {name!r} is not in the repository (found: {', '.join(repository) or 'none'})")
        versions = repository[name]
        match = [v for v in versions if v.version == version] if version else versions[-1:]
        if not match:
            raise NotFound(
                f"models: {name!r} has no version {version!r} (found: {', '.join(v.version for v in versions)})"
            )
        chosen.append(match[0])
    return chosen


def model_overrides(source: VersionDir) -> dict:
    """The model's own settings from NAME/serving.json (empty without one); ModelLoadError for a
    file that is not a JSON object or names a setting that is not per model."""
    path = source.path.parent / SERVING_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not readable JSON: {e}") from e
    if not isinstance(values, dict):
        raise ModelLoadError(f"{path}: must hold a JSON object of settings")
    foreign = sorted(set(values) - PER_MODEL)
    if foreign:
        raise ModelLoadError(
            f"{path}: {', '.join(foreign)} cannot be set per model (per model: {', '.join(sorted(PER_MODEL))})"
        )
    return values
