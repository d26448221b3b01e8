"""`manifest.json` of an ONNX export dir (written by `mtserve export`, read by the serving path).

One manifest per export dir lists every exported precision ("variant") side by side:

    onnx/
      manifest.json
      tokenizer.json                     copied from the model dir: the dir is self-contained
                                         (imported models: their SentencePiece models and
                                         vocabularies instead, `SentencePieceSpec`)
      encoder.fp32.onnx  decoder.fp32.onnx
      encoder.int8.onnx  decoder.int8.onnx
      encoder.fp16.onnx  decoder.fp16.onnx
      encoder.fused.fp32.onnx  decoder.fused.fp32.onnx   (and the decoder step's one-row and
      encoder.fused.int8.onnx  decoder.fused.int8.onnx    unscored twins)
      shortlist.npz  decoder.fused.*.shortlist.onnx       (only where `mtserve shortlist` made a
                                                          vocabulary shortlist: `contract.shortlist`)
      weights.fp32.bin  weights.int8.bin  weights.fp16.bin  the large initializers of each
                                                          precision's graphs, each once
                                                          (`contract.weights`)

Each precision has the portable graphs (the torch export, any execution provider) and, for the
CPU precisions, fused graphs (`export/fused/`, ONNX Runtime's contrib operators; the decoder
step with an in-place cache). A variant's key is its precision for the portable graphs and
`PRECISION-fused` for the fused one. Exports of format 4 made before the fused encoder list the
portable encoder in their fused variants; they serve as they are.

The manifest records everything the serving path needs without torch or the model dir: the model's
dims and special ids, its languages (and their tokens, for multilingual models), generation defaults, each graph's input/output contract (names, dtypes and
shapes with symbolic axis names), and the SHA-256 of every file (the shared weights files
included), checked on load.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MANIFEST = "manifest.json"
# 2: the decoder step takes top_k and returns the search outputs and the present cache;
# 3: the decoder step takes the cross-attention keys/values and src_mask once per sentence
#    (its beams are consecutive rows), not once per row;
# 4: variants name their decoder graph (portable or fused); fused variants beside the portable ones;
# 5: SentencePiece tokenizers (imported models), languages with their tokens, decoder_start_id
FORMAT_VERSION: Final = 5  # Final: mypy reads it as Literal[5], the type of Manifest.format_version
Precision = Literal["fp32", "int8", "fp16"]
PRECISIONS: tuple[str, ...] = ("fp32", "int8", "fp16")
Graph = Literal["portable", "fused"]
GRAPHS: tuple[str, ...] = ("portable", "fused")


def variant_key(precision: str, graph: str = "portable") -> str:
    """The manifest's key of a variant: "int8" for the portable graphs, "int8-fused" for the fused."""
    return precision if graph == "portable" else f"{precision}-{graph}"


class ManifestError(ValueError):
    """A missing, malformed or inconsistent export dir (bad checksum, missing variant...)."""


