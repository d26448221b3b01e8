"""Glossary terms forced by the search: constrained decoding over each term's target tokens,
placed where the model translates the term's source (or at a given output position).

A sentence may carry `SourceTerm`s: a span of its source tokens and the target tokens that must
stand for it in the output (a glossary's target, or the span's own text for a do-not-translate
phrase). Each row (a sentence's greedy row, or each of its beams) keeps its own state: the term it
is emitting and how far (`at`, `pos`), and which terms it has placed (`placed`, a bit per term).

At each step, before the search chooses, a row that is not emitting a term starts one
- where it writes the output position of a term it has not placed yet (`SourceTerm.position`,
  the position trigger: service.engine.placement finds it in a first pass without the terms), or
  past it (the first such term by position), or earlier where its best token is one the term
  replaces (`SourceTerm.replaces`: the first token of the model's own word for the term in that
  first pass, in any case: the model is about to write it, where a beam's words before it differ
  from the first pass's);
- for a term without a position (-1), where the step's cross-attention puts its weight (its
  argmax) on the term's source span, DOMINANCE times more than on any source token outside the
  span: the model is about to translate that term (the single-pass attention trigger); or
- where its best token is </s> while a term is still missing, or where the missing terms' tokens
  only just fit before the sentence's length limit: the term goes before the end.
A row emitting a term is given the term's next token alone (as a forced prefix token is), until
the term is out. Rows with terms left may not end otherwise (their </s> is banned), so every
hypothesis that ends holds every term once, unless the sentence reaches its length limit.

Where a row starts a term it remembers the tokens the term replaces (`SourceTerm.replaces`, else
its best token of that step: the model's own translation of the term's first word, as a rule;
not </s>, nor the term's first token): for BAN_STEPS steps after the term is out it may not
write them (beam: the candidates are dropped; greedy: the best other candidate takes the
place, so greedy steps rank GLUE_CANDIDATES candidates while a ban is pending), which keeps the
model from translating the term a second time ("canine dog", "lad Boy"). Before a positioned
term is out, a beam row may not take a replaced token as a candidate other than its best either
(its best starts the term): no beam writes "Boy" where "A lad" was to stand. At the step right
after a term the row may not write a word-internal piece either (the batch's `pieces` of the
sentence: vocabulary entries that continue a word), so that the term's last word is not
continued ("lad" + "den"). A sentence all of whose live rows' candidates these rules take keeps
them.

Sentences without terms are not touched: their rows never start one nor ban a token, and a
batch with no terms at all skips this module.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

NEG_INF = float("-inf")
MAX_TERMS = 62  # per sentence: one bit each in `placed` (int64)
# A row starts a term where its attention on the term's span is at least this many times its
# attention on any one source token outside it: an article before the term's noun, which attends
# to the article and the noun alike, does not start it (on the shipped de-en model, the share of
# terms placed where the model's own translation of them stood went from about 1/3 to about 4/9).
DOMINANCE = 2.0
# The steps after a term's last token in which the row may not write the token it wanted where
# the term started (its own translation of the term, which it would otherwise write again a few
# words on: "hits the liquid in the water"): on the shipped models at beam 4, with two passes and
# the replaced token as a trigger, 6 steps placed 0.915 of the benchmark's terms where the model's
# word stood, 2 steps 0.91.
BAN_STEPS = 6
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


@dataclass(frozen=True)
class SourceTerm:
    start: int  # the span's first source token (an index into the sentence's source ids)
    end: int  # past its last
    target: tuple[int, ...]  # the target tokens forced for it, at least one
    # The output position (an index into the sentence's output tokens, a language token not
    # counted) at which the term starts: the position trigger; -1: the attention trigger.
    position: int = -1
    # The tokens the term replaces there (the first of the words the model wrote for it without
    # the term, in each case the vocabulary has: "▁boy", "▁Boy", "▁BOY"), banned around it in
    # place of the row's best token; empty: the row's best token.
    replaces: tuple[int, ...] = ()

    @functools.cached_property
    def replaced(self) -> tuple[int, ...]:
        """The tokens the term replaces but its own first (worked out once: a step asks per row)."""
        return tuple(t for t in self.replaces if t != self.target[0])


@dataclass
class TermStep:
    """What the term rules decide for one step's rows (R,): the token forced on each row (-1:
    none), the rows that may not end yet (terms missing), the tokens each row may not write
    (the ones it wanted where the term it just placed started, and a beam row's replaced tokens
    of a term still to come) and the rows whose term ended at the last step (`glued`: they may
    not write a word-internal piece now)."""

    forced: np.ndarray
    no_eos: np.ndarray
    banned: list[tuple[int, ...]]
    glued: np.ndarray
    # (R, k) the step's candidates a row may not take: the word-internal pieces of a `glued`
    # row (`TermRows._term_step`); None: none.
    dropped: np.ndarray | None = None
    # Whether a sentence had every candidate of its live rows dropped, and keeps them all.
    kept_whole: bool = False


@dataclass
class TermState:
    """The rows' term state (R,) each: the term a row is emitting (-1: none) and its next token
    (`pos`), the terms it placed (bits), what it may not write after its last term (`ban`: the
    term whose `replaces` are banned, or -2 - the token it wanted where the term started; -1:
    nothing) and the steps left in which that ban holds."""

    at: np.ndarray
    pos: np.ndarray
    placed: np.ndarray
    ban: np.ndarray
    ban_left: np.ndarray

    @classmethod
    def new(cls, R: int) -> TermState:
        z = np.zeros(R, np.int64)
        return cls(np.full(R, -1, np.int64), z, z.copy(), np.full(R, -1, np.int64), z.copy())

    def take(self, rows: np.ndarray) -> TermState:
        return TermState(self.at[rows], self.pos[rows], self.placed[rows], self.ban[rows], self.ban_left[rows])


def _banned(row_terms: Sequence[SourceTerm], ban: int) -> tuple[int, ...]:
    """The tokens a row's `TermState.ban` stands for."""
    if ban >= 0:
        return row_terms[ban].replaced
    return (-2 - ban,) if ban <= -2 else ()


