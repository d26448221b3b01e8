"""What a decoder step may emit, row by row, as one object over the step's candidates (each row's
top ids and their log-probabilities, best first; `StepResult`):

- a sentence's target prefix is forced as its first tokens, at log-probability 0;
- `</s>` cannot be chosen before a sentence's minimum length (greedy takes the best other token,
  beam search drops the `</s>` candidates);
- at a sentence's last allowed step (`max_output_len`) only `</s>` may follow, at its own
  log-probability;
- a greedy sentence that samples draws its token among its candidates (`service.decoding.sampling`),
  never `</s>` before its minimum length;
- a glossary term's tokens are forced as a prefix's are, beams may not end while a term is
  missing, and a row may not write the tokens banned around a term (`service.decoding.terms`;
  `with_terms`).

`OutputRules.at_step` works out which rows are under the prefix and minimum-length rules at a step;
most steps have none (a multilingual model's language token binds the first step only), and then
`binding` is False and `apply` returns the candidates as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from service.decoding.sampling import Sampling, draw
from service.decoding.terms import TermStep

NEG_INF = float("-inf")


def max_output_len(src_len: int, a: float, b: int, max_positions: int) -> int:
    """Tokens a sentence may emit, </s> included; src_len counts the source's </s>."""
    return max(1, min(int(a * src_len + b), max_positions - 1))


@dataclass(frozen=True, slots=True)
class OutputRules:
    """The rules of one step for R rows (sentences x beam, a sentence's beams consecutive).

    forced: (R,) the prefix token a row must emit at this step (-1: none); no_eos: (R,) bool, the
    rows that may not end yet. Both None when no live row is under either rule at this step.
    dropped: (R, k) the step's candidates a row may not take, or None."""

    eos_id: int
    pad_id: int
    beam: int
    forced: np.ndarray | None = None
    no_eos: np.ndarray | None = None
    dropped: np.ndarray | None = None

    @classmethod
    def at_step(
        cls,
        eos_id: int,
        pad_id: int,
        beam: int,
        positions: np.ndarray,
        done: np.ndarray,
        eos_from: np.ndarray,
        prefix_len: np.ndarray,
        target_prefix: Sequence[Sequence[int]],
    ) -> OutputRules:
        """The rules at the step that writes `positions` (R,): per sentence whether it is `done`, the
        position from which it may end (`eos_from`, at least its `prefix_len`) and its forced tokens
        (`target_prefix`)."""
        unbound = cls(eos_id, pad_id, beam)
        if not eos_from.any():
            return unbound
        K = beam

        def per_row(a: np.ndarray) -> np.ndarray:
            return a if K == 1 else np.repeat(a, K)

        live = per_row(~done)
        no_eos = live & (positions < per_row(eos_from))
        if not no_eos.any():  # every row is past its prefix and its minimum (eos_from >= prefix_len)
            return unbound
        forced = np.full(len(positions), -1, dtype=np.int64)
        for r in np.flatnonzero(live & (positions < per_row(prefix_len))).tolist():
            forced[r] = target_prefix[r // K][int(positions[r])]
        return cls(eos_id, pad_id, beam, forced, no_eos)

    def with_terms(self, terms: TermStep | None) -> OutputRules:
        """These rules with the glossary terms' forced tokens (a row at a prefix token starts none),
        dropped candidates (banned tokens, word pieces after a term) and, for beams, </s> bans;
        greedy rows need no </s> ban: one whose best token is </s> starts a missing term instead."""
        if terms is None:
            return self
        dropped = terms.dropped
        if not ((terms.forced >= 0).any() or dropped is not None or (self.beam > 1 and terms.no_eos.any())):
            return self
        forced, no_eos = terms.forced, terms.no_eos if self.beam > 1 else np.zeros(len(terms.forced), dtype=bool)
        if self.forced is not None and self.no_eos is not None:
            forced, no_eos = np.where(self.forced >= 0, self.forced, forced), self.no_eos | no_eos
        return OutputRules(self.eos_id, self.pad_id, self.beam, forced, no_eos, dropped)

    @property
    def binding(self) -> bool:
        """Whether a live row is under a forced prefix token or its minimum length at this step."""
        return self.no_eos is not None

    def apply(self, top_ids: np.ndarray, top_lp: np.ndarray | None) -> tuple[np.ndarray, np.ndarray | None]:
        """The step's candidates under the prefix and minimum-length rules: a forced row gets its
        prefix token alone (log-prob 0); a row that may not end loses its </s> candidate, and a
        row its `dropped` candidates (greedy: the best other candidate takes the place of its
        best, which needs top_k >= 2, or more where tokens are dropped). Copies; the step's own
        arrays stay.
        Unchanged where the rules do not bind."""
        if self.forced is None or self.no_eos is None:
            return top_ids, top_lp
        top_ids = top_ids.copy()
        top_lp = None if top_lp is None else top_lp.copy()
        out = self.no_eos[:, None] & (top_ids == self.eos_id)
        if self.dropped is not None:
            out |= self.dropped
        if self.beam == 1 and out[:, 0].any():
            first = np.flatnonzero(out[:, 0])
            other = np.argmin(out[first], axis=1)  # the best candidate left
            top_ids[first, 0] = top_ids[first, other]
            if top_lp is not None:
                top_lp[first, 0] = top_lp[first, other]
        elif top_lp is not None:
            top_lp[out] = NEG_INF
        rows = self.forced >= 0
        if rows.any():
            top_ids[rows] = self.pad_id
            top_ids[rows, 0] = self.forced[rows]
            if top_lp is not None:
                top_lp[rows] = NEG_INF
                top_lp[rows, 0] = 0.0
        return top_ids, top_lp

    def sample(
        self,
        sampling: Sequence[Sampling | None],
        rows: Iterable[int],
        top_ids: np.ndarray,
        top_lp: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The step's candidates with the drawn token (and its log-probability) of each row in
        `rows` (greedy rows that sample, `sampling[r]`) in column 0, where greedy search takes it;
        </s> is not drawn in a row that may not end yet. Copies; the step's own arrays stay."""
        if top_lp is None:
            raise RuntimeError("sampling needs the step's log-probabilities")
        top_ids, top_lp = top_ids.copy(), top_lp.copy()
        no_eos = self.no_eos
        for r in rows:
            how = sampling[r]
            assert how is not None
            banned = top_ids[r] == self.eos_id if no_eos is not None and no_eos[r] else None
            j = draw(how, top_lp[r], banned)
            top_ids[r, 0], top_lp[r, 0] = top_ids[r, j], top_lp[r, j]
        return top_ids, top_lp

    def force_eos(
        self,
        top_ids: np.ndarray,
        top_lp: np.ndarray | None,
        eos_log_prob: np.ndarray | None,
        force: np.ndarray | slice,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The step's candidates with rows `force` (a mask, or every row) at their sentence's last
        allowed step left only </s>, at its own log-probability: copies, the step's own arrays stay."""
        top_ids = top_ids.copy()
        top_ids[force] = self.pad_id
        top_ids[force, 0] = self.eos_id
        if top_lp is not None and eos_log_prob is not None:
            top_lp = top_lp.copy()
            top_lp[force] = NEG_INF
            top_lp[force, 0] = eos_log_prob[force]
        return top_ids, top_lp
