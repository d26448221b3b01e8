"""Fixtures of the serving tests with imported Hugging Face models: a model repository with the
shipped de-en and fr-en models (exported into temporary directories) beside a tiny Marian (de-en)
and a tiny M2M100 (multilingual), imported with `mtserve import`'s machinery from the seeded
checkpoints of tests/conftest.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.service.imported import M2M100, M2M100_PADDED, MARIAN

REPO = Path(__file__).resolve().parents[2]
SHIPPED_FR_EN = REPO / "models" / "fr-en" / "1"


@pytest.fixture(scope="session")
def hf_folders(hf_marian_separate_dir, hf_m2m100_dir) -> dict[str, Path]:
    """The tiny Hugging Face folders of tests/conftest.py: a Marian with separate source and target
    vocabularies and an M2M100."""
    return {"marian": hf_marian_separate_dir, "m2m100": hf_m2m100_dir}


@pytest.fixture(scope="session")
def imported_models(tmp_path_factory, hf_folders) -> Path:
    """A model repository with opus-de-en/1 (the Marian import) and m2m/1 (the M2M100 import), fp32
    only (their NAME/serving.json says so)."""
    from export.hf.importer import import_model

    repo = tmp_path_factory.mktemp("imported-repository")
    for name, folder in ((MARIAN, hf_folders["marian"]), (M2M100, hf_folders["m2m100"])):
        import_model(folder, repo, name, version=1, precisions=("fp32",))
        (repo / name / "serving.json").write_text(json.dumps({"precision": "fp32"}), encoding="utf-8")
    return repo


@pytest.fixture(scope="session")
def shipped_fr_en_int8_export(tmp_path_factory) -> Path:
    """The shipped fr-en checkpoint's int8 export, made once per session."""
    from export.to_onnx import export_model

    out = tmp_path_factory.mktemp("fr-en-int8") / "onnx"
    export_model(SHIPPED_FR_EN, out, ["int8"])
    return out


def _link_shipped(repo: Path, de_en: Path, fr_en: Path) -> Path:
    for name, export in (("de-en", de_en), ("fr-en", fr_en)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "onnx").symlink_to(export, target_is_directory=True)
    return repo


@pytest.fixture(scope="session")
def imported_repository(imported_models, shipped_int8_export, shipped_fr_en_int8_export) -> Path:
    """`imported_models` with the shipped models beside them: de-en/1 (the shipped int8 export)
    and fr-en/1 (the shipped fr-en, exported in int8)."""
    return _link_shipped(imported_models, shipped_int8_export, shipped_fr_en_int8_export)


@pytest.fixture(scope="session")
def shipped_repository(tmp_path_factory, shipped_int8_export, shipped_fr_en_int8_export) -> Path:
    """A model repository of the shipped models alone: de-en/1 and fr-en/1, int8 exports."""
    return _link_shipped(tmp_path_factory.mktemp("shipped-repository"), shipped_int8_export, shipped_fr_en_int8_export)


@pytest.fixture(scope="session")
def padded_repository(tmp_path_factory, hf_m2m100_padded_dir) -> Path:
    """A model repository with m2m100-padded/1: the M2M100 of tests/conftest.py's
    `hf_m2m100_padded_dir` (100 languages, 8 embedding rows past its vocabulary that it emits
    often), imported in fp32."""
    from export.hf.importer import import_model

    repo = tmp_path_factory.mktemp("padded-repository")
    import_model(hf_m2m100_padded_dir, repo, M2M100_PADDED, version=1, precisions=("fp32",))
    (repo / M2M100_PADDED / "serving.json").write_text(json.dumps({"precision": "fp32"}), encoding="utf-8")
    return repo
