"""Exports past protobuf's 2 GiB (`export.onnx_files`): with the external-data threshold lowered to
the tiny model's size, every step of the export writes its graph's weights as external data and
onnx.checker reads graphs from their files, and the export translates as the usual one does."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import onnx
import pytest
from onnx.external_data_helper import uses_external_data

from contract.manifest import load_manifest
from export import onnx_files
from export.to_onnx import export_model
from service.decoding.generator import generate
from service.runtime.onnx_model import OnnxSeq2Seq

pytestmark = pytest.mark.usefixtures("one_torch_thread")

THRESHOLD = 1 << 16  # the tiny model's graphs hold megabytes: each of them passes it


def inline_tensors(path: Path) -> dict[str, int]:
    """name -> bytes of each initializer that the graph at `path` holds in its own file."""
    model = onnx.load(str(path), load_external_data=False)
    return {t.name: t.ByteSize() for t in model.graph.initializer if not uses_external_data(t)}


@pytest.fixture(scope="module")
def large_export(tiny_model_dir, tmp_path_factory):
    """The tiny model exported (fp32, int8) as a model past the threshold is: its scratch dir kept,
    and the arguments of every onnx.checker call recorded. Returns (out, scratch, checked)."""
    root = tmp_path_factory.mktemp("large")
    scratch, checked = root / "scratch", []
    real_tmp, real_check = tempfile.TemporaryDirectory, onnx.checker.check_model

    def keep(*args, prefix=None, **kw):
        if prefix == ".export-":
            scratch.mkdir()
            return contextlib.nullcontext(str(scratch))
        return real_tmp(*args, prefix=prefix, **kw)

    def spy(model, *args, **kw):
        checked.append(model)
        return real_check(model, *args, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(onnx_files, "EXTERNAL_DATA_BYTES", THRESHOLD)
        mp.setattr(tempfile, "TemporaryDirectory", keep)
        mp.setattr(onnx.checker, "check_model", spy)
        export_model(tiny_model_dir, root / "onnx", ["fp32", "int8"])
    return root / "onnx", scratch, checked


def test_every_step_writes_external_data(large_export):
    """The raw graphs (torch export, then the search outputs added), the quantised graphs and the
    optimised and fused ones all keep their weights out of the .onnx file."""
    _, scratch, _ = large_export
    graphs = {p.name for p in scratch.glob("*.onnx")}
    assert {"encoder.raw.onnx", "decoder.raw.onnx", "encoder.int8.q.onnx", "decoder.int8.q.onnx"} <= graphs
    for name in graphs:
        inline = inline_tensors(scratch / name)
        assert all(n < onnx_files.EXTERNAL_MIN_BYTES * 2 for n in inline.values()), (name, inline)
        files = onnx_files.data_files(scratch / name)
        assert files and all(f.is_file() for f in files), name
        assert sum(f.stat().st_size for f in files) > THRESHOLD
    # The search outputs were added to the raw decoder step loaded without its weights.
    nodes = {n.name for n in onnx_files.load_graph(scratch / "decoder.raw.onnx").graph.node}
    assert {"search_top_k", "search_eos_log_prob"} <= nodes


def test_graphs_are_checked_from_their_files(large_export):
    _, _, checked = large_export
    assert len(checked) >= 10  # the raw, portable and fused graphs, each checked
    assert all(isinstance(m, str) for m in checked), [type(m).__name__ for m in checked]


def test_the_export_dir_holds_only_the_shared_layout(large_export, tiny_onnx_dir):
    out, _, _ = large_export
    assert not list(out.glob("*.data"))
    manifest = load_manifest(out)  # checksums verified
    for f in manifest.files():
        if f.file.endswith(".onnx"):
            assert all(n < 4096 for n in inline_tensors(out / f.file).values()), f.file
            assert {p.name for p in onnx_files.data_files(out / f.file)} <= {s.file for s in manifest.weights.values()}


@pytest.mark.parametrize(
    "precision,graph", [("fp32", "portable"), ("fp32", "fused"), ("int8", "portable"), ("int8", "fused")]
)
def test_translates_as_the_usual_export(large_export, tiny_onnx_dir, test_split, precision, graph):
    out, _, _ = large_export
    outputs = []
    sources = None
    for d in (tiny_onnx_dir, out):
        model = OnnxSeq2Seq(d, precision=precision, graph=graph, intra_op_threads=1)
        sources = sources or model.source_ids(test_split[0][:24])
        outputs.append([h.tokens for h in generate(model, sources, beam=2, batch_size=8)])
        outputs.append([h.tokens for h in generate(model, sources, beam=1, batch_size=8, want_scores=False)])
    assert outputs[:2] == outputs[2:]
    assert any(len(t) > 2 for t in outputs[0])
