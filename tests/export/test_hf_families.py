"""Model families as registered classes (export/hf/families/): the importer finds a checkpoint's
family by config.json's `architectures` and refuses an unknown one with the list of those it
takes; a third family is one class registered inside this test, with no shared module edited,
and a tiny checkpoint imports through it (every stage going through its hooks)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from export.hf.config import HFImportError
from export.hf.families import registry
from export.hf.families.marian import Marian
from export.hf.families.registry import Family, family_for, register_family
from export.hf.importer import import_model

pytest.importorskip("transformers")
FAKE = "TinyMarianMTModel"  # a made-up architecture name


@pytest.fixture
def families(monkeypatch):
    """The registry as it is, restored after the test (a family registered inside it goes)."""
    registry.load_families()
    monkeypatch.setattr(registry, "FAMILIES", dict(registry.FAMILIES))
    return registry.FAMILIES


def _with_architecture(src: Path, dst: Path, architecture: str) -> Path:
    shutil.copytree(src, dst)
    hf = json.loads((dst / "config.json").read_text())
    hf["architectures"] = [architecture]
    (dst / "config.json").write_text(json.dumps(hf))
    return dst


def test_the_families_are_registered_by_architecture(families):
    assert registry.supported() == ["M2M100ForConditionalGeneration", "MarianMTModel"]
    assert type(family_for({"architectures": ["MarianMTModel"]})).__name__ == "Marian"
    family = family_for({"architectures": ["M2M100ForConditionalGeneration"]})
    assert type(family).__name__ == "M2M100" and family.architecture == "M2M100ForConditionalGeneration"


@pytest.mark.parametrize("archs", [["BartForConditionalGeneration"], "MarianMTModel", [], None, [FAKE, FAKE]])
def test_an_unknown_architecture_is_refused_with_the_list(families, archs):
    with pytest.raises(HFImportError) as e:
        family_for({"architectures": archs})
    message = str(e.value)
    assert "`architectures`" in message and "\n" not in message
    assert "['M2M100ForConditionalGeneration', 'MarianMTModel']" in message


def test_a_name_is_registered_once(families):
    with pytest.raises(ValueError, match="MarianMTModel"):
        register_family("MarianMTModel")(type("Other", (Family,), {}))


def test_a_third_family_needs_only_its_own_class(families, hf_marian_dir, tmp_path):
    folder = _with_architecture(hf_marian_dir, tmp_path / "hf", FAKE)
    with pytest.raises(HFImportError, match=f"`architectures` is \\['{FAKE}'\\]"):
        import_model(folder, tmp_path / "repo", "tiny", precisions=("fp32",))
    assert not (tmp_path / "repo" / "tiny" / "1").exists()

    calls: list[str] = []

    @register_family(FAKE)
    class TinyMarian(Marian):  # a family as a new module would declare it: nothing shared edited
        def tokenizer_files(self, src: Path) -> list[str]:
            calls.append("tokenizer_files")
            return super().tokenizer_files(src)

        def import_tokenizer(self, *args: Any) -> Any:
            calls.append("import_tokenizer")
            return super().import_tokenizer(*args)

        def model_class(self) -> Any:
            calls.append("model_class")
            return super().model_class()

        def position_table(self, hf_model: Any, cfg: Any) -> Any:
            calls.append("position_table")
            return super().position_table(hf_model, cfg)

        def forced_first(self, tok: Any) -> int | None:
            calls.append("forced_first")
            return super().forced_first(tok)

    assert FAKE in registry.supported()
    report = import_model(folder, tmp_path / "repo", "tiny", precisions=("fp32",))
    assert report["architecture"] == FAKE
    assert report["parity"]["greedy_identical"] == report["parity"]["sentences"]
    assert set(calls) == {"tokenizer_files", "import_tokenizer", "model_class", "position_table", "forced_first"}
    imported = json.loads((Path(report["path"]) / "config.json").read_text())
    assert imported["imported_from"]["architecture"] == FAKE
