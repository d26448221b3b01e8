"""Where a sentence's glossary terms go: two decoding passes for the rows that have terms.

Pass 1 decodes such a row without its terms (greedy: `FIRST_PASS_BEAM`), with its alignment (the
last decoder layer's cross-attention of each output token). Each term's place is read off it
(`positioned`): the output word whose tokens put the most attention on the term's source span
(column-wise over the whole output, far steadier than one step's attention), widened to the
contiguous run of words around it whose tokens attend to the span most of all (a phrase of
several words); the term takes the run's place. Pass 2 decodes the row with each term forced to
start at that output position (`SourceTerm.position`, moved by the length of the terms before
it), the first token of the run, in each of its cases ("▁boy", "▁Boy"), kept out of the
beams before it and banned for a few steps after it (`SourceTerm.replaces`), and the search
free everywhere else (service.decoding.terms). Pass 2 goes on from pass 1's decoder state
(`resumed`, service.decoding.resume): pass 1's tokens before the first term are its forced
prefix, and neither the encoder nor their steps run again.

Where the attention gives a term no place (no output token puts MIN_SHARE of its attention on
the span, or the run reaches pass 1's cut), the model's own word for the term does: a pass
between, for those rows alone, decodes each of their terms' source spans alone (`alone`), and
where the first token of that translation's last word (`anchor`, in any case) starts exactly one
word of pass 1's output, the term takes that word's place. A term still without a place (or whose run overlaps another term's) keeps
the single-pass attention trigger; so do the rows of a
sampling request (two draws would not agree on where a word stands) and TranslateStream's rows
(service.engine.streaming), which stream from one pass. Rows without terms go to the queue with
pass 1 and decode once, as without a glossary.

`target_words` walks the target vocabulary once for its word-internal pieces, which the search
bans right after a term (no "lad" + "den"), and for the tokens that differ only in case.
"""

from __future__ import annotations

import asyncio
import functools
import time
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from service.batching.jobs import Sentence, settle
from service.decoding.results import Finished
from service.decoding.resume import Resume
from service.decoding.terms import SourceTerm
from service.engine.backend import Backend
from service.errors import ServiceError
from service.runtime.tokenizer import WORD_STARTS, TextTokenizer

# The beam of pass 1, whatever the request's: on the shipped models (int8) at beam 4, before the
# replaced-token trigger of service.decoding.terms, a greedy
# pass 1 placed 0.865 of the benchmark's terms where the model's word stood, at 1.67x the cost of
# no glossary; one at beam 4, 0.82 at 1.69x (docs/terminology.md).
FIRST_PASS_BEAM = 1
# The least share of one output token's attention on a term's span for pass 1 to place the term.
MIN_SHARE = 0.2
# Pass 1 decodes at most this many tokens more than the source tokens up to the end of the last
# term's span: a term's translation stands about where its source does, and pass 1 costs what it
# decodes (on the shipped models, 1 placed 0.725 of the terms, 4 and 8 0.865).
LOOKAHEAD = 4
# The tokens a term's translation alone may take beyond two for each source token.
ALONE_EXTRA = 4
# The rows with terms of one request whose pass 2 goes on from pass 1's state, at most: a state
# holds a row's keys and values (for a sentence of 20 source tokens and 15 decoded, about 0.9 MB at
# OPUS-MT's size, 3.4 MB at NLLB-600M's) from pass 1's end until pass 2 joins a batch, and a long
# document's rows would queue many of them.
# A request of more decodes pass 2 from the start.
MAX_RESUMED_ROWS = 16
# `Anchoring`: the share of a model's rows with a term the attention places nowhere from which
# their spans decode beside pass 1, and the weight of the rows before the last in that share
# (about the last 20 rows). On the shipped models 7 of the benchmark's 200 rows need their spans;
# on the random real-size model, all of them.
EAGER_SHARE = 0.5
ANCHOR_DECAY = 0.95
# The words around the one that attends most to a term's span that attend to it at least this
# share as much: the run of words that translate it. A row attends to the source word it is
# about to translate, so an article's row often puts as much on the noun as the noun's: the term
# takes the run's last words (one per source token of the span), not its first.
RUN_SHARE = 0.5


