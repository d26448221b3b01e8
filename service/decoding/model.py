"""What decoding needs of a model: the seam between the search (`service.decoding`) and the graphs.

`service.runtime.onnx_model.OnnxSeq2Seq` is the model that serves; anything with these attributes
and methods decodes the same way (a test's fake, a benchmark's wrapper). The decoder step is one
of two graphs (`graph`): "portable" runs through `step` with a cache it returns grown by a step,
"fused" through `bind_step` / `run_fused` over preallocated buffers it writes in place
(`service.decoding.in_place_cache`)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from contract.shortlist import Shortlist
from service.runtime.onnx_model import BoundStep, OrtValues, StepOutput


class DecoderModel(Protocol):
    """The encoder, the decoder steps, and the dims and special ids the search reads."""

    @property
    def graph(self) -> str:
        """The decoder step in use: "portable" or "fused"."""

    @property
    def n_layers(self) -> int:
        """Decoder layers."""

    @property
    def n_heads(self) -> int: ...

    @property
    def d_k(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_positions(self) -> int: ...

    @property
    def pad_id(self) -> int: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def eos_id(self) -> int: ...

    @property
    def start_id(self) -> int:
        """The decoder's first input token (the manifest's decoder_start_id, else bos_id)."""

    @property
    def shortlist(self) -> Shortlist | None:
        """The vocabulary shortlist the fused steps rank over (their input vocab_ids), or None."""

    @property
    def unscored_steps(self) -> bool:
        """Whether greedy batches that want no scores have a step of their own (`bind_step(scored=False)`)."""

    @property
    def unscored_bans_eos(self) -> bool:
        """Whether the unscored steps take eos_bias: greedy rows that may not end yet need no scored step."""

    def encode(
        self, src_ids: np.ndarray, src_mask: np.ndarray
    ) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """src_ids, src_mask (B, S) -> memory (B, S, d_model) and per decoder layer the
        cross-attention keys and values (B, H, S, d_k)."""

    def releasing_memory(self) -> AbstractContextManager[None]:
        """Runs inside give back the memory they grew (the sessions' arenas) as each ends."""

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
        """One portable decoder step over B rows (`contract.graphs.decoder_io`)."""

    def empty_past(self, batch: int) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """The portable step's zero-length cache for `batch` rows."""

    def bind_step(
        self,
        inputs: dict[str, np.ndarray],
        outputs: dict[str, np.ndarray],
        scored: bool = True,
        values: OrtValues | None = None,
    ) -> BoundStep:
        """The fused decoder step bound to a batch's buffers (`contract.graphs.fused_decoder_io`);
        `values`: OrtValues of those buffers that other bindings made, shared (BoundStep's)."""

    def run_fused(self, inputs: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        """One fused step without IO binding, the outputs `names` allocated by the runtime."""
