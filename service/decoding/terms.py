"""Glossary terms forced by the search: constrained decoding over each term's target tokens,
placed where the model translates the term's source.

A sentence may carry `SourceTerm`s: a span of its source tokens and the target tokens that must
stand for it in the output (a glossary's target, or the span's own text for a do-not-translate
phrase). Each row (a sentence's greedy row, or each of its beams) keeps its own state: the term it
is emitting and how far (`at`, `pos`), and which terms it has placed (`placed`, a bit per term).

At each step, before the search chooses, a row that is not emitting a term starts one
- where the step's cross-attention puts its weight (its argmax) on the source span of a term it
  has not placed yet, DOMINANCE times more than on any source token outside the span: the model
  is about to translate that term, and the term's target takes the place of what it would write; or
- where its best token is </s> while a term is still missing, or where the missing terms' tokens
  only just fit before the sentence's length limit: the term goes before the end.
A row emitting a term is given the term's next token alone (as a forced prefix token is), until
the term is out. Rows with terms left may not end otherwise (their </s> is banned), so every
hypothesis that ends holds every term once, unless the sentence reaches its length limit.

Sentences without terms are not touched: their rows never start one, and a batch with no terms
at all skips this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

MAX_TERMS = 62  # per sentence: one bit each in `placed` (int64)
# A row starts a term where its attention on the term's span is at least this many times its
# attention on any one source token outside it: an article before the term's noun, which attends
# to the article and the noun alike, does not start it (on the shipped de-en model, the share of
# terms placed where the model's own translation of them stood went from about 1/3 to about 4/9).
DOMINANCE = 2.0


@dataclass(frozen=True)
class SourceTerm:
    start: int  # the span's first source token (an index into the sentence's source ids)
    end: int  # past its last
    target: tuple[int, ...]  # the target tokens forced for it, at least one


@dataclass
class TermStep:
    """What the term rules decide for one step's rows (R,): the token forced on each row (-1:
    none) and the rows that may not end yet (terms missing)."""

    forced: np.ndarray
    no_eos: np.ndarray


def all_placed(n_terms: int) -> int:
    return (1 << n_terms) - 1


def decide(
    terms: Sequence[Sequence[SourceTerm]],
    at: np.ndarray,
    pos: np.ndarray,
    placed: np.ndarray,
    attention: np.ndarray,
    best: np.ndarray,
    live: np.ndarray,
    room: np.ndarray,
    eos_id: int,
) -> tuple[TermStep, np.ndarray]:
    """The step's forced tokens and </s> bans, and `at` updated where a row starts a term.
    terms: per row its sentence's terms; at, pos, placed: the rows' state; attention (R, S): the
    step's cross-attention; best (R,): each row's best token; live (R,) bool; room (R,): the
    tokens each row may still emit before its length limit ends it."""
    R = len(at)
    forced = np.full(R, -1, dtype=np.int64)
    no_eos = np.zeros(R, dtype=bool)
    at = at.copy()
    for r in np.flatnonzero(live).tolist():
        row_terms = terms[r]
        if not row_terms:
            continue
        done = int(placed[r])
        if at[r] < 0:
            missing = sum(len(t.target) for j, t in enumerate(row_terms) if not done >> j & 1)
            ending = int(best[r]) == eos_id or int(room[r]) <= missing
            at[r] = _start(row_terms, done, attention[r], ending)
        if at[r] >= 0:
            forced[r] = row_terms[int(at[r])].target[int(pos[r])]
        no_eos[r] = done != all_placed(len(row_terms))
    return TermStep(forced, no_eos), at


def _start(row_terms: Sequence[SourceTerm], done: int, att: np.ndarray, ending: bool) -> int:
    """The term a row starts now (-1: none): the unplaced one whose span holds the attended source
    token (`att`'s argmax) and DOMINANCE times the weight of any token outside it, else, where the
    row would end, the first unplaced one."""
    left = [j for j in range(len(row_terms)) if not done >> j & 1]
    attended = int(np.argmax(att))
    for j in left:
        t = row_terms[j]
        if t.start <= attended < t.end:
            outside = max(float(att[: t.start].max(initial=0.0)), float(att[t.end :].max(initial=0.0)))
            if float(att[t.start : t.end].sum()) >= DOMINANCE * outside:
                return j
    return left[0] if ending and left else -1


def advance(
    terms: Sequence[Sequence[SourceTerm]], at: np.ndarray, pos: np.ndarray, placed: np.ndarray, forced: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows' state after they emitted this step's forced tokens: a term whose last token went
    out is placed, and its row free to start another. Copies."""
    at, pos, placed = at.copy(), pos.copy(), placed.copy()
    for r in np.flatnonzero(forced >= 0).tolist():
        j = int(at[r])
        pos[r] += 1
        if pos[r] == len(terms[r][j].target):
            placed[r] |= 1 << j
            at[r], pos[r] = -1, 0
    return at, pos, placed


def landed(output: Sequence[int], row_terms: Sequence[SourceTerm]) -> list[tuple[int, int, int]]:
    """Where each term's target tokens stand in a finished output (token positions [start, end)),
    as (term, start, end), in output order; a term cut off by the length limit is missing."""
    out: list[tuple[int, int, int]] = []
    used = [False] * len(output)
    for j, term in enumerate(row_terms):
        n = len(term.target)
        for s in range(len(output) - n + 1):
            if not any(used[s : s + n]) and tuple(output[s : s + n]) == term.target:
                used[s : s + n] = [True] * n
                out.append((j, s, s + n))
                break
    return sorted(out, key=lambda t: t[1])


def term_tokens(terms: Sequence[SourceTerm]) -> list[int]:
    """Every token the terms may force (a shortlist must rank them)."""
    return [t for term in terms for t in term.target]


class TermRows:
    """The glossary terms of a `DecodeBatch`'s rows (its base, as `Search` is: the fields below
    are the batch's own)."""

    if not TYPE_CHECKING:  # no instance dict: `DecodeBatch` declares the slots of these fields
        __slots__ = ()

    beam: int
    eos_id: int
    done: np.ndarray
    max_len: np.ndarray
    positions: np.ndarray
    terms: list[tuple[SourceTerm, ...]]
    with_terms: np.ndarray
    term_at: np.ndarray
    term_pos: np.ndarray
    terms_placed: np.ndarray

    def _set_terms(self, n: int, terms: Sequence[Sequence[SourceTerm]] | None) -> None:
        """`from_sources`' terms of each of its n sentences, and its rows' state: nothing placed."""
        self.terms = [tuple(t) for t in terms] if terms is not None else [() for _ in range(n)]
        if len(self.terms) != n:
            raise ValueError(f"terms: {len(self.terms)} values for {n} sentences")
        if any(len(t) > MAX_TERMS for t in self.terms):
            raise ValueError(f"terms: at most {MAX_TERMS} a sentence")
        if any(not term.target for ts in self.terms for term in ts):
            raise ValueError("terms: a term forces at least one token")
        self.with_terms = np.array([bool(t) for t in self.terms], dtype=bool)
        R = n * self.beam
        self.term_at, self.term_pos, self.terms_placed = np.full(R, -1), np.zeros(R, np.int64), np.zeros(R, np.int64)

    def _per_row(self) -> list[tuple[SourceTerm, ...]]:
        K = self.beam
        return self.terms if K == 1 else [t for t in self.terms for _ in range(K)]

    def _term_step(self, best: np.ndarray, att: np.ndarray, prefix: np.ndarray | None) -> TermStep | None:
        """The terms' forced tokens and </s> bans at this step (None: no sentence has terms); rows
        at a forced `prefix` token (-1: none) start no term."""
        if not self.with_terms.any():
            return None
        K = self.beam
        live = ~(self.done if K == 1 else np.repeat(self.done, K))
        if prefix is not None:
            live &= prefix < 0
        room = (self.max_len if K == 1 else np.repeat(self.max_len, K)) - 1 - self.positions
        step, self.term_at = decide(
            self._per_row(), self.term_at, self.term_pos, self.terms_placed, att, best, live, room, self.eos_id
        )
        return step

    def _terms_advance(self, step: TermStep | None, rows: np.ndarray | None) -> None:
        """The rows' term state after this step's tokens; beams follow their parents (`rows`)."""
        if step is None:
            return
        at, pos, placed = advance(self._per_row(), self.term_at, self.term_pos, self.terms_placed, step.forced)
        if rows is not None:
            at, pos, placed = at[rows], pos[rows], placed[rows]
        self.term_at, self.term_pos, self.terms_placed = at, pos, placed

    def _landed(self, i: int, tokens: Sequence[int]) -> list[tuple[int, int, int]]:
        """Where sentence i's terms stand in its finished `tokens` (`Finished.terms`)."""
        return landed(tokens, self.terms[i]) if self.with_terms[i] else []
