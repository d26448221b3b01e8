"""The rows of a `DecodeBatch` that keep their decoder state or go on from one
(service.decoding.resume): `ResumedRows` is the batch's base, as `Search` is, and works on the
batch's own fields."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from service.decoding.cache import RowCache
from service.decoding.in_place_cache import resumed_cache
from service.decoding.model import DecoderModel
from service.decoding.results import Finished, Node, link
from service.decoding.resume import DecoderState, Resume


class ResumedRows:
    """Keeping a finished greedy row's state (`_keep_states`) and setting rows up from states
    (`_resume`), on the fields below, the batch's own."""

    if not TYPE_CHECKING:  # no instance dict: `DecodeBatch` declares the slots of these fields
        __slots__ = ()

    beam: int
    keys: list[Hashable]
    max_len: np.ndarray
    want_alignment: np.ndarray
    src_lens: np.ndarray
    cross_k: list[np.ndarray]
    cross_v: list[np.ndarray]
    output_from: np.ndarray
    keep_state: np.ndarray
    cache: RowCache
    positions: np.ndarray
    tokens: np.ndarray
    hist: list[Node | None]
    out_ids: np.ndarray

    def _resume(self, model: DecoderModel, resume: Sequence[Resume]) -> None:
        """`from_sources`' rows of resumed sentences: their cache holds the states' entries, their
        next input is the last forced token at the position after it, and their output so far
        (beam: the first beam's nodes, the others dead) is the forced tokens."""
        K = self.beam
        for i, r in enumerate(resume):
            if r.upto >= self.max_len[i]:
                raise ValueError(f"resume: {r.upto} tokens reach max_len ({self.max_len[i]})")
            if self.want_alignment[i] and r.attention is None:
                raise ValueError("resume: a sentence that wants its alignment needs the attention rows")
        self.cache = resumed_cache(model, [r.history() for r in resume], K, int(self.max_len.max()) + 1)
        self.positions = np.repeat(np.array([r.upto for r in resume], dtype=np.int64), K)
        last = [r.tokens[-1] if r.upto else model.start_id for r in resume]  # the next input
        self.tokens = np.repeat(np.array(last, dtype=np.int64), K)
        for i, r in enumerate(resume):
            start, node = int(self.output_from[i]), None
            for j, tok in enumerate(r.tokens):
                att = r.attention[j - start] if self.want_alignment[i] and j >= start else None  # type: ignore[index]
                node = link(tok, att, node)
            if K == 1:
                self.out_ids[i, : r.upto] = r.tokens
                self.hist[i] = node if self.want_alignment[i] else None
            else:
                self.hist[i * K] = node

    def _keep_states(self, finished: list[Finished]) -> None:
        """The decoder state of the sentences that finished at this step and keep theirs (greedy:
        a sentence is a row), after the step's entries went into the cache."""
        if not finished or not self.keep_state.any():
            return
        at = {k: i for i, k in enumerate(self.keys)}
        for f in finished:
            i = at[f.key]
            if not self.keep_state[i]:
                continue
            ks, vs = self.cache.history(i)
            S = int(self.src_lens[i])
            f.state = DecoderState(
                self.out_ids[i, : int(self.positions[i]) + 1].tolist(),
                [np.ascontiguousarray(k) for k in ks],
                [np.ascontiguousarray(v) for v in vs],
                [np.ascontiguousarray(c[i, :, :S]) for c in self.cross_k],
                [np.ascontiguousarray(c[i, :, :S]) for c in self.cross_v],
            )


def resumed_prefixes(
    resume: Sequence[Resume],
    target_prefixes: Sequence[Sequence[int]] | None,
    kept_prefixes: Sequence[Sequence[int]] | None,
    n: int,
) -> list[list[int]]:
    """The kept prefix of each resumed sentence: its state's forced tokens after its target prefix
    (a language token), which they must start with; a kept prefix of its own it may not have."""
    if len(resume) != n:
        raise ValueError(f"resume: {len(resume)} values for {n} sentences")
    if kept_prefixes is not None:
        raise ValueError("resume: the kept prefix is the state's")
    prefixes = [list(p) for p in target_prefixes] if target_prefixes is not None else [[] for _ in range(n)]
    kept = []
    for r, p in zip(resume, prefixes):
        if r.tokens[: len(p)] != p or r.upto < len(p):
            raise ValueError("resume: the state's tokens do not start with the sentence's target prefix")
        kept.append(r.tokens[len(p) :])
    return kept