def all_placed(n_terms: int) -> int:
    return (1 << n_terms) - 1


def decide(
    terms: Sequence[Sequence[SourceTerm]],
    state: TermState,
    attention: np.ndarray,
    best: np.ndarray,
    live: np.ndarray | Sequence[bool],
    room: np.ndarray | Sequence[int],
    eos_id: int,
    at_output: np.ndarray | Sequence[int] | None = None,
    ahead: bool = False,
) -> tuple[TermStep, TermState]:
    """The step's forced tokens, </s> bans and banned tokens, and the state of the rows that start
    a term (its `at`, and what the row may not write after it as its `ban`). terms: per row its
    sentence's terms; state: the rows' (not changed); attention (R, S): the step's
    cross-attention; best (R,): each row's best token; live (R,) bool; room (R,): the tokens each
    row may still emit before its length limit ends it; at_output (R,): the output position each
    row writes at this step (None: no term has a position); ahead: the rows are beams, which may
    not write a replaced token of a positioned term to come either."""
    R = len(state.at)
    # Python scalars: a step looks at a few rows, where numpy's cost per element would dominate.
    forced, no_eos, glued = [-1] * R, [False] * R, [False] * R
    banned: list[tuple[int, ...]] = [()] * R
    at, ban = state.at.tolist(), state.ban.tolist()
    placed, pos, ban_left = state.placed.tolist(), state.pos.tolist(), state.ban_left.tolist()
    live_rows = live.tolist() if isinstance(live, np.ndarray) else live
    here_all = at_output.tolist() if isinstance(at_output, np.ndarray) else at_output
    for r in range(R):
        row_terms = terms[r]
        if not row_terms or not live_rows[r]:
            continue
        done = placed[r]
        full = done == all_placed(len(row_terms))
        j = at[r]
        if j < 0 and not full:
            missing = sum(len(t.target) for k, t in enumerate(row_terms) if not done >> k & 1)
            wanted_now = int(best[r])
            ending = wanted_now == eos_id or int(room[r]) <= missing
            here = here_all[r] if here_all is not None else -1
            j = _start(row_terms, done, attention[r], ending, here, wanted_now)
            if j >= 0:
                term = row_terms[j]
                if term.replaces:
                    ban[r] = j
                else:
                    ban[r] = -2 - wanted_now if wanted_now != eos_id and wanted_now != term.target[0] else -1
                at[r] = j
        if j < 0:
            glued[r] = ban_left[r] == BAN_STEPS  # its last token was a term's last
            avoid = _banned(row_terms, ban[r]) if ban_left[r] > 0 else ()
            if ahead and not full:
                avoid += tuple(
                    t
                    for k, term in enumerate(row_terms)
                    if not done >> k & 1 and term.position >= 0
                    for t in term.replaced
                )
            banned[r] = avoid
        else:
            forced[r] = row_terms[j].target[pos[r]]
        no_eos[r] = not full
    step = TermStep(np.array(forced, dtype=np.int64), np.array(no_eos, dtype=bool), banned, np.array(glued, dtype=bool))
    at_a, ban_a = np.array(at, dtype=np.int64), np.array(ban, dtype=np.int64)
    return step, TermState(at_a, state.pos, state.placed, ban_a, state.ban_left)


