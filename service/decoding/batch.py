"""A running batch of sentences (`DecodeBatch`): greedy and beam search over the ONNX graphs, in
numpy, built for continuous batching.

It reproduces exactly the semantics of the PyTorch reference (export/generate.py):
- the source is `ids + [</s>]` (a multilingual model's source language token first); decoding
  starts from the model's decoder start token (`<s>` for mtserve's own models) at position 0;
- a target prefix is forced first (it counts as emitted and is left out of the output), </s> is
  banned before `min_len` output tokens and forced at the last of `max_len = min(floor(a * src_len
  + b), max_positions - 1)` tokens (`service.decoding.output_rules`);
- beam search ranks finished hypotheses by `sum(log p) / len ** length_penalty` (`len` counts
  `</s>`); at each step the `2 * beam` best candidates of a sentence are taken, those ending in
  `</s>` finish when ranked within the first `beam`, the best `beam` others go on; a sentence
  stops once `beam` hypotheses have finished, at its last allowed step, or when nothing goes on;
- `beam == 1` is greedy search (score = plain sum of log-probabilities).

The state of a running batch is a `DecodeBatch` (the text-generation-inference `Seq2SeqLMBatch`
pattern): every row carries its own self-attention cache (`service.decoding.cache`: the portable
graph's, or the fused graph's in-place buffers), position and score, so rows at different steps
share a decoder call. A sentence occupies `beam` consecutive rows and carries its source mask and
cross-attention keys/values once, for all its beams (the graph folds them into the query):

    batch = DecodeBatch.from_sources(model, src_ids_lists, keys, beam=4)   # encoder pass
    while len(batch):
        for f in batch.step(model):           # one decoder step for every row
            reply(f.key, f.tokens, f.score)   # sentences that finished at this step
        batch.filter(batch.active_keys())      # drop finished (and cancelled) sentences
        batch = DecodeBatch.concatenate([batch, DecodeBatch.from_sources(...)])  # admit new ones

Its parts, in `service.decoding`: `encoder` (the encoder pass), `output_rules` (what a step may
emit; `terms`, the glossary terms it forces, and `term_rows`, the rows' term state), `search`
(greedy and beam search over a step's candidates), `layout` (its fields through `filter` and
`concatenate`, `LaidOut`), `results` (what it returns), `resumed_rows` (rows that keep their
decoder state or go on from one: `resume`); `generator.generate` is the offline loop.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from service.decoding.cache import RowCache, StepResult
from service.decoding.concat_cache import ConcatCache
from service.decoding.encoder import encode_sources
from service.decoding.in_place_cache import new_cache
from service.decoding.layout import (
    LaidOut,
    as_list,
    batch_wide,
    layouts,
    out_width,
    per,
    zeros,
)
from service.decoding.model import DecoderModel
from service.decoding.output_rules import NEG_INF, OutputRules, max_output_len
from service.decoding.results import Ended, Finished, Node
from service.decoding.resume import Resume, encoded
from service.decoding.resumed_rows import ResumedRows, resumed_prefixes
from service.decoding.sampling import Sampling
from service.decoding.search import Search
from service.decoding.terms import SourceTerm, term_tokens

_NO_IDS = np.zeros(0, dtype=np.int64)  # a sentence's shortlist candidates where the model has no shortlist


@dataclass(eq=False, repr=False, slots=True)
class DecodeBatch(Search, ResumedRows, LaidOut):
    """Decoding state of a set of sentences, `beam` consecutive rows each (see the module doc).

    Every field declares its `Layout`: batch-wide, per sentence (n of them) or per row (R = n x
    beam). `filter` and `concatenate` carry the fields by these declarations, so a field added
    here follows the batch through both, and one without a layout fails at import (in a subclass:
    at its first filter or concatenate). The slots make an undeclared attribute an error too."""

    beam: int = batch_wide()
    eos_id: int = batch_wide()
    pad_id: int = batch_wide()

    # -- per sentence ---------------------------------------------------------
    keys: list[Hashable] = per("sentence", list)
    max_len: np.ndarray = per("sentence", zeros(0, dtype=np.int64))  # tokens it may emit, </s> included
    length_penalty: np.ndarray = per("sentence", zeros(0, dtype=np.float64))
    want_alignment: np.ndarray = per("sentence", zeros(0, dtype=bool))
    # Greedy search skips the log-probabilities while no live sentence asks for its score.
    want_scores: np.ndarray = per("sentence", zeros(0, dtype=bool))
    src_lens: np.ndarray = per("sentence", zeros(0, dtype=np.int64))  # real source length, </s> included
    done: np.ndarray = per("sentence", zeros(0, dtype=bool))
    steps: np.ndarray = per("sentence", zeros(0, dtype=np.int64))  # decoder steps taken
    finished: list[list[Ended]] = per("sentence", list)  # hypotheses ended so far (beam search)
    src_mask: np.ndarray = per("sentence", zeros(0, 0, dtype=np.int64), padded="source")  # (n, S) int64
    # Per decoder layer the cross-attention keys and values (n, H, S, d_k), once for all beams.
    cross_k: list[np.ndarray] = per("sentence", list, padded="source", layers=True)
    cross_v: list[np.ndarray] = per("sentence", list, padded="source", layers=True)
    # The tokens forced first on each sentence's output: a language token, left out of it, then a
    # requested target prefix, kept in it; where its output starts (after the left-out tokens);
    # and the position from which it may end: its min_len after that start, past its prefix.
    target_prefix: list[list[int]] = per("sentence", list)
    prefix_len: np.ndarray = per("sentence", zeros(0, dtype=np.int64))
    output_from: np.ndarray = per("sentence", zeros(0, dtype=np.int64))
    eos_from: np.ndarray = per("sentence", zeros(0, dtype=np.int64))
    # Beam search: the finished hypotheses a sentence returns (its n-best list when > 1).
    num_hypotheses: np.ndarray = per("sentence", zeros(0, dtype=np.int64))
    # Greedy only: how each sentence samples its tokens (None: it takes the best), and whether any does.
    sampling: list[Sampling | None] = per("sentence", list)
    samples: np.ndarray = per("sentence", zeros(0, dtype=bool))
    # Greedy only: the token each sentence emitted at the last step, by key (`last_tokens`).
    last_emitted: dict[Hashable, list[int]] = per("sentence", dict)
    # Where the model ranks over a vocabulary shortlist (`DecoderModel.shortlist`): each sentence's
    # own candidates, its source tokens' rows and its forced tokens (`Shortlist.candidates`);
    # the cache makes the batch's vocab_ids of them when its sentences change. Else empty arrays.
    vocab: list[np.ndarray] = per("sentence", list)
    terms: list[tuple[SourceTerm, ...]] = per("sentence", list)  # glossary terms (`service.decoding.terms`)
    with_terms: np.ndarray = per("sentence", zeros(0, dtype=bool))  # whether it has any
    # The word-internal pieces of its target vocabulary, (V,) bool, banned right after a term; None: none.
    term_pieces: list[np.ndarray | None] = per("sentence", list)
    # Greedy only: whether its `Finished` carries its decoder state (service.decoding.resume).
    keep_state: np.ndarray = per("sentence", zeros(0, dtype=bool))

    # -- per row --------------------------------------------------------------
    # The self-attention keys and values of every row, with which entries are the row's own (a
    # row that joined late has padding before them); it selects and concatenates itself.
    cache: RowCache = per("row", lambda: ConcatCache([], [], np.zeros((0, 0), dtype=np.float32)))
    positions: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the position of the next input token
    tokens: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the next input token
    # float32; greedy: the sum of log-probabilities, beam: the beam's cumulative score
    scores: np.ndarray = per("row", zeros(0, dtype=np.float32))
    # The output so far: beam search's linked nodes (token, attention row, parent); greedy search
    # keeps its tokens in `out_ids` instead (column t: the token emitted at position t), written
    # for all rows in one call a step, and here only the attention rows of those that want them.
    hist: list[Node | None] = per("row", list)
    out_ids: np.ndarray = per("row", zeros(0, 0, dtype=np.int64), padded="output")  # (R, T) greedy
    term_at: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the term it is emitting (-1: none)
    term_pos: np.ndarray = per("row", zeros(0, dtype=np.int64))  # that term's next token
    terms_placed: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the terms it placed (bits)
    term_ban: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the token it wanted where its last term started
    term_ban_left: np.ndarray = per("row", zeros(0, dtype=np.int64))  # the steps that token stays banned

    # -- construction ---------------------------------------------------------

    @classmethod
    def from_sources(
        cls,
        model: DecoderModel,
        src_ids_lists: Sequence[Sequence[int]],
        keys: Sequence[Hashable],
        beam: int = 1,
        length_penalty: float | Sequence[float] = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        want_alignment: bool | Sequence[bool] = False,
        max_lens: Sequence[int] | None = None,
        want_scores: bool | Sequence[bool] = True,
        min_lens: int | Sequence[int] = 0,
        target_prefixes: Sequence[Sequence[int]] | None = None,
        kept_prefixes: Sequence[Sequence[int]] | None = None,
        num_hypotheses: int | Sequence[int] = 1,
        sampling: Sequence[Sampling | None] | None = None,
        terms: Sequence[Sequence[SourceTerm]] | None = None,
        pieces: Sequence[np.ndarray | None] | None = None,
        keep_states: bool | Sequence[bool] = False,
        resume: Sequence[Resume] | None = None,
    ) -> DecodeBatch:
        """Run the encoder over `src_ids_lists` (each ending with </s>) and set up their decoding.
        `keys` identify the sentences (unique, hashable); `max_lens` overrides the length rule per
        sentence (clamped to 1..max_positions-1); both count the target prefix as emitted tokens,
        as the reference does. `min_lens` and `target_prefixes`: see the module doc.
        `kept_prefixes`: tokens forced after the target prefix and kept in the output (min_lens
        then counts them). `num_hypotheses`: beam search's n-best list (`Finished.hypotheses`).
        `sampling`: greedy sentences that draw their tokens (`service.decoding.sampling`).
        `terms`: glossary terms forced on each sentence's output (`service.decoding.terms`);
        `pieces`: the word-internal pieces of each sentence's target vocabulary ((V,) bool or None),
        which a row may not write right after a term. `keep_states` (greedy): the sentences whose
        `Finished.state` holds their decoder state. `resume`: every sentence goes on from a
        state's first tokens (service.decoding.resume): no encoder runs, and those tokens are its
        kept prefix (`kept_prefixes` is not given then)."""
        n = len(src_ids_lists)
        if len(keys) != n:
            raise ValueError(f"{len(keys)} keys for {n} sentences")
        if len(set(keys)) != n:
            raise ValueError("keys must be unique")
        if beam < 1:
            raise ValueError(f"beam must be >= 1, got {beam}")
        if any(len(s) == 0 for s in src_ids_lists):
            raise ValueError("empty source: a source is its ids followed by </s>")
        self = cls(beam, model.eos_id, model.pad_id)
        if n == 0:
            self._empty_state(model)
            return self
        K = beam
        if resume is not None:
            kept_prefixes = resumed_prefixes(resume, target_prefixes, kept_prefixes, n)
            lens, mask, ck, cv = encoded(list(resume))
        else:
            lens, mask, ck, cv = encode_sources(model, src_ids_lists)
        R = n * K
        self.keys = list(keys)
        self._set_output_rules(n, min_lens, target_prefixes, kept_prefixes, num_hypotheses, sampling)
        self._set_terms(n, terms, pieces)
        shortlist = model.shortlist
        self.vocab = [
            shortlist.candidates(src, [*forced, *term_tokens(ts)]) if shortlist is not None else _NO_IDS
            for src, forced, ts in zip(src_ids_lists, self.target_prefix, self.terms)
        ]
        rule = [max_output_len(int(L), max_len_a, max_len_b, model.max_positions) for L in lens]
        if max_lens is not None:
            rule = [max(1, min(int(m), model.max_positions - 1)) for m in as_list(max_lens, n, "max_lens")]
        self.max_len = np.array(rule, dtype=np.int64)
        self.length_penalty = np.array(as_list(length_penalty, n, "length_penalty"), dtype=np.float64)
        self.want_alignment = np.array(as_list(want_alignment, n, "want_alignment"), dtype=bool)
        self.want_scores = np.array(as_list(want_scores, n, "want_scores"), dtype=bool)
        self.src_lens = lens
        self.done = np.zeros(n, dtype=bool)
        self.steps = np.zeros(n, dtype=np.int64)
        self.finished = [[] for _ in range(n)]
        self.src_mask, self.cross_k, self.cross_v = mask, list(ck), list(cv)
        self.cache = new_cache(model, R if resume is None else 0, K, capacity=int(self.max_len.max()) + 1)
        self.positions = np.zeros(R, dtype=np.int64)
        self.tokens = np.full(R, model.start_id, dtype=np.int64)
        scores = np.zeros((n, K), dtype=np.float32)
        scores[:, 1:] = NEG_INF  # all beams start identical: only the first one is live
        self.scores = scores.reshape(-1)
        self.hist = [None] * R
        self.out_ids = np.zeros((R, out_width(K, self.max_len)), dtype=np.int64)
        self.keep_state = np.array(as_list(keep_states, n, "keep_states"), dtype=bool)
        if self.keep_state.any() and K > 1:
            raise ValueError("keep_states needs beam 1")
        if resume is not None:
            self._resume(model, resume)
        return self

    def _set_output_rules(
        self,
        n: int,
        min_lens: int | Sequence[int],
        target_prefixes: Sequence[Sequence[int]] | None,
        kept_prefixes: Sequence[Sequence[int]] | None,
        num_hypotheses: int | Sequence[int],
        sampling: Sequence[Sampling | None] | None,
    ) -> None:
        """`from_sources`' per-sentence rules of what is emitted: forced prefixes, the first step
        </s> may be chosen at, the n-best width and sampling."""
        prefixes = [list(p) for p in target_prefixes] if target_prefixes is not None else [[] for _ in range(n)]
        if len(prefixes) != n:
            raise ValueError(f"target_prefixes: {len(prefixes)} values for {n} sentences")
        kept = [list(p) for p in kept_prefixes] if kept_prefixes is not None else [[] for _ in range(n)]
        if len(kept) != n:
            raise ValueError(f"kept_prefixes: {len(kept)} values for {n} sentences")
        self.target_prefix = [p + k for p, k in zip(prefixes, kept)]
        self.output_from = np.array([len(p) for p in prefixes], dtype=np.int64)
        self.prefix_len = np.array([len(p) for p in self.target_prefix], dtype=np.int64)
        min_len = np.array(as_list(min_lens, n, "min_lens"), dtype=np.int64)
        self.eos_from = np.maximum(min_len + self.output_from, self.prefix_len)
        self.num_hypotheses = np.array(as_list(num_hypotheses, n, "num_hypotheses"), dtype=np.int64)
        self.sampling = list(sampling) if sampling is not None else [None] * n
        if len(self.sampling) != n:
            raise ValueError(f"sampling: {len(self.sampling)} values for {n} sentences")
        if self.beam > 1 and any(self.sampling):
            raise ValueError("sampling needs beam 1")
        self.samples = np.array([x is not None for x in self.sampling], dtype=bool)

    def _empty_state(self, model: DecoderModel) -> None:
        H, dk, L = model.n_heads, model.d_k, model.n_layers
        z = np.zeros((0, H, 0, dk), dtype=np.float32)
        self.cross_k, self.cross_v = [z] * L, [z] * L
        self.cache = new_cache(model, 0, self.beam, capacity=1)

    # -- views ----------------------------------------------------------------

    def __len__(self) -> int:
        """Rows (sentences x beam)."""
        return len(self.tokens)

    @property
    def n_sentences(self) -> int:
        return len(self.keys)

    @property
    def src_len(self) -> int:
        """Padded source length of the batch."""
        return int(self.src_mask.shape[1])

    @property
    def past_len(self) -> int:
        return self.cache.past_len

    @property
    def padding_ratio(self) -> float:
        """Share of padding in the source tensors of the next decoder step."""
        return 0.0 if self.src_mask.size == 0 else 1.0 - float(self.src_mask.sum()) / self.src_mask.size

    @property
    def live_rows(self) -> int:
        """Rows of sentences still decoding."""
        return int((~self.done).sum()) * self.beam

    def active_keys(self) -> list[Hashable]:
        return [k for k, d in zip(self.keys, self.done) if not d]

    def last_tokens(self) -> dict[Hashable, list[int]]:
        """Greedy only: the token each sentence emitted at the last step (</s> included), for
        streaming. Beam search commits to nothing before a sentence finishes: empty."""
        return dict(self.last_emitted)

    # -- one decoder step -----------------------------------------------------

    def step(self, model: DecoderModel) -> list[Finished]:
        """Run one decoder step for every row; return the sentences that finished at it. Their rows
        (and those of sentences done earlier) stay until `filter()`; they get no more results."""
        self.last_emitted = {}
        if len(self) == 0:
            return []
        K = self.beam
        rules = self._rules()
        live_before = ~self.done
        sampling = K == 1 and bool(self.samples.any()) and bool((self.samples & live_before).any())
        # Greedy search ranks by the logits alone (no log-softmax) while nobody wants a score; its
        # unscored step bans </s> itself in the rows that may not end yet, where the export can.
        unscored = K == 1 and not sampling and not bool(self.want_scores[live_before].any())
        no_eos = rules.no_eos if rules.binding and unscored and model.unscored_bans_eos else None
        # The graph ranks the vocabulary: the best token of a row (greedy), or its 2K best (beam:
        # a sentence's 2K best candidates over K rows x V tokens are among its rows' 2K best).
        # Greedy rows that may not end yet need the second best too, should the best be </s>,
        # unless the step bans it (no_eos).
        k_row = (2 if rules.binding and no_eos is None else 1) if K == 1 else min(2 * K, model.vocab_size)
        # Banned tokens, and </s> too, may be a row's best ones (service.decoding.terms).
        k_row = min(max(k_row, self._terms_candidates()), model.vocab_size)
        if sampling:  # the candidates of the sentences that sample
            live = [x for x, d in zip(self.sampling, self.done) if x is not None and not d]
            k_row = max(k_row, *(x.candidates(model.vocab_size) for x in live))
        scored = not unscored or k_row > 1
        if self.n_sentences == 1:
            return self._lone_step(model, k_row, scored, no_eos, rules, sampling)
        # A batch's first step with beams runs one row per sentence (its beams are identical then).
        # A lone sentence (`_lone_step`) does not gain: its step of K rows costs about what the separate call adds.
        first = K > 1 and self.cache.past_len == 0

        def run(k: int) -> StepResult:
            step_args = (model, self.tokens, self.positions, self.cross_k, self.cross_v, self.src_mask, k)
            if first:
                return self._drawn(self.cache.first_step(*step_args, vocab=self.vocab), rules, sampling)
            return self._drawn(
                self.cache.step(*step_args, scored=scored, vocab=self.vocab, no_eos=no_eos), rules, sampling
            )

        out, terms = self.ranked(run, k_row, model.vocab_size, rules)
        top_lp, top_ids, att = out.top_log_probs, out.top_ids, out.cross_attention
        last = self.max_len - 1  # (R,) at a sentence's last allowed step only </s> may follow
        force = self.positions >= (last if K == 1 else np.repeat(last, K))
        if force.any():
            top_ids, top_lp = rules.force_eos(top_ids, top_lp, out.eos_log_prob, force)
        if K == 1:
            finished, rows = self._greedy(None if top_lp is None else top_lp[:, 0], top_ids[:, 0], att), None
        elif top_lp is None:
            raise RuntimeError("beam search needs the step's log-probabilities")
        else:
            finished, rows = self._beam(top_lp, top_ids, att, force)
        self._terms_advance(terms, rows)
        self.cache.advance(rows)
        self._keep_states(finished)
        # Rows of finished sentences may ride along until the next filter(): they stay at their
        # last position, which is within the position table (the next ones may not be).
        self.positions = self.positions + (~self.done if K == 1 else np.repeat(~self.done, K))
        self.steps += live_before
        return finished

    def _rules(self) -> OutputRules:
        """The output rules of this step (`OutputRules.at_step`): which rows are at a forced prefix
        token, which may not end yet."""
        return OutputRules.at_step(
            self.eos_id,
            self.pad_id,
            self.beam,
            self.positions,
            self.done,
            self.eos_from,
            self.prefix_len,
            self.target_prefix,
        )

    def _drawn(self, out: StepResult, rules: OutputRules, sampling: bool) -> StepResult:
        """The step's result with the drawn token of each live row that samples in column 0."""
        if not sampling:
            return out
        rows = np.flatnonzero(self.samples & ~self.done).tolist()
        top_ids, top_lp = rules.sample(self.sampling, rows, out.top_ids, out.top_log_probs)
        return out._replace(top_ids=top_ids, top_log_probs=top_lp)

    def _lone_step(
        self,
        model: DecoderModel,
        k_row: int,
        scored: bool,
        no_eos: np.ndarray | None,
        rules: OutputRules,
        sampling: bool = False,
    ) -> list[Finished]:
        """`step` for a batch of one sentence (a lone request): the same step and results, its
        bookkeeping on Python scalars and in place (the sentence's K rows share one position),
        where numpy's cost per call on arrays of one element was most of a step's host time (about
        70 µs around a 230 µs greedy decoder call). Beam search selects in `_beam_one`."""
        K, live = self.beam, not self.done[0]

        def run(k: int) -> StepResult:
            step_args = (model, self.tokens, self.positions, self.cross_k, self.cross_v, self.src_mask, k)
            return self._drawn(
                self.cache.step(*step_args, scored=scored, vocab=self.vocab, no_eos=no_eos), rules, sampling
            )

        out, terms = self.ranked(run, k_row, model.vocab_size, rules)
        forced = int(self.positions[0]) >= int(self.max_len[0]) - 1  # only </s> may follow the last step
        if K == 1:
            finished, rows = self._greedy_lone(out, forced, live), None
        else:
            top_lp, top_ids = out.top_log_probs, out.top_ids
            if forced:
                top_ids, top_lp = rules.force_eos(top_ids, top_lp, out.eos_log_prob, slice(None))
            if top_lp is None or out.eos_log_prob is None:
                raise RuntimeError("beam search needs the step's log-probabilities")
            finished, rows = self._beam_one(top_lp, top_ids, out.cross_attention, np.full(K, forced))
        self._terms_advance(terms, rows)
        self.cache.advance(rows)
        self._keep_states(finished)
        self.positions += not self.done[0]
        self.steps[0] += live
        return finished


layouts(DecodeBatch)  # a field without a Layout fails here, at import
