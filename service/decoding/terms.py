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
