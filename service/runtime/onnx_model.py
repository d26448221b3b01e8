"""The exported model behind ONNX Runtime: manifest, tokenizer and the two sessions (no torch).

`OnnxSeq2Seq.encode` runs the encoder graph once per source batch. The decoder step is one of two
graphs (`graph`): the portable one, which `OnnxSeq2Seq.step` runs with an explicit key/value cache
that it returns grown by a step; or the fused one (export/fused/), which updates a preallocated
cache in place and runs through `bind_step`: the caller binds its buffers once per batch and
writes into them between steps. Numpy in, numpy out; every float tensor is
float32 whatever the precision of the graphs (the fp16 graphs cast at their boundaries)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnxruntime as ort

from contract.graphs import (
    EOS_BIAS,
    LOG_PROBS,
    PAST_MASK,
    POSITIONS,
    SRC_IDS,
    SRC_MASK,
    TOKENS,
    TOP_K,
    cross_key,
    cross_value,
    past_key,
    past_value,
)
from contract.manifest import GRAPHS, GraphSpec, Manifest, Variant, load_manifest, resolve_onnx_dir, verify_files
from contract.shortlist import Shortlist
from service.runtime.tokenizer import TextTokenizer, load_tokenizer

log = logging.getLogger("mtserve.onnx")

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def choose_provider(provider: str, strict: bool = False) -> str:
    """ "cpu", "cuda" or "auto" -> the provider actually used ("cpu" or "cuda"). CUDA asked for but
    not available: CPU with a warning, or RuntimeError when `strict`."""
    if provider not in ("cpu", "cuda", "auto"):
        raise ValueError(f"unknown provider {provider!r}; choose cpu, cuda or auto")
    has_cuda = PROVIDERS["cuda"] in ort.get_available_providers()
    if provider == "auto":
        return "cuda" if has_cuda else "cpu"
    if provider == "cuda" and not has_cuda:
        msg = (
            f"CUDA execution provider requested but not available in this onnxruntime "
            f"(available: {', '.join(ort.get_available_providers())})"
        )
        if strict:
            raise RuntimeError(msg)
        log.warning("%s; falling back to the CPU", msg)
        return "cpu"
    return provider


def choose_graph(manifest: Manifest, precision: str, provider: str, graph: str = "auto") -> str:
    """The decoder step to run: "fused" or "portable" as asked, or with "auto" the fused graph where
    the export has it for this precision and provider (the CPU), else the portable one."""
    if graph not in ("auto", *GRAPHS):
        raise ValueError(f"unknown graph {graph!r}; choose auto, portable or fused")
    if graph == "auto":
        fused = manifest.has(precision, "fused") and manifest.variant(precision, "fused").target == provider
        return "fused" if fused else "portable"
    manifest.variant(precision, graph)  # ExportMissing when it was not exported
    return graph


def uses_shortlist(manifest: Manifest, precision: str, graph: str, enabled: bool = True) -> bool:
    """Whether the decoder steps rank over the version's vocabulary shortlist (`contract.shortlist`):
    where it has one, for this variant's fused steps, and the per-model setting leaves it on."""
    if not enabled or graph != "fused" or manifest.shortlist is None or not manifest.has(precision, graph):
        return False
    return bool(manifest.variant(precision, graph).shortlist_steps)


# ONNX Runtime's option that makes a run give its CPU arena's unused regions back when it ends.
_ARENA_SHRINKAGE = ("memory.enable_memory_arena_shrinkage", "cpu:0")


# The OrtValues over a cache's buffers, by the buffer's id, each with its buffer (which keeps the
# id from being reused while the entry lives): the bindings of one cache share them.
OrtValues = dict[int, tuple[np.ndarray, ort.OrtValue]]