@dataclass(frozen=True)
class TargetWords:
    """What placement and the search need of a target vocabulary: its entries that continue a
    word ((V,) bool: no word-start mark, and a letter or digit first; ids without an entry do
    not), and, for each token with others that differ from it in case alone, all of them."""

    pieces: np.ndarray
    cases: Mapping[int, tuple[int, ...]]
    # (V,) bool: the entries that hold a letter or digit first, after any word-start mark.
    letters: np.ndarray

    def spellings(self, token: int) -> tuple[int, ...]:
        """`token` and the tokens that differ from it in case alone."""
        return self.cases.get(token, (token,))


def target_words(tokenizer: TextTokenizer, vocab_size: int) -> TargetWords:
    pieces = np.zeros(vocab_size, dtype=bool)
    letters = np.zeros(vocab_size, dtype=bool)
    by_folded: dict[str, list[int]] = {}
    for i in range(vocab_size):
        piece = tokenizer.id_to_token(i)
        if not piece:
            continue
        bare = piece[1:] if piece.startswith(WORD_STARTS) else piece
        letters[i] = bool(bare) and unicodedata.category(bare[0])[0] in "LN"
        pieces[i] = letters[i] and bare == piece
        by_folded.setdefault(piece.casefold(), []).append(i)
    cases = {i: tuple(ids) for ids in by_folded.values() if len(ids) > 1 for i in ids}
    return TargetWords(pieces, cases, letters)


def two_pass(s: Sentence) -> bool:
    """Whether a queued row is placed in two passes: it has terms and does not sample."""
    return bool(s.terms) and s.sampling is None


def first_pass(s: Sentence, keep_state: bool = True) -> Sentence:
    """Pass 1 of a row: the row without its terms, greedy (FIRST_PASS_BEAM, or the row's beam if
    narrower), with its alignment and (`keep_state`) its decoder state; a sentence of its own
    (future, key)."""
    beam = min(FIRST_PASS_BEAM, s.beam)
    reach = len(s.target_prefix) + len(s.output_prefix) + max(t.end for t in s.terms) + LOOKAHEAD
    return s.again(
        max_len=min(s.max_len, reach),
        terms=(),
        pieces=None,
        beam=beam,
        length_penalty=s.length_penalty if beam == s.beam else 1.0,
        num_hypotheses=1,
        want_alignment=True,
        want_scores=beam > 1,
        on_tokens=None,
        keep_state=keep_state and beam == 1,
        arriving_rows=s.beam,  # the request arrives with it, and is answered with pass 2
        answered_rows=0,
    )


def alone(s: Sentence, term: SourceTerm, lead: int) -> Sentence:
    """A greedy row of the term's source span alone (after the `lead` tokens that open every
    source row, and before its </s>): the model's own word for it, which `anchor` reads."""
    return s.again(
        src_ids=[*s.src_ids[:lead], *s.src_ids[term.start : term.end], s.src_ids[-1]],
        max_len=len(s.target_prefix) + 2 * (term.end - term.start) + ALONE_EXTRA,
        min_len=0,
        output_prefix=[],
        terms=(),
        pieces=None,
        beam=1,
        length_penalty=1.0,
        num_hypotheses=1,
        want_alignment=False,
        want_scores=False,
        on_tokens=None,
        keep_state=False,
        arriving_rows=0,
        answered_rows=0,
    )


def anchor(tokens: Sequence[int], words: TargetWords) -> tuple[int, ...]:
    """The spellings of the first token of the last word of `tokens` (a term's translation
    alone) that starts with a letter or digit ("street" of "A street."); empty: none."""
    starts = [
        i for i in _words(tokens, words.pieces) if 0 <= tokens[i] < len(words.letters) and words.letters[tokens[i]]
    ]
    return words.spellings(int(tokens[starts[-1]])) if starts else ()


