"""The last pass of an export: every graph of a precision rewritten to refer to one shared weights
file (`contract.weights`), each large initializer stored once however many graphs hold it.

Graph by graph, each initializer of `INLINE_BYTES` or more is hashed; bytes not yet in the
precision's weights file are appended at the next multiple of `ALIGNMENT` (ONNX Runtime maps
aligned external data into memory), and the initializer becomes external data naming that offset
and length. A graph that refers to the weights file of an earlier export (a variant kept from it)
is read with its data first: the new file is written beside the old one and both the graphs and
the file take their places only once every graph of the precision is written. A graph that the
export wrote with external data of its own (`export.onnx_files`: a model past 1 GiB) is read the
same way, and its own data file removed once the graph names the shared file instead.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
from pathlib import Path
from typing import BinaryIO

import onnx
from onnx import TensorProto, numpy_helper

from contract.manifest import (
    PRECISIONS,
    FileSpec,
    GraphSpec,
    Manifest,
    Variant,
    load_manifest,
    resolve_onnx_dir,
    sha256_file,
    write_manifest,
)
from contract.weights import ALIGNMENT, INLINE_BYTES, weights_file
from export import onnx_files

log = logging.getLogger("mtserve.export")


class _WeightsWriter:
    """Appends distinct byte strings to one file at aligned offsets; identical bytes go in once."""

    def __init__(self, f: BinaryIO, alignment: int = ALIGNMENT):
        self.f, self.alignment, self.end = f, alignment, 0
        self.offsets: dict[bytes, int] = {}  # sha256 digest -> offset
        self.stored = self.shared = 0  # initializers written, and those that found their bytes there

    def add(self, data: bytes) -> int:
        digest = hashlib.sha256(data).digest()
        offset = self.offsets.get(digest)
        if offset is not None:
            self.shared += 1
            return offset
        offset = -(-self.end // self.alignment) * self.alignment
        if offset > self.end:
            self.f.write(b"\0" * (offset - self.end))
        self.f.write(data)
        self.end = offset + len(data)
        self.offsets[digest] = offset
        self.stored += 1
        return offset


def _tensor_bytes(t: TensorProto) -> bytes | None:
    """The raw little-endian bytes of an initializer as external data holds them; None for a
    tensor that stays inline (strings)."""
    if t.data_type == TensorProto.STRING:
        return None
    if t.HasField("raw_data"):
        return t.raw_data
    return numpy_helper.to_array(t).tobytes()


def _externalize(model: onnx.ModelProto, writer: _WeightsWriter, location: str) -> None:
    for t in model.graph.initializer:
        data = _tensor_bytes(t)
        if data is None or len(data) < INLINE_BYTES:
            continue
        offset = writer.add(data)
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            t.ClearField(field)
        del t.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(data)))):
            entry = t.external_data.add()
            entry.key, entry.value = key, value
        t.data_location = TensorProto.EXTERNAL


def precision_graphs(manifest: Manifest, precision: str) -> list[str]:
    """The graph files of every variant of `precision`, each once, in the manifest's order."""
    files: dict[str, None] = {}
    for v in manifest.variants.values():
        if v.precision == precision:
            for g in (v.encoder, *v.decoder_steps().values(), *v.shortlist_steps.values()):
                files[g.file] = None
    return list(files)


def _write_precision(out: Path, files: list[str], precision: str, alignment: int) -> None:
    """Rewrite `files` (graphs in `out`) to share weights_file(precision); replaces them in place."""
    location = weights_file(precision)
    tmp_weights = out / f".{location}.tmp"
    written: list[tuple[Path, Path]] = []
    own_data: set[Path] = set()  # the graphs' own external data files (`export.onnx_files`), dropped after
    shared = {weights_file(p) for p in PRECISIONS}
    try:
        with open(tmp_weights, "wb") as f:
            writer = _WeightsWriter(f, alignment)
            for name in files:
                own_data.update(f for f in onnx_files.data_files(out / name) if f.name not in shared)
                model = onnx.load(str(out / name), load_external_data=True)  # an earlier shared file too
                _externalize(model, writer, location)
                tmp = out / f".{name}.tmp"
                tmp.write_bytes(model.SerializeToString())
                written.append((tmp, out / name))
                del model
        for tmp, final in written:
            tmp.replace(final)
        tmp_weights.replace(out / location)
        for data in own_data:
            data.unlink(missing_ok=True)
    finally:
        tmp_weights.unlink(missing_ok=True)
        for tmp, _ in written:
            tmp.unlink(missing_ok=True)
    log.info(
        "%s: %d graphs share %s (%.1f MiB; %d initializers stored, %d found there already)",
        precision,
        len(files),
        location,
        (out / location).stat().st_size / 2**20,
        writer.stored,
        writer.shared,
    )


def _rehashed(out: Path, v: Variant) -> Variant:
    def spec(g: GraphSpec) -> GraphSpec:
        return g.model_copy(update={"sha256": sha256_file(out / g.file)})

    update: dict[str, object] = {f: spec(g) for f, g in v.decoder_steps().items()}
    update["encoder"] = spec(v.encoder)
    update["shortlist_steps"] = {f: spec(g) for f, g in v.shortlist_steps.items()}
    return v.model_copy(update=update)


def share_weights(out: Path, manifest: Manifest, alignment: int = ALIGNMENT) -> Manifest:
    """Rewrite the graphs in `out` that `manifest` lists so that those of each precision share one
    weights file, and return the manifest with their new checksums and the weights files."""
    weights: dict[str, FileSpec] = {}
    for precision in dict.fromkeys(v.precision for v in manifest.variants.values()):
        _write_precision(out, precision_graphs(manifest, precision), precision, alignment)
        location = weights_file(precision)
        weights[precision] = FileSpec(file=location, sha256=sha256_file(out / location))
    variants = {k: _rehashed(out, v) for k, v in manifest.variants.items()}
    return manifest.model_copy(update={"variants": variants, "weights": weights})


def convert(onnx_dir: Path) -> Manifest:
    """Rewrite an existing export dir (graphs holding their own weights, or shared already) to the
    shared layout, and write its manifest."""
    manifest = load_manifest(onnx_dir, verify_checksums=True)
    manifest = share_weights(onnx_dir, manifest)
    write_manifest(onnx_dir, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        "python -m export.shared_weights", description="rewrite an export dir to share each precision's weights"
    )
    p.add_argument("onnx_dir", type=Path)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    manifest = convert(resolve_onnx_dir(args.onnx_dir))
    for precision, spec in manifest.weights.items():
        print(f"{precision}: {spec.file}")


if __name__ == "__main__":
    main()