class BoundStep:
    """A decoder session with its inputs and outputs bound to numpy buffers (IO binding): `run()`
    reads the inputs' current contents and writes the outputs in place, nothing copied. `values`:
    OrtValues made for these buffers by other bindings, taken from and added to (making one is
    most of what binding a buffer costs)."""

    def __init__(
        self,
        session: ort.InferenceSession,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        values: OrtValues | None = None,
        model: OnnxSeq2Seq | None = None,
    ):
        self.session, self.io = session, session.io_binding()
        self.model = model  # whose `run_options` its runs pass
        self._known: OrtValues = {} if values is None else values
        self._values: dict[tuple[bool, str], ort.OrtValue] = {}  # what is bound, alive as long as the binding
        for name, array in inputs.items():
            self._bind(False, name, array)
        self.bind_outputs(outputs)

    def bind_outputs(self, outputs: dict[str, np.ndarray]) -> None:
        """Bind these outputs (again: in place of what those names were bound to)."""
        for name, array in outputs.items():
            self._bind(True, name, array)

    def _bind(self, output: bool, name: str, array: np.ndarray) -> None:
        entry = self._known.get(id(array))
        if entry is None:
            entry = self._known[id(array)] = (array, ort.OrtValue.ortvalue_from_numpy(array))
        (self.io.bind_ortvalue_output if output else self.io.bind_ortvalue_input)(name, entry[1])
        self._values[output, name] = entry[1]

    def run(self) -> None:
        self.session.run_with_iobinding(self.io, None if self.model is None else self.model.run_options)


class StepOutput(NamedTuple):
    """One decoder step's results for B rows (float32 whatever the graphs' precision)."""

    top_log_probs: np.ndarray  # (B, top_k) the best log-probabilities of each row, best first
    top_ids: np.ndarray  # (B, top_k) int64, their token ids (ties: the lower id first)
    eos_log_prob: np.ndarray  # (B,) log p(</s>), for rows forced to end
    present_k: list[np.ndarray]  # per layer (B, H, P + 1, d_k): the past with this step appended
    present_v: list[np.ndarray]
    cross_attention: np.ndarray  # (B, S) the last layer's cross-attention, averaged over heads
    log_probs: np.ndarray | None  # (B, V) when asked for