def _start(
    row_terms: Sequence[SourceTerm], done: int, att: np.ndarray, ending: bool, here: int = -1, best: int = -1
) -> int:
    """The term a row starts now (-1: none): of the unplaced ones with a position, the first
    whose position the row has reached (`here`) or of whose replaced tokens the row's best is one
    (`best`: the model is about to write its own word for the term, where a beam's words before
    it differ from pass 1's); else of those without, the one whose span holds the attended
    source token (`att`'s argmax) and DOMINANCE times the weight of any token outside it; else,
    where the row would end, the first unplaced one."""
    left = [j for j in range(len(row_terms)) if not done >> j & 1]
    due = [
        j
        for j in left
        if row_terms[j].position >= 0 and (row_terms[j].position <= here or best in row_terms[j].replaces)
    ]
    if due:
        return min(due, key=lambda j: row_terms[j].position)
    attended = int(np.argmax(att))
    for j in left:
        t = row_terms[j]
        if t.position < 0 and t.start <= attended < t.end:
            outside = max(float(att[: t.start].max(initial=0.0)), float(att[t.end :].max(initial=0.0)))
            if float(att[t.start : t.end].sum()) >= DOMINANCE * outside:
                return j
    return left[0] if ending and left else -1


def advance(terms: Sequence[Sequence[SourceTerm]], state: TermState, forced: np.ndarray) -> TermState:
    """The rows' state after they emitted this step's forced tokens: a term whose last token went
    out is placed, its row free to start another and its `ban` (if any) in force for BAN_STEPS
    steps (`ban_left` == BAN_STEPS also marks the step right after a term: `TermStep.glued`); the
    other rows have one step of their ban fewer left. Copies."""
    at, pos, placed, ban_left = state.at.tolist(), state.pos.tolist(), state.placed.tolist(), state.ban_left.tolist()
    for r, token in enumerate(forced.tolist()):
        if token < 0:
            if ban_left[r] > 0:
                ban_left[r] -= 1
            continue
        j = at[r]
        pos[r] += 1
        if pos[r] == len(terms[r][j].target):
            placed[r] |= 1 << j
            at[r], pos[r] = -1, 0
            ban_left[r] = BAN_STEPS
    at_a, pos_a, placed_a, ban_left_a = (np.array(a, dtype=np.int64) for a in (at, pos, placed, ban_left))
    return TermState(at_a, pos_a, placed_a, state.ban.copy(), ban_left_a)


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