class ExportMissing(ManifestError, FileNotFoundError):
    """No export at all where one was expected: run `mtserve export`."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Model):
    name: str
    dtype: Literal["int64", "int32", "float32", "float16"]
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
    decoder_start_id: int | None = None  # the first decoder input token; None: bos_id

    @property
    def start_id(self) -> int:
        return self.bos_id if self.decoder_start_id is None else self.decoder_start_id


class SentencePieceSpec(_Model):
    """The tokenizer of an imported model: SentencePiece models give pieces, the JSON vocabularies
    ({piece: id}) give their ids (a piece not in the vocabulary: unk_id). Decoding maps ids to pieces
    with the target vocabulary and joins them with the target model's decode_pieces, dropping the
    special and language tokens. A shared model or vocabulary is the same file twice."""

    source_model: FileSpec
    target_model: FileSpec
    source_vocab: FileSpec
    target_vocab: FileSpec
    # The model's ids (0 to dims.vocab_size) that no target vocabulary entry names (M2M100's made-up
    # words, a padded vocabulary), as the import found them; None: not recorded. The server computes
    # them from the vocabularies at load, and a record must agree (service.runtime.tokenizer).
    unmapped_ids: list[int] | None = None

    def files(self) -> list[FileSpec]:
        return list(
            {f.file: f for f in (self.source_model, self.target_model, self.source_vocab, self.target_vocab)}.values()
        )


class LanguageSpec(_Model):
    """The languages a model translates from and into. A multilingual model puts
    `source_tokens[lang]` first on the source (before the text's ids; the source still ends with
    </s>) and forces `target_tokens[lang]` as the first generated token, after the decoder start
    token; that token is not part of the output text. Single-pair models have no tokens."""

    source: list[str]
    target: list[str]
    source_tokens: dict[str, int] = {}
    target_tokens: dict[str, int] = {}

    @model_validator(mode="after")
    def _tokens(self) -> LanguageSpec:
        for side, langs, tokens in (
            ("source", self.source, self.source_tokens),
            ("target", self.target, self.target_tokens),
        ):
            if tokens and set(tokens) != set(langs):
                raise ValueError(f"languages.{side}_tokens must name exactly the {side} languages {langs}")
        return self


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
    beam: int = Field(default=4, ge=1)  # default= by keyword: type checkers see only that as a default


# The decoder-step fields of a variant, in order.
STEP_FIELDS = ("decoder", "decoder_one_row", "decoder_unscored", "decoder_one_row_unscored")


class Variant(_Model):
    precision: Precision
    graph: Graph = "portable"  # the decoder step: the torch export, or the fused contrib-operator graph
    opset: int = Field(ge=17)
    exporter: str  # e.g. "torch.onnx.export(dynamo=True)"
    optimization: str  # the ORT optimisation level baked into the shipped graphs
    target: str  # the execution provider the variant is meant for: "cpu" or "cuda"
    io_dtype: Literal["float32"] = "float32"  # float inputs/outputs stay fp32 for every precision
    notes: str = ""
    parity: dict[str, float] = {}  # max abs diff vs PyTorch measured at export time
    encoder: GraphSpec
    decoder: GraphSpec
    # The fused step again with MatMulNBits (8 bits), for batches of one row: faster there than
    # DynamicQuantizeMatMul, slower from 4 rows on (docs/performance.md). Same contract as `decoder`.
    decoder_one_row: GraphSpec | None = None
    # The same steps ending with the argmax of the logits, without log-probabilities
    # (`contract.graphs.fused_decoder_io(scored=False)`): greedy search when no sentence of the
    # batch asks for its score. Exports before them lack them; the scored steps then run.
    decoder_unscored: GraphSpec | None = None
    decoder_one_row_unscored: GraphSpec | None = None
    # The same steps over a vocabulary shortlist (`contract.shortlist`), by the field names above:
    # only where the version has a shortlist (`Manifest.shortlist`), which they then run instead.
    shortlist_steps: dict[str, GraphSpec] = {}

    def decoder_steps(self) -> dict[str, GraphSpec]:
        """Every decoder-step graph the variant has, by field name, in the order of the fields above."""
        return {f: getattr(self, f) for f in STEP_FIELDS if getattr(self, f) is not None}

    @model_validator(mode="after")
    def _shortlist_steps(self) -> Variant:
        if set(self.shortlist_steps) - set(self.decoder_steps()):
            raise ValueError(f"shortlist_steps name steps the variant lacks: {sorted(self.shortlist_steps)}")
        return self


class ShortlistSpec(FileSpec):
    """The version's vocabulary shortlist (`contract.shortlist`): its .npz file, and how it was made."""

    per_source: int = Field(ge=1)  # target tokens kept per source token, at most
    always: int = Field(ge=0)  # most frequent target tokens every batch ranks
    derived_from: Literal["parallel", "monolingual"]
    pairs: int = Field(ge=0)  # sentence pairs it was derived from
    # Its steps give -inf to the padding's repeats of a candidate (`Shortlist.batch_ids`); steps
    # built before they did are not served (the plain steps run) until `mtserve shortlist` runs again.
    masks_repeats: bool = False