class OnnxSeq2Seq:
    """An ONNX export dir (or a model dir with an `onnx/` subdir) loaded for inference.

    Attributes: manifest, tokenizer, provider ("cpu"/"cuda", the one in use), precision, graph
    ("portable"/"fused", the decoder step in use), shortlist (the version's vocabulary shortlist
    when its fused steps rank over it instead of the whole vocabulary: `uses_shortlist`; `shortlist=False`
    runs the plain steps; only one set of steps is loaded), and the model's dims and special ids for convenience (n_layers, n_heads, d_k, vocab_size, pad_id,
    bos_id, eos_id, start_id (the decoder's first input token), max_positions)."""

    # What every session run passes (None: ONNX Runtime's defaults; `releasing_memory` sets it).
    run_options: ort.RunOptions | None = None

    def __init__(
        self,
        model_dir_or_onnx_dir: str | Path,
        precision: str = "fp32",
        provider: str = "cpu",
        intra_op_threads: int = 1,
        inter_op_threads: int = 1,
        strict: bool = False,
        verify_checksums: bool = True,
        graph: str = "auto",
        shortlist: bool = True,
    ):
        self.dir = resolve_onnx_dir(model_dir_or_onnx_dir)
        self.provider = choose_provider(provider, strict)
        self.manifest: Manifest = load_manifest(self.dir, verify_checksums=False)
        self.graph = choose_graph(self.manifest, precision, self.provider, graph)
        if verify_checksums:
            verify_files(self.dir, self.manifest, precision, self.graph)
        self.precision = precision
        variant = self.manifest.variant(precision, self.graph)
        if variant.target == "cuda" and self.provider == "cpu":
            log.warning("the %s graphs are meant for CUDA; on the CPU they run, slowly", precision)
        if variant.target == "cpu" and self.provider == "cuda" and precision != "fp32":
            log.warning(
                "the %s graphs are meant for the CPU; on CUDA their quantised MatMuls fall back to "
                "the CPU (serve fp16 there)",
                precision,
            )

        so = ort.SessionOptions()
        so.intra_op_num_threads = intra_op_threads
        so.inter_op_num_threads = inter_op_threads
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.log_severity_level = 3
        providers = [PROVIDERS[self.provider]] + (["CPUExecutionProvider"] if self.provider == "cuda" else [])
        self.shortlist = self._load_shortlist(precision, shortlist)
        self._steps = dict(variant.shortlist_steps) if self.shortlist is not None else variant.decoder_steps()
        self.encoder = ort.InferenceSession(str(self.dir / variant.encoder.file), so, providers=providers)
        self.decoder = ort.InferenceSession(str(self.dir / self._steps["decoder"].file), so, providers=providers)

        def fused(spec: GraphSpec | None) -> ort.InferenceSession | None:
            if self.graph != "fused" or spec is None:
                return None
            return ort.InferenceSession(str(self.dir / spec.file), so, providers=providers)

        # The fused step for batches of one row (a lone greedy request), where it is faster; and
        # both again ending with the argmax alone, for greedy batches that want no scores.
        self.decoder_one_row = fused(self._steps.get("decoder_one_row"))
        self.decoder_unscored = fused(self._steps.get("decoder_unscored"))
        self.decoder_one_row_unscored = fused(self._steps.get("decoder_one_row_unscored"))
        unscored = [x for x in (self.decoder_unscored, self.decoder_one_row_unscored) if x is not None]
        self._unscored_bans_eos = bool(unscored) and all(EOS_BIAS in (i.name for i in x.get_inputs()) for x in unscored)
        if self.provider == "cuda" and PROVIDERS["cuda"] not in self.decoder.get_providers():
            # Listed by onnxruntime-gpu, but the session could not start it (no driver, wrong
            # CUDA or cuDNN): onnxruntime fell back to the CPU. Say so, or refuse when strict.
            msg = "CUDA execution provider is installed but could not be initialised (driver, CUDA or cuDNN missing)"
            if strict:
                raise RuntimeError(msg)
            log.warning("%s; running on the CPU", msg)
            self.provider = "cpu"
        self.tokenizer: TextTokenizer = load_tokenizer(self.dir, self.manifest)

        d, ids = self.manifest.dims, self.manifest.special_ids
        self.n_layers, self.n_heads, self.d_k = d.n_decoder_layers, d.n_heads, d.d_k
        self.vocab_size, self.max_positions = d.vocab_size, d.max_positions
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = ids.pad_id, ids.bos_id, ids.eos_id, ids.unk_id
        self.start_id = ids.start_id
        L = self.n_layers
        self._enc_out = [o.name for o in variant.encoder.outputs]
        self._past_names = [(past_key(i), past_value(i)) for i in range(L)]
        # The contract's order: top_log_probs, top_ids, eos_log_prob, present k/v per layer,
        # cross_attention; log_probs (the full distribution) only on request.
        self._step_out = [o.name for o in variant.decoder.outputs if o.name != LOG_PROBS]
        self._step_out_lp = self._step_out + [LOG_PROBS]
        self._cross_names = [(cross_key(i), cross_value(i)) for i in range(L)]
        self._check_io(variant)

    def _load_shortlist(self, precision: str, enabled: bool) -> Shortlist | None:
        """The version's vocabulary shortlist where the fused steps rank over it (`uses_shortlist`)."""
        spec = self.manifest.shortlist
        if spec is None or not uses_shortlist(self.manifest, precision, self.graph, enabled):
            return None
        if not spec.masks_repeats:
            log.warning("%s: its shortlist steps predate the padding's mask: serving the plain steps", self.dir)
            return None
        shortlist = Shortlist.load(self.dir / spec.file)
        if shortlist.vocab_size != self.manifest.dims.vocab_size:
            raise ValueError(
                f"{spec.file} is for a vocabulary of {shortlist.vocab_size}, the model's has "
                f"{self.manifest.dims.vocab_size}: run `mtserve shortlist` again"
            )
        return shortlist

    def _check_io(self, variant: Variant) -> None:
        # the decoder steps' sessions are attributes named as the manifest's fields
        checks = [(self.encoder, variant.encoder, "encoder")]
        checks += [(getattr(self, field), spec, field) for field, spec in self._steps.items()]
        for session, spec, what in checks:
            if session is None:  # a step of the fused graph while the portable one runs
                continue
            got_in = [i.name for i in session.get_inputs()]
            got_out = [o.name for o in session.get_outputs()]
            if sorted(got_in) != sorted(t.name for t in spec.inputs) or sorted(got_out) != sorted(
                t.name for t in spec.outputs
            ):
                raise RuntimeError(f"the {what} graph's inputs/outputs {got_in} -> {got_out} do not match the manifest")

    def __repr__(self) -> str:
        return (
            f"OnnxSeq2Seq({self.manifest.name}:{self.manifest.version}, {self.precision}, {self.graph}"
            f"{' with a shortlist' if self.shortlist is not None else ''}, "
            f"{self.provider}, layers={self.n_layers}, heads={self.n_heads})"
        )

    # -- text <-> ids ---------------------------------------------------------

    def prefixes(self, source_language: str = "", target_language: str = "") -> tuple[list[int], list[int]]:
        """A multilingual model's language tokens: (the source's first ids, the target's forced first
        ids) for a pair, the manifest's src_lang/tgt_lang by default; ([], []) for one-pair models."""
        langs = self.manifest.languages
        source = [langs.source_tokens[source_language or self.manifest.src_lang]] if langs.source_tokens else []
        target = [langs.target_tokens[target_language or self.manifest.tgt_lang]] if langs.target_tokens else []
        return source, target

    def source_ids(self, texts: list[str], source_language: str = "") -> list[list[int]]:
        """Texts -> source ids ([source language token] + the text's + </s>), cut to fit the
        position table (as at training)."""
        lead = self.prefixes(source_language)[0]
        limit = self.max_positions - 1 - len(lead)
        return [lead + self.tokenizer.encode(t)[: limit - 1] + [self.eos_id] for t in texts]

    def detokenize(self, batch: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(ids).strip() for ids in batch]

    # -- graphs ---------------------------------------------------------------

    def encode(
        self, src_ids: np.ndarray, src_mask: np.ndarray
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """src_ids, src_mask: int64 (B, S) -> memory (B, S, d_model) and per decoder layer the
        cross-attention keys and values, each (B, H, S, d_k)."""
        out = self.encoder.run(
            self._enc_out,
            {
                SRC_IDS: np.ascontiguousarray(src_ids, dtype=np.int64),
                SRC_MASK: np.ascontiguousarray(src_mask, dtype=np.int64),
            },
            self.run_options,
        )
        return out[0], out[1::2], out[2::2]

    def step(
        self,
        tokens: np.ndarray,
        positions: np.ndarray,
        past_k: list[np.ndarray],
        past_v: list[np.ndarray],
        past_mask: np.ndarray,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int = 1,
        log_probs: bool = False,
    ) -> StepOutput:
        """One decoder step over B rows of n sentences, each sentence's beams consecutive rows
        (n == B without beams). tokens (B, 1) or (B,), positions (B,) int64; past_k/past_v per
        layer (B, H, P, d_k) float32, P may be 0; past_mask (B, P) float32 (1 valid, 0 padding);
        cross_k/v per layer (n, H, S, d_k) and src_mask (n, S) int64, once per sentence; top_k:
        candidates per row (<= vocab).
        The full (B, V) log-probabilities come back only when `log_probs` is asked for."""
        if self.graph != "portable":
            raise RuntimeError(f"step runs the portable graph; this model runs the {self.graph} one (bind_step)")
        tokens = np.asarray(tokens, dtype=np.int64)
        feed = {
            TOKENS: tokens.reshape(-1, 1),
            POSITIONS: np.asarray(positions, dtype=np.int64),
            PAST_MASK: np.asarray(past_mask, dtype=np.float32),
            SRC_MASK: np.asarray(src_mask, dtype=np.int64),
            TOP_K: np.array([top_k], dtype=np.int64),
        }
        for (kn, vn), k, v in zip(self._past_names, past_k, past_v):
            feed[kn], feed[vn] = k, v
        for (kn, vn), k, v in zip(self._cross_names, cross_k, cross_v):
            feed[kn], feed[vn] = k, v
        names = self._step_out_lp if log_probs else self._step_out
        out = self.decoder.run(names, feed, self.run_options)
        L = self.n_layers
        return StepOutput(
            top_log_probs=out[0],
            top_ids=out[1],
            eos_log_prob=out[2],
            present_k=out[3 : 3 + 2 * L : 2],
            present_v=out[4 : 4 + 2 * L : 2],
            cross_attention=out[3 + 2 * L],
            log_probs=out[4 + 2 * L] if log_probs else None,
        )

    @property
    def unscored_steps(self) -> bool:
        """Whether greedy batches that want no scores have a step of their own (`bind_step(scored=False)`)."""
        return self.decoder_unscored is not None

    @property
    def unscored_bans_eos(self) -> bool:
        """Whether the unscored steps take eos_bias (`contract.graphs.fused_decoder_io`), so that
        greedy rows that may not end yet need no scored step; exports from before it lack it."""
        return self._unscored_bans_eos

    def bind_step(
        self,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        scored: bool = True,
        values: OrtValues | None = None,
    ) -> BoundStep:
        """The fused decoder step bound to a batch's buffers (`contract.graphs.fused_decoder_io`):
        bind a cache buffer as both its input and its present output, and the step writes it in place.
        `scored=False`: the unscored step (`unscored_steps`), whose inputs have eos_bias in top_k's
        place (`unscored_bans_eos`; none in older exports) and whose only search output is top_ids
        (B, 1). With a `shortlist`, the steps take vocab_ids too (the batch's candidate ids,
        `Shortlist.batch_ids`). `values`: BoundStep's."""
        if self.graph != "fused":
            raise RuntimeError(f"bind_step runs the fused graph; this model runs the {self.graph} one")
        return BoundStep(self._step_session(len(inputs[TOKENS]), scored), inputs, outputs, values, self)

    def run_fused(self, inputs: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        """One fused step without IO binding, ONNX Runtime allocating the outputs: for a batch's first
        step (`past_sequence_length` 0), whose cache holds nothing to share, where binding buffers
        would cost more than the step saves."""
        if self.graph != "fused":
            raise RuntimeError(f"run_fused runs the fused graph; this model runs the {self.graph} one")
        return self._step_session(len(inputs[TOKENS])).run(names, inputs, self.run_options)

    @contextlib.contextmanager
    def releasing_memory(self) -> Iterator[None]:
        """Runs inside give back, as each ends, what its session's CPU arena holds unused: ONNX
        Runtime's arena otherwise keeps every region it grew, at the size of the largest batch
        it has run. For work that is not traffic's (calibration's batches of 64 rows), not for
        steps in a loop, which would grow the arena again at every run. Not thread-safe: for a
        model that nothing else runs meanwhile."""
        options = ort.RunOptions()
        options.add_run_config_entry(*_ARENA_SHRINKAGE)
        self.run_options = options
        try:
            yield
        finally:
            self.run_options = None

    def _step_session(self, rows: int, scored: bool = True) -> ort.InferenceSession:
        """The fused step's session for `rows` rows: the one-row graph where the export has it."""
        if scored:
            batched, one_row = self.decoder, self.decoder_one_row
        else:
            batched, one_row = self.decoder_unscored, self.decoder_one_row_unscored
        if batched is None:
            raise RuntimeError("this export has no unscored decoder step (see `unscored_steps`)")
        return one_row if one_row is not None and rows == 1 else batched

    def empty_past(self, batch: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """A zero-length cache: per layer (batch, H, 0, d_k), and past_mask (batch, 0)."""
        z = np.zeros((batch, self.n_heads, 0, self.d_k), dtype=np.float32)
        return [z] * self.n_layers, [z] * self.n_layers, np.zeros((batch, 0), dtype=np.float32)