def _words(tokens: Sequence[int], pieces: np.ndarray) -> list[int]:
    """The first token of each word of `tokens` (a token that is not a word-internal piece starts one)."""
    return [i for i, t in enumerate(tokens) if i == 0 or not (0 <= t < len(pieces) and pieces[t])]


def _attended(term: SourceTerm, att: np.ndarray, bounds: Sequence[int]) -> tuple[int, int] | None:
    """The tokens [a, b) of the run of words that attend most to the term's span (module doc);
    None where no word puts MIN_SHARE of a token's attention on it."""
    on_span = att[:, term.start : term.end].sum(axis=1)
    weight = np.array([on_span[a:b].max() for a, b in zip(bounds, bounds[1:])])  # per word
    best = int(np.argmax(weight))
    if weight[best] < MIN_SHARE:
        return None
    strong = weight >= weight[best] * RUN_SHARE
    lo = hi = best
    while lo > 0 and strong[lo - 1]:
        lo -= 1
    while hi + 1 < len(weight) and strong[hi + 1]:
        hi += 1
    lo = max(lo, hi + 1 - (term.end - term.start))  # its last words, at most one a source token
    return bounds[lo], bounds[hi + 1]


def _named(anchor: tuple[int, ...], tokens: Sequence[int], bounds: Sequence[int]) -> tuple[int, int] | None:
    """The tokens [a, b) of the one word of `tokens` that starts with a token of `anchor` (the
    spellings of the first token of the model's word for the term alone); None where no word or
    more than one does."""
    at = [(a, b) for a, b in zip(bounds, bounds[1:]) if tokens[a] in anchor]
    return at[0] if len(at) == 1 else None


def positioned(
    terms: Sequence[SourceTerm],
    tokens: Sequence[int],
    alignment: np.ndarray | None,
    words: TargetWords,
    cut: bool = False,
    anchors: Sequence[tuple[int, ...]] = (),
) -> tuple[SourceTerm, ...]:
    """`terms` with the output positions pass 1's output (`tokens`, `alignment`: (len(tokens) +
    1, S)) gives them (module doc); a term it gives none keeps position -1. `cut`: pass 1 reached
    its length limit, so a run of words that reaches its end may go on past it (no position).
    `anchors`: per term, the spellings of the first token of the last word of its span's
    translation alone (empty: none), whose one occurrence places a term the attention does not."""
    n = len(tokens)
    if alignment is None or n == 0 or len(alignment) < n:
        return tuple(terms)
    att = np.asarray(alignment[:n], dtype=np.float64)
    starts = _words(tokens, words.pieces)
    bounds = [*starts, n]
    runs: list[tuple[int, int] | None] = []  # per term: the tokens [a, b) it replaces
    for j, term in enumerate(terms):
        run = _attended(term, att, bounds)
        if run is not None and cut and run[1] == n:
            run = None  # it may go on past the cut
        if run is None and j < len(anchors) and anchors[j]:
            run = _named(anchors[j], tokens, bounds)
        if run is None:
            runs.append(None)
            continue
        if any(r is not None and r[0] < run[1] and run[0] < r[1] for r in runs):
            runs.append(None)  # the place of another term
            continue
        runs.append(run)
    shift = {}  # the output position of each placed term in pass 2: its run's, moved by the terms before it
    moved = 0
    for j in sorted((j for j, r in enumerate(runs) if r is not None), key=lambda j: runs[j][0]):  # type: ignore[index]
        a, b = runs[j]  # type: ignore[misc]
        shift[j] = a + moved
        moved += len(terms[j].target) - (b - a)
    return tuple(
        SourceTerm(t.start, t.end, t.target, shift[j], words.spellings(int(tokens[runs[j][0]])))  # type: ignore[index]
        if j in shift
        else t
        for j, t in enumerate(terms)
    )


