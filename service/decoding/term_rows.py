"""The glossary terms of a `DecodeBatch`'s rows (`TermRows`, its base as `Search` is): each row's
term state through the steps (service.decoding.terms holds the rules), the candidates a step
ranks while a term's bans are pending, and the step run again where a step right after a term
ranked too few (`TermRows.ranked`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from service.decoding.cache import StepResult
from service.decoding.output_rules import OutputRules
from service.decoding.terms import (
    BAN_STEPS,
    MAX_TERMS,
    NEG_INF,
    SourceTerm,
    TermState,
    TermStep,
    advance,
    all_placed,
    decide,
    landed,
)

# The candidates a greedy row ranks while tokens are banned after a term: a word-internal piece
# of the target vocabulary may not follow it ("lad" + "den" after the term "lad"), nor the
# replaced tokens for BAN_STEPS steps.
GLUE_CANDIDATES = 8
GLUE_BEAM_EXTRA = 64
# A beam step right after a term first ranks this many more than GLUE_CANDIDATES, and again with
# GLUE_BEAM_EXTRA more only where those may not hold the 2K best candidates a sentence may take
# (`TermRows._short_of_candidates`): the same step, without the cost of ranking 72 candidates
# where a few more than 2K are enough, as they mostly are.
GLUE_BEAM_TRY = 8


class TermRows:
    """The glossary terms of a `DecodeBatch`'s rows (its base, as `Search` is: the fields below
    are the batch's own)."""

    if not TYPE_CHECKING:  # no instance dict: `DecodeBatch` declares the slots of these fields
        __slots__ = ()

    beam: int
    eos_id: int
    done: np.ndarray
    scores: np.ndarray
    max_len: np.ndarray
    positions: np.ndarray
    output_from: np.ndarray
    terms: list[tuple[SourceTerm, ...]]
    term_pieces: list[np.ndarray | None]
    with_terms: np.ndarray
    term_at: np.ndarray
    term_pos: np.ndarray
    terms_placed: np.ndarray
    term_ban: np.ndarray
    term_ban_left: np.ndarray

    def _set_terms(
        self,
        n: int,
        terms: Sequence[Sequence[SourceTerm]] | None,
        pieces: Sequence[np.ndarray | None] | None = None,
    ) -> None:
        """`from_sources`' terms of each of its n sentences and the word-internal pieces of their
        target vocabularies (`pieces`: (V,) bool each, None: none banned after a term), and its
        rows' state: nothing placed."""
        self.terms = [tuple(t) for t in terms] if terms is not None else [() for _ in range(n)]
        if len(self.terms) != n:
            raise ValueError(f"terms: {len(self.terms)} values for {n} sentences")
        self.term_pieces = list(pieces) if pieces is not None else [None] * n
        if len(self.term_pieces) != n:
            raise ValueError(f"pieces: {len(self.term_pieces)} values for {n} sentences")
        if any(len(t) > MAX_TERMS for t in self.terms):
            raise ValueError(f"terms: at most {MAX_TERMS} a sentence")
        if any(not term.target for ts in self.terms for term in ts):
            raise ValueError("terms: a term forces at least one token")
        self.with_terms = np.array([bool(t) for t in self.terms], dtype=bool)
        self._set_term_state(TermState.new(n * self.beam))

    def _term_state(self) -> TermState:
        return TermState(self.term_at, self.term_pos, self.terms_placed, self.term_ban, self.term_ban_left)

    def _set_term_state(self, s: TermState) -> None:
        self.term_at, self.term_pos, self.terms_placed, self.term_ban, self.term_ban_left = (
            s.at,
            s.pos,
            s.placed,
            s.ban,
            s.ban_left,
        )

    def _per_row(self) -> list[tuple[SourceTerm, ...]]:
        K = self.beam
        return self.terms if K == 1 else [t for t in self.terms for _ in range(K)]

    def _term_step(self, top_ids: np.ndarray, att: np.ndarray, prefix: np.ndarray | None) -> TermStep | None:
        """The terms' forced tokens, </s> bans and dropped candidates (of `top_ids`, (R, k)) at
        this step (None: no sentence has terms, or none has a rule left); rows at a forced
        `prefix` token (-1: none) start no term."""
        if not self.with_terms.any():
            return None
        # Python scalars: a step's rows are few, where numpy's cost per call would dominate.
        K, terms = self.beam, self.terms
        placed, ban_left = self.terms_placed.tolist(), self.term_ban_left.tolist()
        R = len(placed)
        live = [not d for d in self.done.tolist() for _ in range(K)]
        if not any(live[r] and (ban_left[r] or placed[r] != all_placed(len(terms[r // K]))) for r in range(R)):
            # Every row still decoding has placed all its terms and has no ban left: nothing to do
            # (its rows' term states are alike then, so the beams' reordering may skip them too).
            return None
        if prefix is not None:
            live = [x and p < 0 for x, p in zip(live, prefix.tolist())]
        max_len, output_from, positions = self.max_len.tolist(), self.output_from.tolist(), self.positions.tolist()
        room = [max_len[r // K] - 1 - positions[r] for r in range(R)]
        at_output = [positions[r] - output_from[r // K] for r in range(R)]
        step, state = decide(
            self._per_row(), self._term_state(), att, top_ids[:, 0], live, room, self.eos_id, at_output, K > 1
        )
        self._set_term_state(state)
        step.dropped = self._dropped(step, top_ids)
        return step

    def _dropped(self, step: TermStep, top_ids: np.ndarray) -> np.ndarray | None:
        """The candidates (of `top_ids`) the step's rows may not take: a glued row's word-internal
        pieces and a row's banned tokens (None: none)."""
        K = self.beam
        glued = step.glued.tolist()
        if not (any(glued) or any(step.banned)):
            return None
        dropped = np.zeros(top_ids.shape, dtype=bool)
        for r, is_glued in enumerate(glued):
            mask = self.term_pieces[r // K] if is_glued else None
            if mask is not None:
                dropped[r] = mask[top_ids[r]]
        for r, avoid in enumerate(step.banned):
            if avoid:
                row = top_ids[r].tolist()
                for token in avoid:
                    if token in row:  # rarely: a banned token is among the row's candidates
                        dropped[r] |= top_ids[r] == token
        # A sentence whose live rows have no candidate left (after "lad" a model may want
        # only "boy" and word pieces) keeps them all: it would die otherwise.
        live_rows = [score > NEG_INF for score in self.scores.tolist()] if K > 1 else [True] * len(dropped)
        emptied: list[bool] = np.asarray(dropped.all(axis=1)).tolist()
        for first in range(0, len(dropped), K):
            if all(emptied[r] or not live_rows[r] for r in range(first, first + K)):
                dropped[first : first + K] = False
                step.kept_whole = True
        return dropped if dropped.any() else None

    def _terms_candidates(self) -> int:
        """The candidates a row needs at this step, known before it (at least): 1 without a
        ban in force; while a row may have tokens banned (they, and </s> too, may be its best
        ones) GLUE_CANDIDATES, and right after a term, where a row may not take a word-internal
        piece either, GLUE_CANDIDATES more than a beam's 2K (after "lad" a model may rank
        nothing but pieces and "boy" in its first 2K)."""
        if not self.with_terms.any() or not (self.term_ban_left > 0).any():
            return 1
        glue = bool((self.term_ban_left == BAN_STEPS).any())
        return GLUE_CANDIDATES + (GLUE_BEAM_TRY if glue and self.beam > 1 else 0)

    def ranked(
        self, run: Callable[[int], StepResult], k_row: int, vocab_size: int, rules: OutputRules
    ) -> tuple[StepResult, TermStep | None]:
        """A step's result, `run(k)` ranking k candidates a row, under the rules and the glossary
        terms' (its candidates replaced), and the terms' step. A step right after a term that
        ranked too few runs again, the rows' term state as before it (`_ranks_again`): the search
        is the one of ranking all those at once."""
        while True:
            out = run(k_row)
            before, ranked = self._term_state(), out.top_log_probs
            terms = self._term_step(out.top_ids, out.cross_attention, rules.forced)
            top_ids, top_lp = rules.with_terms(terms).apply(out.top_ids, out.top_log_probs)
            out = out._replace(top_ids=top_ids, top_log_probs=top_lp)
            again = self._ranks_again(k_row, vocab_size, terms, ranked, top_lp, rules.forced)
            if not again:
                return out, terms
            self._set_term_state(before)
            k_row = again

    def _ranks_again(
        self,
        k_row: int,
        vocab_size: int,
        step: TermStep | None,
        top_lp: np.ndarray | None,
        allowed: np.ndarray | None,
        prefix: np.ndarray | None,
    ) -> int:
        """The candidates a step that ranked `k_row` runs again with: GLUE_BEAM_EXTRA more than
        GLUE_CANDIDATES where it is `_short_of_candidates`, at most the vocabulary (or the batch's
        shortlist) and more than it ranked; 0: it stands."""
        if not self._short_of_candidates(step, top_lp, allowed, prefix):
            return 0
        more = min(GLUE_CANDIDATES + GLUE_BEAM_EXTRA, vocab_size)
        ranked = 0 if top_lp is None else top_lp.shape[1]
        return more if more > max(k_row, ranked) else 0

    def _short_of_candidates(
        self, step: TermStep | None, top_lp: np.ndarray | None, allowed: np.ndarray | None, prefix: np.ndarray | None
    ) -> bool:
        """Whether a beam step right after a term may not hold, among a row's ranked candidates,
        a sentence's 2K best that the rules leave (the ones the beams take). It holds them where
        the sentence has 2K candidates it may take above every live row's last ranked one (a row's
        unranked candidates are below its last), each sum in float32 as the search adds them; and
        where rows are forced (their other candidates go unused); not where a sentence kept its
        dropped candidates (none left). `top_lp`: the step's ranked log-probabilities, `allowed`:
        as the rules leave them (-inf: dropped), `prefix`: the rows' forced prefix tokens (-1:
        none)."""
        K = self.beam
        if step is None or K == 1 or top_lp is None or allowed is None or not step.glued.any():
            return False
        if step.kept_whole:
            return True
        totals = self.scores[:, None] + allowed  # float32, as `Search` sums them
        last = (self.scores + top_lp[:, -1]).tolist()
        free = (step.forced < 0) & (self.scores > NEG_INF)
        if prefix is not None:
            free &= prefix < 0
        free_rows = free.tolist()
        for first in range(0, len(last), K):
            rows = range(first, first + K)
            bound = max((last[r] for r in rows if free_rows[r]), default=None)
            if bound is not None and int((totals[first : first + K] > bound).sum()) < 2 * K:
                return True
        return False

    def _terms_advance(self, step: TermStep | None, rows: np.ndarray | None) -> None:
        """The rows' term state after this step's tokens; beams follow their parents (`rows`)."""
        if step is None:
            return
        state = advance(self._per_row(), self._term_state(), step.forced)
        self._set_term_state(state if rows is None else state.take(rows))

    def _landed(self, i: int, tokens: Sequence[int]) -> list[tuple[int, int, int]]:
        """Where sentence i's terms stand in its finished `tokens` (`Finished.terms`)."""
        return landed(tokens, self.terms[i]) if self.with_terms[i] else []