class Manifest(_Model):
    format_version: Literal[5] = FORMAT_VERSION
    name: str  # model name, e.g. "de-en"
    version: str  # model version: config.json's "version", else the weights' hash prefix
    src_lang: str
    tgt_lang: str
    languages: LanguageSpec  # every language pair the model serves; src_lang/tgt_lang its default
    source_weights_sha256: str  # model.safetensors the graphs were exported from
    special_ids: SpecialIds
    dims: Dims
    generation: GenerationDefaults = GenerationDefaults()
    tokenizer: FileSpec | None = None  # tokenizer.json of mtserve's own models ...
    sentencepiece: SentencePieceSpec | None = None  # ... or the SentencePiece files of an imported one
    shortlist: ShortlistSpec | None = None  # `mtserve shortlist`; its steps in `Variant.shortlist_steps`
    tool_versions: dict[str, str]
    opset: int = Field(ge=17)  # of every variant
    variants: dict[str, Variant]  # by variant_key
    # The weights the graphs of each precision share (`contract.weights`), by precision; none in
    # exports whose graphs hold their own weights.
    weights: dict[str, FileSpec] = {}

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if (self.tokenizer is None) == (self.sentencepiece is None):
            raise ValueError("exactly one of tokenizer and sentencepiece must be set")
        if self.src_lang not in self.languages.source or self.tgt_lang not in self.languages.target:
            raise ValueError(f"src_lang/tgt_lang ({self.src_lang}/{self.tgt_lang}) are not among the languages")
        for key, v in self.variants.items():
            if v.shortlist_steps and self.shortlist is None:
                raise ValueError(f"variant {key!r} has shortlist steps but the manifest no shortlist")
            if variant_key(v.precision, v.graph) != key:
                raise ValueError(f"variant {key!r} says precision {v.precision!r} and graph {v.graph!r}")
            if v.opset != self.opset:
                raise ValueError(f"variant {key!r} has opset {v.opset}, the manifest {self.opset}")
        return self

    def variant(self, precision: str, graph: str = "portable") -> Variant:
        key = variant_key(precision, graph)
        if key not in self.variants:
            have = ", ".join(sorted(self.variants)) or "none"
            raise ExportMissing(
                f"variant {key!r} was not exported (have: {have}); run `mtserve export --precision {precision}`"
            )
        return self.variants[key]

    def has(self, precision: str, graph: str = "portable") -> bool:
        return variant_key(precision, graph) in self.variants

    def of_precision(self, precision: str) -> list[Variant]:
        """The variants of `precision` (its portable and fused graphs, those exported); ExportMissing
        naming the portable one when there is none."""
        found = [v for v in self.variants.values() if v.precision == precision]
        return found or [self.variant(precision)]

    def files(self, precision: str | None = None, graph: str | None = "portable") -> list[FileSpec]:
        """The files of every variant, of `precision`'s `graph`, or of all of `precision`'s
        variants (`graph` None), with the tokenizer's, the shortlist and the shared weights."""
        if precision is None:
            variants = list(self.variants.values())
        else:
            variants = self.of_precision(precision) if graph is None else [self.variant(precision, graph)]
        graphs = [g for v in variants for g in (v.encoder, *v.decoder_steps().values(), *v.shortlist_steps.values())]
        unique = {g.file: g for g in graphs}  # older fused variants share the portable encoder
        shortlist = [self.shortlist] if self.shortlist is not None else []
        precisions = dict.fromkeys(v.precision for v in variants)
        weights = [self.weights[p] for p in precisions if p in self.weights]
        return [*self.tokenizer_files(), *shortlist, *weights, *unique.values()]

    def tokenizer_files(self) -> list[FileSpec]:
        """tokenizer.json, or the SentencePiece models and vocabularies (each file once)."""
        if self.tokenizer is not None:
            return [self.tokenizer]
        assert self.sentencepiece is not None  # the validator sets exactly one of them
        return self.sentencepiece.files()

    def checksums(self, precision: str | None = None, graph: str | None = "portable") -> dict[str, str]:
        """{file name: sha256} of the tokenizer and the graphs (of one variant only, when given)."""
        return {f.file: f.sha256 for f in self.files(precision, graph)}


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


def load_manifest(
    onnx_dir: str | Path, verify_checksums: bool = True, precision: str | None = None, graph: str | None = None
) -> Manifest:
    """Read and validate `onnx_dir/manifest.json` (a model dir with an `onnx/` subdir works too).
    A `precision` must have been exported: its `graph`, or with `graph` None any of its graphs (an
    import writes only the fused one of int8 by default). With `verify_checksums`, every listed
    file (only the tokenizer and those graphs when a precision is given) must exist and match its
    SHA-256. Raises ManifestError with the reason."""
    d = resolve_onnx_dir(onnx_dir)
    try:
        manifest = Manifest.model_validate_json((d / MANIFEST).read_text(encoding="utf-8"))
    except ValidationError as e:
        found = next((err["input"] for err in e.errors() if err["loc"] == ("format_version",)), None)
        if isinstance(found, int) and found > FORMAT_VERSION:
            raise ManifestError(
                f"{d} holds an export of format_version {found}, newer than this server reads ({FORMAT_VERSION}): "
                "upgrade mtserve to serve it"
            ) from e
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
        if graph is None:
            manifest.of_precision(precision)
        else:
            manifest.variant(precision, graph)
    if verify_checksums:
        verify_files(d, manifest, precision, graph)
    return manifest


def verify_files(onnx_dir: Path, manifest: Manifest, precision: str | None = None, graph: str | None = None) -> None:
    """Every file the manifest lists (only the tokenizer and one variant's graphs when `precision`
    is given) exists in `onnx_dir` and matches its SHA-256; ManifestError otherwise."""
    for spec in manifest.files(precision, graph):
        path = onnx_dir / spec.file
        if not path.is_file():
            raise ManifestError(f"{path} is listed in {onnx_dir / MANIFEST} but missing")
        got = sha256_file(path)
        if got != spec.sha256:
            raise ManifestError(
                f"checksum mismatch for {path}: manifest says {spec.sha256}, file has {got}; "
                f"the export dir is corrupt or was modified - re-run `mtserve export`"
            )


def write_manifest(onnx_dir: str | Path, manifest: Manifest) -> Path:
    path = Path(onnx_dir) / MANIFEST
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(manifest.model_dump_json(indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
