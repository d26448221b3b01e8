"""The shared weights layout of an export dir (`export.shared_weights`, `contract.weights`): each
precision's graphs refer to one weights file holding every large initializer once at an aligned
offset; the manifest checks it; the graphs translate as the per-graph layout did, which still loads."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from contract.manifest import Manifest, ManifestError, load_manifest, sha256_file, write_manifest
from contract.weights import ALIGNMENT, INLINE_BYTES, weights_file
from export.shared_weights import convert, precision_graphs
from service.decoding.generator import generate
from service.runtime.onnx_model import OnnxSeq2Seq

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def external_tensors(path: Path) -> list[tuple[str, str, int, int]]:
    """(name, location, offset, length) of every initializer of the graph at `path` stored outside it."""
    model = onnx.load(str(path), load_external_data=False)
    out = []
    for t in model.graph.initializer:
        if uses_external_data(t):
            info = {e.key: e.value for e in t.external_data}
            out.append((t.name, info["location"], int(info["offset"]), int(info["length"])))
    return out


def per_graph_copy(src: Path, dst: Path) -> Path:
    """`src` (an export dir in the shared layout) rewritten to the layout of exports made before it:
    every graph holding its own weights, no weights files, no `weights` in the manifest."""
    shutil.copytree(src, dst)
    manifest = load_manifest(dst, verify_checksums=False)
    for f in manifest.files():
        if f.file.endswith(".onnx"):
            model = onnx.load(str(src / f.file))  # with its external data
            onnx.save(model, str(dst / f.file))
    for spec in manifest.weights.values():
        (dst / spec.file).unlink()
    data = manifest.model_dump()
    data["weights"] = {}
    for v in data["variants"].values():
        for g in v.values():
            if isinstance(g, dict) and "file" in g:
                g["sha256"] = sha256_file(dst / g["file"])
    write_manifest(dst, Manifest.model_validate(data))
    return dst


@pytest.fixture(scope="module")
def old_layout(tiny_onnx_dir, tmp_path_factory) -> Path:
    return per_graph_copy(tiny_onnx_dir, tmp_path_factory.mktemp("per-graph") / "onnx")


def test_each_initializer_once_aligned(tiny_onnx_dir):
    manifest = load_manifest(tiny_onnx_dir)
    assert set(manifest.weights) == {"fp32", "int8", "fp16"}
    for precision, spec in manifest.weights.items():
        assert spec.file == weights_file(precision)
        blob = (tiny_onnx_dir / spec.file).read_bytes()
        ranges: dict[tuple[int, int], set[str]] = {}
        graphs = precision_graphs(manifest, precision)
        assert len(graphs) >= 2  # the portable graphs, and the fused ones of the CPU precisions
        for g in graphs:
            model = onnx.load(str(tiny_onnx_dir / g), load_external_data=False)
            inline = [t for t in model.graph.initializer if not uses_external_data(t)]
            assert all(len(onnx.numpy_helper.to_array(t).tobytes()) < INLINE_BYTES for t in inline), g
            tensors = external_tensors(tiny_onnx_dir / g)
            assert tensors, g
            for _, location, offset, length in tensors:
                assert location == spec.file
                assert offset % ALIGNMENT == 0 and offset + length <= len(blob)
                ranges.setdefault((offset, length), set()).add(g)
        digests = [hashlib.sha256(blob[o : o + n]).digest() for o, n in ranges]
        assert len(set(digests)) == len(digests), f"{precision}: bytes stored twice"
        assert any(len(gs) > 1 for gs in ranges.values()), f"{precision}: no initializer shared by two graphs"
        # Nothing in the file but the initializers and the alignment's padding.
        assert len(blob) < sum(n for _, n in ranges) + ALIGNMENT * len(ranges)


def test_old_layout_converted_gives_the_same_files(old_layout, tiny_onnx_dir, tmp_path):
    """The per-graph layout still loads its checksums, and converting it gives the export's files."""
    assert load_manifest(old_layout).weights == {}
    converted = convert(shutil.copytree(old_layout, tmp_path / "onnx"))
    assert converted.weights == load_manifest(tiny_onnx_dir).weights


@pytest.mark.parametrize("graph", ["portable", "fused"])
def test_translates_as_the_per_graph_layout(tiny_onnx_dir, old_layout, test_split, graph):
    sources = None
    outputs = []
    for d in (tiny_onnx_dir, old_layout):
        model = OnnxSeq2Seq(d, precision="fp32", graph=graph, intra_op_threads=1)
        assert model.graph == graph
        sources = sources or model.source_ids(test_split[0][:24])
        outputs.append([h.tokens for h in generate(model, sources, beam=2, batch_size=8)])
        outputs.append([h.tokens for h in generate(model, sources, beam=1, batch_size=8, want_scores=False)])
    assert outputs[:2] == outputs[2:]
    assert any(len(t) > 2 for t in outputs[0])


def test_ort_maps_the_weights_file(tiny_onnx_dir):
    """ONNX Runtime maps the aligned weights into memory rather than reading them into its heap."""
    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="portable", intra_op_threads=1)
    maps = Path("/proc/self/maps").read_text()
    assert str((tiny_onnx_dir / weights_file("fp32")).resolve()) in maps
    del model


def test_verify_catches_a_corrupted_weights_file(tiny_onnx_dir, tmp_path):
    d = Path(shutil.copytree(tiny_onnx_dir, tmp_path / "onnx"))
    path = d / weights_file("int8")
    data = bytearray(path.read_bytes())
    offset = external_tensors(d / load_manifest(d).variant("int8").decoder.file)[0][2]
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ManifestError, match="checksum mismatch for .*weights.int8.bin"):
        load_manifest(d)
    with pytest.raises(ManifestError, match="weights.int8.bin"):
        OnnxSeq2Seq(d, precision="int8", intra_op_threads=1)
    load_manifest(d, precision="fp32")  # the other precisions' files are intact
    (d / weights_file("fp32")).unlink()
    with pytest.raises(ManifestError, match="weights.fp32.bin is listed .* but missing"):
        load_manifest(d, precision="fp32")


def test_weights_file_names_in_contract(tiny_onnx_dir):
    files = {f.file for f in load_manifest(tiny_onnx_dir).files()}
    assert {weights_file(p) for p in ("fp32", "int8", "fp16")} <= files
    assert {p.name for p in tiny_onnx_dir.glob("weights.*")} == {weights_file(p) for p in ("fp32", "int8", "fp16")}
    assert np.all([not p.name.startswith(".") for p in tiny_onnx_dir.iterdir() if p.is_file()])
