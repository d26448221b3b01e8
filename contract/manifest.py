"""`manifest.json` of an ONNX export dir (written by `mtserve export`, read by the serving path).

One manifest per export dir lists every exported precision ("variant") side by side:

    onnx/
      manifest.json
      tokenizer.json                     copied from the model dir: the dir is self-contained
      encoder.fp32.onnx  decoder.fp32.onnx
      encoder.int8.onnx  decoder.int8.onnx
      encoder.fp16.onnx  decoder.fp16.onnx

The manifest records everything the serving path needs without torch or the model dir: the model's
dims and special ids, generation defaults, each graph's input/output contract (names, dtypes and
shapes with symbolic axis names), and the SHA-256 of every file, checked on load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MANIFEST = "manifest.json"
# 2: the decoder step takes top_k and returns the search outputs and the present cache;
# 3: the decoder step takes the cross-attention keys/values and src_mask once per sentence
#    (its beams are consecutive rows), not once per row
FORMAT_VERSION = 3
Precision = Literal["fp32", "int8", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "int8", "fp16")


class ManifestError(ValueError):
    """A missing, malformed or inconsistent export dir (bad checksum, missing variant...)."""


class ExportMissing(ManifestError, FileNotFoundError):
    """No export at all where one was expected: run `mtserve export`."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Model):
    name: str
    dtype: Literal["int64", "float32", "float16"]
    shape: list[int | str]  # a str is a symbolic axis: batch, src_len, past_len


class FileSpec(_Model):
    file: str  # relative to the export dir
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")


class GraphSpec(FileSpec):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def input(self, name: str) -> TensorSpec:
        return next(t for t in self.inputs if t.name == name)

    def output(self, name: str) -> TensorSpec:
        return next(t for t in self.outputs if t.name == name)


class SpecialIds(_Model):
    pad_id: int
    bos_id: int
    eos_id: int
    unk_id: int


class Dims(_Model):
    vocab_size: int
    d_model: int
    n_heads: int
    d_k: int
    n_encoder_layers: int
    n_decoder_layers: int
    max_positions: int

    @model_validator(mode="after")
    def _heads(self) -> Dims:
        if self.n_heads * self.d_k != self.d_model:
            raise ValueError(f"n_heads * d_k ({self.n_heads} * {self.d_k}) != d_model ({self.d_model})")
        return self


class GenerationDefaults(_Model):
    max_len_a: float = 1.5
    max_len_b: int = 10
    length_penalty: float = 1.0
    beam: int = Field(4, ge=1)


class Variant(_Model):
    precision: Precision
    opset: int = Field(ge=17)
    exporter: str  # e.g. "torch.onnx.export(dynamo=True)"
    optimization: str  # the ORT optimisation level baked into the shipped graphs
    target: str  # the execution provider the variant is meant for: "cpu" or "cuda"
    io_dtype: Literal["float32"] = "float32"  # float inputs/outputs stay fp32 for every precision
    notes: str = ""
    parity: dict[str, float] = {}  # max abs diff vs PyTorch measured at export time
    encoder: GraphSpec
    decoder: GraphSpec


class Manifest(_Model):
    format_version: Literal[3] = FORMAT_VERSION
    name: str  # model name, e.g. "de-en"
    version: str  # model version: config.json's "version", else the weights' hash prefix
    src_lang: str
    tgt_lang: str
    source_weights_sha256: str  # model.safetensors the graphs were exported from
    special_ids: SpecialIds
    dims: Dims
    generation: GenerationDefaults = GenerationDefaults()
    tokenizer: FileSpec
    tool_versions: dict[str, str]
    opset: int = Field(ge=17)  # of every variant
    variants: dict[Precision, Variant]

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        for key, v in self.variants.items():
            if v.precision != key:
                raise ValueError(f"variant {key!r} says precision {v.precision!r}")
            if v.opset != self.opset:
                raise ValueError(f"variant {key!r} has opset {v.opset}, the manifest {self.opset}")
        return self

    def variant(self, precision: str) -> Variant:
        if precision not in self.variants:
            have = ", ".join(sorted(self.variants)) or "none"
            raise ExportMissing(
                f"precision {precision!r} was not exported (have: {have}); run `mtserve export --precision {precision}`"
            )
        return self.variants[precision]

    def files(self, precision: str | None = None) -> list[FileSpec]:
        variants = self.variants.values() if precision is None else [self.variant(precision)]
        return [self.tokenizer] + [g for v in variants for g in (v.encoder, v.decoder)]

    def checksums(self, precision: str | None = None) -> dict[str, str]:
        """{file name: sha256} of the tokenizer and the graphs (of `precision` only, when given)."""
        return {f.file: f.sha256 for f in self.files(precision)}


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def resolve_onnx_dir(path: str | Path) -> Path:
    """An export dir itself, or a model dir whose `onnx/` subdir holds the export."""
    p = Path(path)
    if (p / MANIFEST).is_file():
        return p
    if (p / "onnx" / MANIFEST).is_file():
        return p / "onnx"
    model_dir = p.parent if p.name == "onnx" else p
    raise ExportMissing(
        f"no ONNX export in {p} (no {MANIFEST} there or in {p / 'onnx'}); "
        f"run `mtserve export --model {model_dir}` first"
    )


def load_manifest(onnx_dir: str | Path, verify_checksums: bool = True, precision: str | None = None) -> Manifest:
    """Read and validate `onnx_dir/manifest.json` (a model dir with an `onnx/` subdir works too).
    With `verify_checksums`, every listed file (only the tokenizer and `precision`'s graphs when
    given) must exist and match its SHA-256. Raises ManifestError with the reason."""
    d = resolve_onnx_dir(onnx_dir)
    try:
        manifest = Manifest.model_validate_json((d / MANIFEST).read_text(encoding="utf-8"))
    except ValidationError as e:
        found = next((err["input"] for err in e.errors() if err["loc"] == ("format_version",)), None)
        if isinstance(found, int):
            # Graphs of another contract would fail every request: say what to do about it.
            model_dir = d.parent if d.name == "onnx" else d
            raise ManifestError(
                f"{d} holds graphs of format_version {found}; this version reads {FORMAT_VERSION}: "
                f"export again with `mtserve export --model {model_dir} --out {d}` "
                f"(`make serve` does it for the shipped model)"
            ) from e
        raise ManifestError(f"{d / MANIFEST} is not a valid manifest:\n{e}") from e
    if precision is not None:
        manifest.variant(precision)
    if verify_checksums:
        for spec in manifest.files(precision):
            path = d / spec.file
            if not path.is_file():
                raise ManifestError(f"{path} is listed in {d / MANIFEST} but missing")
            got = sha256_file(path)
            if got != spec.sha256:
                raise ManifestError(
                    f"checksum mismatch for {path}: manifest says {spec.sha256}, file has {got}; "
                    f"the export dir is corrupt or was modified - re-run `mtserve export`"
                )
    return manifest


def write_manifest(onnx_dir: str | Path, manifest: Manifest) -> Path:
    path = Path(onnx_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
