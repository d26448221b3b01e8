"""manifest.json validation, checksums, and the torch-free serving imports."""

from __future__ import annotations

import json
import shutil

import pytest

from contract.manifest import ExportMissing, ManifestError, load_manifest, resolve_onnx_dir


@pytest.fixture()
def export_copy(tiny_onnx_dir, tmp_path):
    """A private copy of the fp32 export (manifest trimmed to it) that a test may damage."""
    out = tmp_path / "onnx"
    out.mkdir()
    m = json.loads((tiny_onnx_dir / "manifest.json").read_text())
    m["variants"] = {"fp32": m["variants"]["fp32"]}
    for name in ("tokenizer.json", "encoder.fp32.onnx", "decoder.fp32.onnx", "weights.fp32.bin"):
        shutil.copyfile(tiny_onnx_dir / name, out / name)
    (out / "manifest.json").write_text(json.dumps(m))
    return out


def test_load_and_resolve_from_a_model_dir(tiny_onnx_dir):
    m = load_manifest(tiny_onnx_dir.parent, precision="int8")  # the model dir: its onnx/ subdir
    assert resolve_onnx_dir(tiny_onnx_dir.parent) == tiny_onnx_dir
    assert m.variant("int8").target == "cpu" and m.variant("fp16").target == "cuda"
    assert m.name and m.version


def test_checksum_mismatch_is_rejected(export_copy):
    load_manifest(export_copy)
    graph = export_copy / "decoder.fp32.onnx"
    data = bytearray(graph.read_bytes())
    data[len(data) // 2] ^= 0xFF
    graph.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="checksum mismatch for .*decoder.fp32.onnx"):
        load_manifest(export_copy)
    load_manifest(export_copy, verify_checksums=False)  # only when asked to skip


def test_a_modified_tokenizer_is_rejected_too(export_copy):
    (export_copy / "tokenizer.json").write_text((export_copy / "tokenizer.json").read_text() + " ")
    with pytest.raises(ManifestError, match="tokenizer.json"):
        load_manifest(export_copy)


def test_missing_file_variant_or_export_fail_clearly(export_copy, tmp_path):
    with pytest.raises(ExportMissing, match="'int8' was not exported .*mtserve export --precision int8"):
        load_manifest(export_copy, precision="int8")
    (export_copy / "encoder.fp32.onnx").unlink()
    with pytest.raises(ManifestError, match="encoder.fp32.onnx is listed .* but missing"):
        load_manifest(export_copy)
    with pytest.raises(FileNotFoundError, match="mtserve export"):
        load_manifest(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda m: m.pop("dims"), "dims"),
        (lambda m: m["variants"]["fp32"].update(opset=11), "opset"),
        (lambda m: m["variants"]["fp32"]["encoder"].update(sha256="abc"), "sha256"),
        (lambda m: m.update(format_version=1), "format_version"),  # an older contract
        (lambda m: m["dims"].update(d_k=3), "d_k"),
    ],
)
def test_malformed_manifests_are_rejected(export_copy, edit, match):
    m = json.loads((export_copy / "manifest.json").read_text())
    edit(m)
    (export_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError, match=match):
        load_manifest(export_copy)


def test_an_export_of_an_older_graph_format_says_how_to_redo_it(export_copy):
    """Graphs of another contract would fail every request: the server refuses them at start-up
    with the command that exports them again (and `make serve` runs it by itself)."""
    from contract.manifest import FORMAT_VERSION

    m = json.loads((export_copy / "manifest.json").read_text())
    m["format_version"] = FORMAT_VERSION - 1
    (export_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(
        ManifestError,
        match=rf"format_version {FORMAT_VERSION - 1}; this version reads "
        rf"{FORMAT_VERSION}: export again with `mtserve export --model .* --out ",
    ):
        load_manifest(export_copy, verify_checksums=False)
