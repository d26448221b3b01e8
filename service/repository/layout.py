"""The model repository on disk, in Triton's layout: `REPOSITORY/NAME/VERSION/`, each version a
model directory (config.json, tokenizer.json, onnx/ with its manifest). VERSION is a positive
integer; other entries are ignored, as Triton ignores them. A model directory given on its own
(`--model-dir`) is a repository of one version, served under its manifest's name."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.errors import InvalidArgument, NotFound


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
