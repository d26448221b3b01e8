"""The last check of `mtserve import`: load a finished model version exactly as the server loads it
(`service.repository.loader.ModelLoader`, with the server's settings from the environment and the
model's NAME/serving.json), and translate sentences through that load. A version that fails here
would be written and never served, so the import refuses it."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from contract.manifest import load_manifest
from export.hf.config import HFImportError
from service.engine.languages import LanguagePair
from service.engine.requests import TranslateOptions
from service.errors import ServiceError, StartupError
from service.metrics import Metrics
from service.repository.layout import SERVING_FILE, VersionDir
from service.repository.loader import ModelLoader
from service.settings import Settings

# The precision loaded when the server's own (MTSERVE_PRECISION, int8 by default) was not exported.
FALLBACK_PRECISIONS = ("int8", "fp32", "fp16")


def _settings(model_dir: Path) -> Settings:
    """The server's settings, in this process with one decode worker, at a precision the export has."""
    base = Settings.model_validate({})  # the environment's MTSERVE_* as the server reads them
    manifest = load_manifest(model_dir / "onnx", verify_checksums=False)
    exported = {v.precision for v in manifest.variants.values()}
    precision = base.precision if base.precision in exported else next(p for p in FALLBACK_PRECISIONS if p in exported)
    values = {**base.model_dump(), "precision": precision, "decode_workers": 1, "engine_process": False, "replicas": 1}
    return Settings.model_validate(values)


async def _load_and_translate(settings: Settings, source: VersionDir, texts: list[str]) -> dict[str, Any]:
    served = await ModelLoader(settings, Metrics()).load(source)
    try:
        engine, pair = served.engine, LanguagePair(served.engine.manifest.src_lang, served.engine.manifest.tgt_lang)
        step, results = settings.max_texts_per_request, []
        for start in range(0, len(texts), step):
            results += await engine.translate(texts[start : start + step], TranslateOptions(beam_size=1), pair=pair)
    finally:
        served.backend.shutdown()
    return {
        "precision": settings.precision,
        "graph": served.graph,
        "sentences": len(results),
        "empty": sum(1 for r in results if not r.text),
    }


def check_serves(texts: list[str], serving_file: Path | None, model_dir: Path, name: str, version: int) -> dict:
    """Load `model_dir` as version `version` of `name` (with `serving_file`, the model's
    serving.json, when it has one) and translate `texts` greedily; what it found, or HFImportError.
    The last three arguments are `export.hf.importer.FinalCheck`'s."""
    if serving_file is not None and serving_file.is_file():
        shutil.copyfile(serving_file, model_dir.parent / SERVING_FILE)  # where the loader reads it
    try:
        settings = _settings(model_dir)
        return asyncio.run(_load_and_translate(settings, VersionDir(name, str(version), model_dir), texts))
    except (ServiceError, StartupError, ValueError, RuntimeError, OSError) as e:
        raise HFImportError(f"the server cannot serve the imported version: {type(e).__name__}: {e}") from None
