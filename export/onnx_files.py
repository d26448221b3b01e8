"""The ONNX files an export writes on its way to the shipped graphs, kept under protobuf's 2 GiB.

A protobuf message cannot pass 2 GiB, and a model of NLLB-600M's size holds more than that in one
fp32 graph (its decoder step: the token table and the output projection, 1 GB each, and the
layers). So every step of an export handles a graph by path: a graph whose tensors reach
`EXTERNAL_DATA_BYTES` is written with its tensors of `EXTERNAL_MIN_BYTES` or more as ONNX external
data, in one file beside it (`data_location`: the graph's file name + ".data"); graphs are checked
by path (`check`: onnx.checker reads the file, the weights stay out of the message); graph edits
load the graph without its external data (`load_graph`); ONNX Runtime's optimised graphs
(`ort_external_data`) and the quantiser's write external data the same way; and a graph moves with
its data files (`move`). `export.shared_weights` then gathers every graph's large tensors into the
precision's shared weights file (`contract.weights`), so a shipped graph holds no weights of its own
whatever its size.

Small graphs (the toy models, OPUS-MT's size) stay in one file each until that last pass.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnxruntime as ort
from onnx import TensorProto

# A graph whose tensors hold this many bytes or more is written with external data: half of
# protobuf's 2 GiB, leaving room for the graph's nodes and the tensors a later step adds.
EXTERNAL_DATA_BYTES = 1 << 30
# ... and its tensors of this many bytes or more go to the data file (smaller ones stay inline).
EXTERNAL_MIN_BYTES = 1024


def data_location(path: Path) -> str:
    """The external data file of the graph at `path`, relative to its directory: decoder.raw.onnx.data."""
    return path.name + ".data"


def _tensors(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """The graph's initializers and the tensors of its nodes' attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _tensors(sub)


def tensor_bytes(model: onnx.ModelProto) -> int:
    """The bytes the tensors of `model` hold in the message (external data excluded)."""
    return sum(t.ByteSize() for t in _tensors(model.graph) if t.data_location != TensorProto.EXTERNAL)


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The external data files the tensors of `model` name, each once, in order."""
    files: dict[str, None] = {}
    for t in _tensors(model.graph):
        if t.data_location == TensorProto.EXTERNAL:
            files.update({e.value: None for e in t.external_data if e.key == "location"})
    return list(files)


def load_graph(path: Path) -> onnx.ModelProto:
    """The graph at `path` without its external data (the tensors stored inline are there)."""
    return onnx.load(str(path), load_external_data=False)


def data_files(path: Path) -> list[Path]:
    """The external data files the graph at `path` refers to."""
    return [path.parent / location for location in external_locations(load_graph(path))]


def file_bytes(path: Path) -> int:
    """The bytes of the graph at `path` on disk, its external data files included."""
    return path.stat().st_size + sum(f.stat().st_size for f in data_files(path))


def is_large(path: Path) -> bool:
    """Whether the graph at `path` (with its data files) reaches EXTERNAL_DATA_BYTES: the steps that
    derive a graph from it write theirs with external data."""
    return file_bytes(path) >= EXTERNAL_DATA_BYTES


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write `model` to `path`, its large tensors as external data in `data_location(path)` when its
    tensors reach EXTERNAL_DATA_BYTES (the tensors of `model` then name that file and hold no data).
    Tensors already external keep their files, which must lie in `path`'s directory; a graph loaded
    without its data (`load_graph`) is saved in place with the tensors added inline."""
    stale = path.parent / data_location(path)
    if stale.name in external_locations(model):  # a graph loaded without its data, saved in place
        onnx.save_model(model, str(path))
        return
    stale.unlink(missing_ok=True)  # onnx appends to an existing data file
    if tensor_bytes(model) >= EXTERNAL_DATA_BYTES:
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=stale.name,
            size_threshold=EXTERNAL_MIN_BYTES,
            convert_attribute=True,
        )
    else:
        onnx.save_model(model, str(path))


def check(path: Path, full_check: bool = False) -> None:
    """onnx.checker on the graph at `path`, read from the file: the check never serialises the
    graph's weights into one message."""
    onnx.checker.check_model(str(path), full_check=full_check)


def ort_external_data(so: ort.SessionOptions, dst: Path) -> None:
    """Have the session that writes its optimised graph to `dst` (`optimized_model_filepath`) store
    the graph's tensors of EXTERNAL_MIN_BYTES or more in `data_location(dst)`."""
    (dst.parent / data_location(dst)).unlink(missing_ok=True)
    so.add_session_config_entry("session.optimized_model_external_initializers_file_name", data_location(dst))
    so.add_session_config_entry(
        "session.optimized_model_external_initializers_min_size_in_bytes", str(EXTERNAL_MIN_BYTES)
    )


def move(path: Path, directory: Path) -> Path:
    """Move the graph at `path` and its external data files into `directory` (same file system;
    their relative locations stay valid) and return its new path."""
    for f in data_files(path):
        os.replace(f, directory / f.name)
    return path.replace(directory / path.name)


def remove(path: Path) -> None:
    """Remove the graph at `path` and its external data files."""
    if path.exists():
        for f in data_files(path):
            f.unlink(missing_ok=True)
        path.unlink()
