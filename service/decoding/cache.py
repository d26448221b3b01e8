"""The self-attention key/value cache of a running batch: the interface (`RowCache`) and a step's
results (`StepResult`); one class per decoder-step graph, each in a module of its own.

`DecodeBatch` drives either through the same four calls: `step` runs the decoder once for every
row, `advance` records the step (its beams reordered: `rows[r]` is the row whose history row r
continues), `select` keeps some rows (a filter), `concatenate` stacks batches whose rows are at
different steps. Rows of a sentence are consecutive, `beam` of them.

- `ConcatCache` (concat_cache.py), for the portable graph: per layer (R, H, P, d_k) arrays that the graph returns
  grown by one entry each step; a beam reorder gathers them on the host.
- `InPlaceCache` (in_place_cache.py), for the fused graph (export/fused/): per layer (R, H, M, d_k) buffers of M
  slots, bound once with IO binding and written in place by the graph at slot P; a beam reorder
  changes only `indirection` (which beam of the sentence holds each slot of a beam's history).
  Nothing is copied between steps; `select` and `concatenate` copy once, when a batch changes.

A row that joins a running batch starts at a later slot: `mask` says which slots are its own,
and its position (kept by `DecodeBatch`) counts only those.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple, Self

import numpy as np

from contract.graphs import CROSS_ATTENTION, EOS_LOG_PROB, TOP_IDS, TOP_LOG_PROBS
from service.decoding.model import DecoderModel


class StepResult(NamedTuple):
    """One decoder step's results for R rows."""

    top_log_probs: np.ndarray | None  # (R, k) the best log-probabilities of each row, best first
    top_ids: np.ndarray  # (R, k) int64, their token ids
    eos_log_prob: np.ndarray | None  # (R,) log p(</s>), for rows forced to end
    cross_attention: np.ndarray  # (R, S) the last layer's cross-attention, averaged over heads


# The graph outputs behind `StepResult`'s fields, in their order.
STEP_RESULT_OUTPUTS = (TOP_LOG_PROBS, TOP_IDS, EOS_LOG_PROB, CROSS_ATTENTION)


def repeated(out: StepResult, K: int) -> StepResult:
    """A step's results for one row per sentence, as if each row had run K times."""

    def rep(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.repeat(a, K, axis=0)

    return StepResult(
        rep(out.top_log_probs),
        np.repeat(out.top_ids, K, axis=0),
        rep(out.eos_log_prob),
        np.repeat(out.cross_attention, K, axis=0),
    )


class RowCache(ABC):
    """What `DecodeBatch` asks of a cache (see the module doc)."""

    @property
    @abstractmethod
    def past_len(self) -> int:
        """The entries a row may attend to before this step (its own, and padding)."""

    @abstractmethod
    def __len__(self) -> int:
        """Rows."""

    @abstractmethod
    def entries(self) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        """What the rows attend to, whatever the layout: per layer keys and values (R, H, P, d_k),
        each row's own history in order, and which of the P entries are the row's own (R, P) bool."""

    @abstractmethod
    def history(self, row: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per layer the keys and values (H, T, d_k) of `row`'s own entries, in order: its inputs
        at positions 0..T-1 (service.decoding.resume)."""

    @classmethod
    @abstractmethod
    def resumed(
        cls,
        model: DecoderModel,
        histories: Sequence[tuple[list[np.ndarray], list[np.ndarray]]],
        beam: int,
        capacity: int,
    ) -> Self:
        """A cache of len(histories) sentences of `beam` rows each, every beam of sentence i
        holding `histories[i]` (per layer keys and values (H, T_i, d_k)) as its first entries;
        room for `capacity` entries a row (service.decoding.resume)."""

    @abstractmethod
    def step(
        self,
        model: DecoderModel,
        tokens: np.ndarray,
        positions: np.ndarray,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int,
        scored: bool = True,
        vocab: Sequence[np.ndarray] = (),
        no_eos: np.ndarray | None = None,
    ) -> StepResult:
        """Run the decoder once for every row; `advance` must follow. `scored=False` (greedy
        search, top_k 1, nobody asking for scores) lets the step skip the log-probabilities where
        the model has a step without them: top_log_probs and eos_log_prob are then None.
        `vocab`: each sentence's shortlist candidates (`Shortlist.candidates`), where the model
        ranks over a shortlist (`DecoderModel.shortlist`): top_k is then at most the batch's
        vocab_ids. `no_eos` (R,) bool: the rows whose </s> the unscored step may not choose, where
        the model's unscored steps ban it (`DecoderModel.unscored_bans_eos`); scored steps rank it
        as any token (the caller takes the second best)."""

    @abstractmethod
    def first_step(
        self,
        model: DecoderModel,
        tokens: np.ndarray,
        positions: np.ndarray,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int,
        vocab: Sequence[np.ndarray] = (),
    ) -> StepResult:
        """`step` for a batch that has not decoded yet, with beams: a sentence's beams are identical
        then (only the first is live), so the decoder runs one row per sentence and its results are
        repeated over the beams; the first beam's entries are kept. `advance` must follow."""

    @abstractmethod
    def advance(self, rows: np.ndarray | None) -> None:
        """Keep the step's entries, row r continuing the history of row `rows[r]` (None: its own)."""

    @abstractmethod
    def select(self, rows: np.ndarray) -> Self:
        """A cache of `rows` (whole sentences) only."""

    @classmethod
    @abstractmethod
    def concatenate(cls, caches: Sequence[Self]) -> Self:
        """The rows of `caches` one after the other."""