def resumed(s: Sentence, draft: Finished) -> Resume | None:
    """Where pass 2 of `s` (its terms positioned) may go on from pass 1's decoder state (`draft`):
    from the first term's position, pass 1's tokens before it forced (service.decoding.resume).
    None where pass 2 decodes from the start: pass 1 kept no state (an engine process), or a term
    has no position (the attention trigger may start it anywhere)."""
    state = draft.state
    if state is None or not s.terms or any(t.position < 0 for t in s.terms) or draft.alignment is None:
        return None
    lead = len(s.target_prefix)
    first = min(t.position for t in s.terms)
    upto = lead + first
    if first < len(s.output_prefix) or upto >= s.max_len - 1:
        return None
    if state.tokens[lead:upto] != list(draft.tokens[:first]) or upto > min(state.inputs, len(state.tokens) - 1):
        return None
    return Resume(state, upto, np.ascontiguousarray(draft.alignment[:first]))


class Anchoring:
    """How often a model's rows have a term the attention gives no place: a moving average over
    its last rows with terms (ANCHOR_DECAY). Where most do (a model whose attention singles out no
    word, as the random one of benchmarks/real_size_model.py), each row's terms' spans decode
    alone beside pass 1 (`eager`), a few more rows in pass 1's steps; else only for the rows that
    need them, after pass 1: a pass more, for those rows alone."""

    def __init__(self, share: float = 0.0):
        self.share = share

    @property
    def eager(self) -> bool:
        return self.share >= EAGER_SHARE

    def record(self, lacking: bool) -> None:
        self.share = ANCHOR_DECAY * self.share + (1.0 - ANCHOR_DECAY) * float(lacking)


