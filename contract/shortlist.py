"""The vocabulary shortlist of a model version: which target tokens the decoder step may rank for a
batch (Marian's lexical shortlist, CTranslate2's vocabulary map).

`mtserve shortlist` (mtserve/shortlist.py, export/shortlist.py) derives it and writes it into the
version's export dir as `SHORTLIST_FILE`, a numpy .npz (no pickle) of:

    offsets  (source vocab + 1,) int64   CSR row pointers: source token s maps to
    targets  (nnz,) int32                targets[offsets[s]:offsets[s + 1]], ascending ids
    always   (A,) int64                  target ids every batch ranks: the specials and the most
                                         frequent target tokens, ascending
    params   () str                      JSON: how it was derived (per_source, always, corpus, ...)

The manifest records the file and its SHA-256 (`contract.manifest.ShortlistSpec`) and, per fused
variant, the decoder steps that rank over a shortlist (`Variant.shortlist_steps`, the contract
`contract.graphs.fused_decoder_io(..., shortlist=True)`): they take one more input, vocab_ids (K,)
int64, the batch's candidate ids ascending, and their log_probs, top_ids and eos_log_prob are over
those K tokens (top_ids mapped back to vocabulary ids in the graph; vocab_ids must hold </s>).

`Shortlist.batch_ids` makes a batch's vocab_ids: the union of `always` and the rows of every
source token of the batch (and the ids forced on its output), padded to a multiple of
`PAD_MULTIPLE` with repeats of one id already among them (the caller's `fill`: the model's pad
id, which a model never prefers). A repeat is no new candidate: it ties its first place, and
every ranking takes the first on ties (ArgMax, and TopK, which lists the lower index first), so
no slot of the padding can bring in an id outside the candidates; the search drops a repeat that
a top-k list holds after its first place (`service.decoding`), before beams and sampling choose.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

SHORTLIST_FILE = "shortlist.npz"
# The graph files of the shortlist steps: the plain step's name with this before ".onnx".
SHORTLIST_SUFFIX = ".shortlist"
PAD_MULTIPLE = 16


def shortlist_file_name(step_file: str) -> str:
    """decoder.fused.int8.onnx -> decoder.fused.int8.shortlist.onnx."""
    stem = step_file.removesuffix(".onnx")
    return f"{stem}{SHORTLIST_SUFFIX}.onnx"


@dataclass(frozen=True)
class Shortlist:
    """A loaded shortlist (see the module doc); `vocab_size` is the target vocabulary's."""

    offsets: np.ndarray
    targets: np.ndarray
    always: np.ndarray
    vocab_size: int
    params: dict[str, Any]

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("shortlist offsets must be a 1-D array of row pointers starting at 0")
        if int(self.offsets[-1]) != len(self.targets) or np.any(np.diff(self.offsets) < 0):
            raise ValueError("shortlist offsets do not match its targets")
        for name, ids in (("targets", self.targets), ("always", self.always)):
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
                raise ValueError(f"shortlist {name} hold ids outside the target vocabulary ({self.vocab_size})")

    @property
    def source_size(self) -> int:
        return len(self.offsets) - 1

    def row(self, source_id: int) -> np.ndarray:
        """The target ids of one source token (none for an id past the table)."""
        if not 0 <= source_id < self.source_size:
            return self.targets[:0]
        return self.targets[self.offsets[source_id] : self.offsets[source_id + 1]]

    def candidates(self, source_ids: Iterable[int], forced: Iterable[int] = ()) -> np.ndarray:
        """One sentence's own candidates (without `always`): its source tokens' rows and the ids
        forced on its output, unique, int64."""
        parts = [self.row(int(s)) for s in set(source_ids)]
        parts.append(np.asarray(list(forced), dtype=np.int64))
        return np.unique(np.concatenate(parts).astype(np.int64, copy=False))

    def batch_candidates(self, sentences: Sequence[np.ndarray]) -> np.ndarray:
        """A batch's candidates: `always` and the sentences' `candidates`, unique, ascending."""
        used = np.zeros(self.vocab_size, dtype=bool)
        used[self.always] = True
        for ids in sentences:
            used[ids] = True
        return np.flatnonzero(used).astype(np.int64, copy=False)

    def batch_ids(self, sentences: Sequence[np.ndarray], fill: int) -> np.ndarray:
        """A batch's vocab_ids: its `batch_candidates` and `fill`, padded to a multiple of
        PAD_MULTIPLE with repeats of `fill` (each right after its first place: non-decreasing).
        `fill` must not be </s>, whose place the steps look up."""
        ids = np.union1d(self.batch_candidates(sentences), [fill])
        short = -len(ids) % PAD_MULTIPLE
        if short:
            ids = np.sort(np.concatenate([ids, np.full(short, fill, dtype=ids.dtype)]), kind="stable")
        return ids.astype(np.int64, copy=False)

    def save(self, path: str | Path) -> None:
        with open(path, "wb") as f:
            np.savez(
                f,
                offsets=self.offsets.astype(np.int64),
                targets=self.targets.astype(np.int32),
                always=self.always.astype(np.int64),
                vocab_size=np.array(self.vocab_size, dtype=np.int64),
                params=np.array(json.dumps(self.params, sort_keys=True)),
            )

    @classmethod
    def load(cls, path: str | Path) -> Shortlist:
        with np.load(path, allow_pickle=False) as z:
            return cls(
                offsets=z["offsets"].astype(np.int64),
                targets=z["targets"].astype(np.int64),
                always=z["always"].astype(np.int64),
                vocab_size=int(z["vocab_size"]),
                params=json.loads(str(z["params"])),
            )

    @classmethod
    def from_rows(
        cls, rows: Sequence[Iterable[int]], always: Iterable[int], vocab_size: int, params: dict[str, Any]
    ) -> Shortlist:
        """From each source token's target ids (any order, duplicates dropped)."""
        sorted_rows = [np.unique(np.asarray(list(r), dtype=np.int64)) for r in rows]
        offsets = np.zeros(len(sorted_rows) + 1, dtype=np.int64)
        offsets[1:] = np.cumsum([len(r) for r in sorted_rows])
        targets = np.concatenate(sorted_rows) if sorted_rows else np.zeros(0, dtype=np.int64)
        return cls(offsets, targets, np.unique(np.asarray(list(always), dtype=np.int64)), vocab_size, params)