class Decoding:
    """A request's rows under way: those with terms in two passes (`two_pass`), the others queued
    with their pass 1 and decoded once. Made on the event loop, it queues the first pass (all the
    rows, or none: the backend's error); `results` awaits them, places the terms and queues pass
    2, where the worker that finished pass 1 did not (`_continue`)."""

    def __init__(
        self,
        backend: Backend,
        sentences: list[Sentence],
        words: TargetWords,
        lead: int = 0,
        anchoring: Anchoring | None = None,
    ):
        self.backend, self.sentences, self.words, self.lead = backend, sentences, words, lead
        self.anchoring = anchoring if anchoring is not None else Anchoring()
        self.twice = [i for i, s in enumerate(sentences) if two_pass(s)]
        keep = len(self.twice) <= MAX_RESUMED_ROWS
        self.firsts = [first_pass(sentences[i], keep) for i in self.twice]
        for k, first in enumerate(self.firsts):
            first.then = functools.partial(self._continue, k)
        self.continued: set[int] = set()  # the rows whose pass 2 a worker queued (`_continue`)
        self.judged: set[int] = set()  # the rows `anchoring` counted
        # Each row's terms' spans alone (`anchor`; `lead`: the tokens that open every source row, a
        # source language's): beside pass 1 where the model's rows mostly need them, else later.
        self.spans: dict[int, list[Sentence]] = {}
        if self.anchoring.eager:
            self.spans = {k: self._alone(k) for k in range(len(self.twice))}
        self.once = [s for s in sentences if not two_pass(s)]
        backend.submit(self.firsts + [a for row in self.spans.values() for a in row] + self.once)

    async def results(self) -> list[Finished]:
        """Each row's `Finished`, in order. A failure or cancellation of any row, in any pass,
        cancels them all."""
        rows = [asyncio.wrap_future(s.future) for s in self.sentences]
        # A failure or cancellation takes the spans decoding beside pass 1 along too.
        every = rows + [asyncio.wrap_future(a.future) for row in self.spans.values() for a in row]
        if self.twice:
            drafts = await _gather([asyncio.wrap_future(s.future) for s in self.firsts], every)
            for first in self.firsts:
                first.then = None  # no cycle through this Decoding left for the collector
            left = [k for k in range(len(self.twice)) if k not in self.continued]
            placed = {k: self._positioned(k, drafts[k]) for k in left}
            lacking = [k for k in left if any(t.position < 0 for t in placed[k])]
            for k in left:
                self._judge(k, k in lacking)
            if lacking:
                later = {k: self._alone(k) for k in lacking if k not in self.spans}
                self.spans.update(later)
                self._submit([a for row in later.values() for a in row], every)
                words = iter(
                    await _gather([asyncio.wrap_future(a.future) for k in lacking for a in self.spans[k]], every)
                )
                for k in lacking:
                    anchors = [anchor(next(words).tokens, self.words) for _ in self.spans[k]]
                    placed[k] = self._positioned(k, drafts[k], anchors)
            for k in left:
                self._second(k, drafts[k], placed[k])
            self._submit([self._row(k) for k in left], every)
        return await _gather(rows, every)

    def _continue(self, k: int, draft: Finished) -> bool:
        """Pass 1 of row k finished (`draft`), on the worker thread that decoded it: where its
        terms are placed (by the attention, or by their spans alone decoded already), queue pass 2
        from here and settle pass 1's future once pass 2 is done (the event loop wakes once, for
        both); else (or where the queue refuses) leave the row to `results`."""
        placed = self._positioned(k, draft)
        if any(t.position < 0 for t in placed):
            self._judge(k, True)
            spans = self.spans.get(k)
            if not spans or not all(a.future.done() and not a.future.cancelled() for a in spans):
                return False
            if any(a.future.exception() is not None for a in spans):
                return False
            placed = self._positioned(k, draft, [anchor(a.future.result().tokens, self.words) for a in spans])
        else:
            self._judge(k, False)
        s, first = self._row(k), self.firsts[k]
        before = (s.terms, s.resume, s.arriving_rows, s.enqueued, draft.state)
        self._second(k, draft, placed)
        try:
            self.backend.submit([s])
        except ServiceError:  # refused (a full queue, a draining server): `results` says so
            s.terms, s.resume, s.arriving_rows, s.enqueued, draft.state = before
            return False
        self.continued.add(k)
        s.future.add_done_callback(lambda _: settle(first.future, result=draft))
        return True

    def _judge(self, k: int, lacking: bool) -> None:
        """Row k's placement, counted once in the model's `Anchoring`."""
        if k not in self.judged:
            self.judged.add(k)
            self.anchoring.record(lacking)

    def _alone(self, k: int) -> list[Sentence]:
        s = self._row(k)
        return [alone(s, t, self.lead) for t in s.terms]

    def _row(self, k: int) -> Sentence:
        return self.sentences[self.twice[k]]

    def _positioned(self, k: int, draft: Finished, anchors: Sequence[tuple[int, ...]] = ()) -> tuple[SourceTerm, ...]:
        """Row k's terms placed by its pass 1 (`draft`; `anchors`: `positioned`'s)."""
        first = self.firsts[k]
        cut = len(draft.tokens) + 1 >= first.max_len - len(first.target_prefix)
        return positioned(self._row(k).terms, draft.tokens, draft.alignment, self.words, cut, anchors)

    def _second(self, k: int, draft: Finished, terms: tuple[SourceTerm, ...]) -> None:
        """Row k made its pass 2: its terms placed, going on from pass 1's state where it can."""
        s = self._row(k)
        s.terms = terms
        s.resume = resumed(s, draft)
        s.arriving_rows = 0  # it arrived with pass 1
        s.enqueued = time.monotonic()
        draft.state = None  # the resume holds it, until the row joins a batch

    def _submit(self, sentences: list[Sentence], rows: list[asyncio.Future]) -> None:
        """Queue a later pass; should the backend refuse it, the request's rows go too."""
        if not sentences:
            return
        try:
            self.backend.submit(sentences)
        except BaseException:
            for f in rows:
                f.cancel()
            raise


async def _gather(futures: list[asyncio.Future], others: list[asyncio.Future]) -> list[Finished]:
    """The results of `futures`; on any failure or cancellation these and `others` are cancelled
    (a failed or cancelled request frees all its rows)."""
    try:
        return list(await asyncio.gather(*futures))
    except BaseException:
        for f in [*futures, *others]:
            f.cancel()
        raise
