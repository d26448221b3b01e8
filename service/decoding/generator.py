"""Greedy and beam search over the ONNX graphs, in numpy, built for continuous batching.

It reproduces exactly the semantics of the PyTorch reference (export/generate.py):
- the source is `ids + [</s>]` (a multilingual model's source language token first); decoding
  starts from the model's decoder start token (`<s>` for mtserve's own models) at position 0;
- a sentence's target prefix (a multilingual model's target language token) is forced as its
  first generated tokens, at log-probability 0: it counts as emitted (for max_len and the length
  penalty) and is left out of its output;
- a sentence's `min_len`: </s> cannot be chosen before that many output tokens (greedy takes the
  best other token, beam search drops the </s> candidates);
- a sentence may emit at most `max_len = min(floor(a * src_len + b), max_positions - 1)` tokens,
  the final `</s>` included; at its last allowed step `</s>` is forced;
- beam search ranks finished hypotheses by `sum(log p) / len ** length_penalty` (`len` counts
  `</s>`); at each step the `2 * beam` best candidates of a sentence are taken, those ending in
  `</s>` finish when ranked within the first `beam`, the best `beam` others go on; a sentence
  stops once `beam` hypotheses have finished, at its last allowed step, or when nothing goes on;
- `beam == 1` is greedy search (score = plain sum of log-probabilities).

The state of a running batch is a `DecodeBatch` (the text-generation-inference `Seq2SeqLMBatch`
pattern): every row carries its own self-attention cache (`service.decoding.cache`: the portable
graph's, or the fused graph's in-place buffers), position and score, so rows at different steps
share a decoder call. A sentence occupies `beam` consecutive rows and
carries its source mask and cross-attention keys/values once, for all its beams (the graph folds
the beams into the cross-attention query). The serving loop:

    batch = DecodeBatch.from_sources(model, src_ids_lists, keys, beam=4)   # encoder pass
    while len(batch):
        for f in batch.step(model):           # one decoder step for every row
            reply(f.key, f.tokens, f.score)   # sentences that finished at this step
        batch.filter(batch.active_keys())      # drop finished (and cancelled) sentences
        batch = DecodeBatch.concatenate([batch, DecodeBatch.from_sources(...)])  # admit new ones

`generate()` is the offline version: sort by length, batches of at most N sentences.
Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeAlias

import numpy as np

from service.decoding.cache import RowCache, StepResult
from service.decoding.concat_cache import ConcatCache
from service.decoding.in_place_cache import InPlaceCache
from service.decoding.model import DecoderModel
from service.decoding.rows import fill_order, row_moves, stack_padded
from service.decoding.sampling import Sampling, draw

NEG_INF = float("-inf")
_NO_IDS = np.zeros(0, dtype=np.int64)  # a sentence's shortlist candidates where the model has no shortlist
# The encoder runs over a batch's sources in length-sorted chunks, each padded only to its own longest
# source (a mixed batch of 16 padded to its longest is 42% padding, test_2016_flickr). A chunk takes
# the next longer source while that adds at most this many padding tokens to it, about what one more
# encoder call costs (25-30 µs a token, 0.4-0.5 ms a call), up to ENCODE_CHUNK sentences. Offline, in
# sorted batches of 32, chunks of 16 cost 7% less than chunks of 8 (docs/performance.md).
ENCODE_PAD_TOKENS = 16
ENCODE_CHUNK = 32
# Offline `generate` drops finished sentences from a batch once they are this share of it.
COMPACT_FRACTION = 0.25


def max_output_len(src_len: int, a: float, b: int, max_positions: int) -> int:
    """Tokens a sentence may emit, </s> included; src_len counts the source's </s>."""
    return max(1, min(int(a * src_len + b), max_positions - 1))


@dataclass
class Hypothesis:
    tokens: list[int]  # emitted ids without the final </s>
    score: float | None  # length-normalised log-probability (greedy: plain sum; None: not asked for)
    log_prob: float | None  # sum of log-probabilities, </s> included
    alignment: np.ndarray | None = None  # (len(tokens) + 1, src_len) when asked for


@dataclass
class Finished:
    """A sentence that finished at the last step."""

    key: Hashable
    tokens: list[int]  # emitted ids without the final </s>
    score: float | None  # None for a greedy sentence that did not ask for it (`want_scores`)
    log_prob: float | None
    alignment: np.ndarray | None  # float32 (len(tokens) + 1, src_len): one row per emitted token and
    #                               the final </s>, the last decoder layer's cross-attention over
    #                               the source tokens (</s> included), averaged over heads
    steps: int  # decoder steps this sentence took
    # num_hypotheses > 1 (beam search): the n best finished hypotheses, best first (the first is
    # this one), without alignment.
    hypotheses: list[Hypothesis] = field(default_factory=list)

    def hypothesis(self) -> Hypothesis:
        return Hypothesis(self.tokens, self.score, self.log_prob, self.alignment)


# Under beam search a row's output so far is a linked list of immutable nodes (token, attention row
# or None, parent, length), so that reordering beams costs one reference per row, not a copy of its
# history. Greedy rows never reorder: their tokens go to `DecodeBatch.out_ids`, and nodes carry
# only the attention rows of those that want their alignment.
_Node: TypeAlias = "tuple[int, np.ndarray | None, _Node | None, int]"
# A hypothesis that ended with </s> while its sentence still decodes: (length-normalised score,
# sum of log-probabilities, its output without the </s>, the </s> step's attention row or None).
_Ended: TypeAlias = "tuple[float, float, _Node | None, np.ndarray | None]"


def _node(tok: int, att: np.ndarray | None, parent: _Node | None) -> _Node:
    return (tok, att, parent, 1 if parent is None else parent[3] + 1)


def _walk(node: _Node | None) -> tuple[list[int], list[np.ndarray | None]]:
    toks: list[int] = []
    atts: list[np.ndarray | None] = []
    while node is not None:
        toks.append(node[0])
        atts.append(node[1])
        node = node[2]
    return toks[::-1], atts[::-1]


def _length(node: _Node | None) -> int:
    return 0 if node is None else node[3]


def _alignment(atts: list[np.ndarray | None], src_len: int) -> np.ndarray:
    """float32 (len(atts), src_len): a finished hypothesis's attention rows, cut to its source."""
    cut = []
    for a in atts:
        assert a is not None, "a sentence that wants its alignment records the attention of every step"
        cut.append(a[:src_len])
    return np.stack(cut).astype(np.float32, copy=False)


def encoder_chunks(
    lens: np.ndarray, chunk: int = ENCODE_CHUNK, pad_tokens: int = ENCODE_PAD_TOKENS
) -> list[np.ndarray]:
    """Rows by increasing length, cut where the next source would add more than `pad_tokens` padding
    to its chunk, or at `chunk` rows."""
    order = np.argsort(lens, kind="stable")
    chunks, start, real = [], 0, 0
    for i, r in enumerate(order.tolist()):
        L = int(lens[r])
        if i > start and (i - start == chunk or (i - start + 1) * L - (real + L) > pad_tokens):
            chunks.append(order[start:i])
            start, real = i, 0
        real += L
    chunks.append(order[start:])
    return chunks


def encode_sources(
    model: DecoderModel,
    src_ids_lists: Sequence[Sequence[int]],
    chunk: int = ENCODE_CHUNK,
    pad_tokens: int = ENCODE_PAD_TOKENS,
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Run the encoder over sources of any lengths -> lens (n,), src_mask (n, S) int64 and per
    decoder layer the cross-attention keys and values (n, H, S, d_k), S the longest source, rows in
    input order. Sorted by length and run in chunks (`encoder_chunks`), so that no chunk pays much
    for another's longest source; what lies past a source's end is hidden by src_mask."""
    n = len(src_ids_lists)
    lens = np.array([len(s) for s in src_ids_lists], dtype=np.int64)
    S = int(lens.max())
    mask = (np.arange(S)[None, :] < lens[:, None]).astype(np.int64)

    def run(rows: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        s_len = int(lens[rows].max())
        ids = np.full((len(rows), s_len), model.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : lens[r]] = src_ids_lists[r]
        _, ck, cv = model.encode(ids, np.ascontiguousarray(mask[rows, :s_len]))
        return ck, cv

    chunks = encoder_chunks(lens, chunk, pad_tokens)
    if len(chunks) == 1:
        ck, cv = run(list(range(n)))
        return lens, mask, list(ck), list(cv)
    ck_all: list[np.ndarray] = []
    cv_all: list[np.ndarray] = []
    for rows in chunks:
        ck, cv = run(rows.tolist())
        if not ck_all:
            shape = (n, ck[0].shape[1], S, ck[0].shape[3])
            ck_all = [np.empty(shape, dtype=ck[0].dtype) for _ in ck]
            cv_all = [np.empty(shape, dtype=cv[0].dtype) for _ in cv]
        s_len = ck[0].shape[2]
        for out, part in zip(ck_all + cv_all, list(ck) + list(cv)):
            out[rows, :, :s_len] = part
            out[rows, :, s_len:] = 0.0
    return lens, mask, ck_all, cv_all


@dataclass(frozen=True)
class Layout:
    """How a `DecodeBatch` field follows its rows through `filter` and `concatenate`.

    axis: "batch" (one value for the whole batch; batches concatenate only when theirs agree),
    "sentence" or "row" (a numpy array or list indexed by sentence or row along its first axis, for
    a sentence a dict keyed by the sentence's key, or for rows a `RowCache`, which selects and
    concatenates itself). padded: an axis that `concatenate` pads with zeros to the longest of the
    batches': "source" (1 of a mask (N, S), 2 of keys or values (N, H, S, d_k)) runs to the
    batch's longest source, and `filter` drops what no kept sentence uses; "output" (1 of (R, T))
    has room for a row's longest output. layers: a list of such arrays, one per decoder layer."""

    axis: Literal["batch", "sentence", "row"]
    padded: Literal["source", "output"] | None = None
    layers: bool = False


def _batch_wide() -> Any:
    return field(metadata={"layout": Layout("batch")})


def _per(
    axis: Literal["sentence", "row"],
    empty: Callable[[], Any],
    padded: Literal["source", "output"] | None = None,
    layers: bool = False,
) -> Any:
    """A field indexed by sentence or row; `empty()` makes its value for no sentences."""
    return field(default_factory=empty, metadata={"layout": Layout(axis, padded, layers)})


def _zeros(*shape: int, dtype: type) -> Callable[[], np.ndarray]:
    return lambda: np.zeros(shape, dtype=dtype)


_LAYOUTS: dict[type, tuple[tuple[str, Layout], ...]] = {}


def layouts(cls: type) -> tuple[tuple[str, Layout], ...]:
    """Each field of a `DecodeBatch` (sub)class with its layout, in declaration order (worked out
    once per class). A field that declares none raises: `filter` and `concatenate` could not carry it."""
    found = _LAYOUTS.get(cls)
    if found is None:
        out = []
        for f in fields(cls):
            layout = f.metadata.get("layout")
            if not isinstance(layout, Layout):
                raise TypeError(f"{cls.__name__}.{f.name} declares no Layout: filter and concatenate cannot carry it")
            out.append((f.name, layout))
        found = _LAYOUTS[cls] = tuple(out)
    return found


def _pad_axis(a: np.ndarray) -> int:
    """The axis that runs to the longest source: 1 of a mask (N, S), 2 of keys or values (N, H, S, d_k)."""
    return 1 if a.ndim == 2 else 2


def _out_width(beam: int, max_len: np.ndarray) -> int:
    """Columns of a batch's `out_ids`: its sentences' longest output (greedy), none (beam search)."""
    return int(max_len.max()) if beam == 1 and len(max_len) else 0


def _as_list(value: Any, n: int, name: str) -> list[Any]:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} sentences")
        return list(value)
    return [value] * n


def new_cache(model: DecoderModel, rows: int, beam: int, capacity: int) -> RowCache:
    """An empty cache for the graph `model` runs (`model.graph`): room for `capacity` steps."""
    cls = InPlaceCache if model.graph == "fused" else ConcatCache
    return cls.empty(model, rows, beam, capacity)


@dataclass(eq=False, repr=False, slots=True)
class DecodeBatch:
    """Decoding state of a set of sentences, `beam` consecutive rows each (see the module doc).

    Every field declares its `Layout`: batch-wide, per sentence (n of them) or per row (R = n x
    beam). `filter` and `concatenate` carry the fields by these declarations, so a field added
    here follows the batch through both, and one without a layout fails at import (in a subclass:
    at its first filter or concatenate). The slots make an undeclared attribute an error too."""

    beam: int = _batch_wide()
    eos_id: int = _batch_wide()
    pad_id: int = _batch_wide()

    # -- per sentence ---------------------------------------------------------
    keys: list[Hashable] = _per("sentence", list)
    max_len: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))  # tokens it may emit, </s> included
    length_penalty: np.ndarray = _per("sentence", _zeros(0, dtype=np.float64))
    want_alignment: np.ndarray = _per("sentence", _zeros(0, dtype=bool))
    # Greedy search skips the log-probabilities while no live sentence asks for its score.
    want_scores: np.ndarray = _per("sentence", _zeros(0, dtype=bool))
    src_lens: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))  # real source length, </s> included
    done: np.ndarray = _per("sentence", _zeros(0, dtype=bool))
    steps: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))  # decoder steps taken
    finished: list[list[_Ended]] = _per("sentence", list)  # hypotheses ended so far (beam search)
    src_mask: np.ndarray = _per("sentence", _zeros(0, 0, dtype=np.int64), padded="source")  # (n, S) int64
    # Per decoder layer the cross-attention keys and values (n, H, S, d_k), once for all beams.
    cross_k: list[np.ndarray] = _per("sentence", list, padded="source", layers=True)
    cross_v: list[np.ndarray] = _per("sentence", list, padded="source", layers=True)
    # The tokens forced first on each sentence's output: a language token, left out of it, then a
    # requested target prefix, kept in it; where its output starts (after the left-out tokens);
    # and the position from which it may end: its min_len after that start, past its prefix.
    target_prefix: list[list[int]] = _per("sentence", list)
    prefix_len: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))
    output_from: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))
    eos_from: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))
    # Beam search: the finished hypotheses a sentence returns (its n-best list when > 1).
    num_hypotheses: np.ndarray = _per("sentence", _zeros(0, dtype=np.int64))
    # Greedy only: how each sentence samples its tokens (None: it takes the best), and whether any does.
    sampling: list[Sampling | None] = _per("sentence", list)
    samples: np.ndarray = _per("sentence", _zeros(0, dtype=bool))
    # Greedy only: the token each sentence emitted at the last step, by key (`last_tokens`).
    last_emitted: dict[Hashable, list[int]] = _per("sentence", dict)
    # Where the model ranks over a vocabulary shortlist (`DecoderModel.shortlist`): each sentence's
    # own candidates, its source tokens' rows and its forced tokens (`Shortlist.candidates`);
    # the cache makes the batch's vocab_ids of them when its sentences change. Else empty arrays.
    vocab: list[np.ndarray] = _per("sentence", list)

    # -- per row --------------------------------------------------------------
    # The self-attention keys and values of every row, with which entries are the row's own (a
    # row that joined late has padding before them); it selects and concatenates itself.
    cache: RowCache = _per("row", lambda: ConcatCache([], [], np.zeros((0, 0), dtype=np.float32)))
    positions: np.ndarray = _per("row", _zeros(0, dtype=np.int64))  # the position of the next input token
    tokens: np.ndarray = _per("row", _zeros(0, dtype=np.int64))  # the next input token
    # float32; greedy: the sum of log-probabilities, beam: the beam's cumulative score
    scores: np.ndarray = _per("row", _zeros(0, dtype=np.float32))
    # The output so far: beam search's linked nodes (token, attention row, parent); greedy search
    # keeps its tokens in `out_ids` instead (column t: the token emitted at position t), written
    # for all rows in one call a step, and here only the attention rows of those that want them.
    hist: list[_Node | None] = _per("row", list)
    out_ids: np.ndarray = _per("row", _zeros(0, 0, dtype=np.int64), padded="output")  # (R, T) greedy

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
    ) -> DecodeBatch:
        """Run the encoder over `src_ids_lists` (each ending with </s>) and set up their decoding.
        `keys` identify the sentences (unique, hashable); `max_lens` overrides the length rule per
        sentence (clamped to 1..max_positions-1); both count the target prefix as emitted tokens,
        as the reference does. `min_lens` and `target_prefixes`: see the module doc.
        `kept_prefixes`: tokens forced after the target prefix and kept in the output (min_lens
        then counts them). `num_hypotheses`: beam search's n-best list (`Finished.hypotheses`).
        `sampling`: greedy sentences that draw their tokens (`service.decoding.sampling`)."""
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
        lens, mask, ck, cv = encode_sources(model, src_ids_lists)
        R = n * K
        self.keys = list(keys)
        self._set_output_rules(n, min_lens, target_prefixes, kept_prefixes, num_hypotheses, sampling)
        shortlist = model.shortlist
        self.vocab = [
            shortlist.candidates(src, forced) if shortlist is not None else _NO_IDS
            for src, forced in zip(src_ids_lists, self.target_prefix)
        ]
        rule = [max_output_len(int(L), max_len_a, max_len_b, model.max_positions) for L in lens]
        if max_lens is not None:
            rule = [max(1, min(int(m), model.max_positions - 1)) for m in _as_list(max_lens, n, "max_lens")]
        self.max_len = np.array(rule, dtype=np.int64)
        self.length_penalty = np.array(_as_list(length_penalty, n, "length_penalty"), dtype=np.float64)
        self.want_alignment = np.array(_as_list(want_alignment, n, "want_alignment"), dtype=bool)
        self.want_scores = np.array(_as_list(want_scores, n, "want_scores"), dtype=bool)
        self.src_lens = lens
        self.done = np.zeros(n, dtype=bool)
        self.steps = np.zeros(n, dtype=np.int64)
        self.finished = [[] for _ in range(n)]
        self.src_mask, self.cross_k, self.cross_v = mask, list(ck), list(cv)
        self.cache = new_cache(model, R, K, capacity=int(self.max_len.max()) + 1)
        self.positions = np.zeros(R, dtype=np.int64)
        self.tokens = np.full(R, model.start_id, dtype=np.int64)
        scores = np.zeros((n, K), dtype=np.float32)
        scores[:, 1:] = NEG_INF  # all beams start identical: only the first one is live
        self.scores = scores.reshape(-1)
        self.hist = [None] * R
        self.out_ids = np.zeros((R, _out_width(K, self.max_len)), dtype=np.int64)
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
        min_len = np.array(_as_list(min_lens, n, "min_lens"), dtype=np.int64)
        self.eos_from = np.maximum(min_len + self.output_from, self.prefix_len)
        self.num_hypotheses = np.array(_as_list(num_hypotheses, n, "num_hypotheses"), dtype=np.int64)
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
        no_eos = None if rules is None or not (unscored and model.unscored_bans_eos) else rules[1]
        # The graph ranks the vocabulary: the best token of a row (greedy), or its 2K best (beam:
        # a sentence's 2K best candidates over K rows x V tokens are among its rows' 2K best).
        # Greedy rows that may not end yet need the second best too, should the best be </s>,
        # unless the step bans it (no_eos).
        k_row = (2 if rules is not None and no_eos is None else 1) if K == 1 else min(2 * K, model.vocab_size)
        if sampling:  # the candidates of the sentences that sample
            live = [x for x, d in zip(self.sampling, self.done) if x is not None and not d]
            k_row = max(k_row, *(x.candidates(model.vocab_size) for x in live))
        scored = not unscored or k_row > 1
        if self.n_sentences == 1:
            return self._lone_step(model, k_row, scored, no_eos, rules, sampling)
        # A batch's first step with beams runs one row per sentence (its beams are identical then).
        # A lone sentence (`_lone_step`) does not gain: its step of K rows costs about what the separate call adds.
        first = K > 1 and self.cache.past_len == 0
        step_args = (model, self.tokens, self.positions, self.cross_k, self.cross_v, self.src_mask, k_row)
        if first:
            out = self.cache.first_step(*step_args, vocab=self.vocab)
        else:
            out = self.cache.step(*step_args, scored=scored, vocab=self.vocab, no_eos=no_eos)
        top_lp, top_ids, att = out.top_log_probs, out.top_ids, out.cross_attention
        if sampling:
            top_ids, top_lp = self._sample(top_ids, top_lp, rules)
        if rules is not None:
            top_ids, top_lp = self._apply_rules(top_ids, top_lp, *rules)
        last = self.max_len - 1  # (R,) at a sentence's last allowed step only </s> may follow
        force = self.positions >= (last if K == 1 else np.repeat(last, K))
        if force.any():
            top_ids, top_lp = self._force_eos(top_ids, top_lp, out.eos_log_prob, force)
        if K == 1:
            finished, rows = self._greedy(None if top_lp is None else top_lp[:, 0], top_ids[:, 0], att), None
        elif top_lp is None:
            raise RuntimeError("beam search needs the step's log-probabilities")
        else:
            finished, rows = self._beam(top_lp, top_ids, att, force)
        self.cache.advance(rows)
        # Rows of finished sentences may ride along until the next filter(): they stay at their
        # last position, which is within the position table (the next ones may not be).
        self.positions = self.positions + (~self.done if K == 1 else np.repeat(~self.done, K))
        self.steps += live_before
        return finished

    def _greedy(self, best: np.ndarray | None, nxt: np.ndarray, att: np.ndarray) -> list[Finished]:
        """best, nxt: (R,) each row's best log-probability (None: not computed, as no live row
        wants its score) and token."""
        live = ~self.done
        rows = np.flatnonzero(live)
        if best is not None:
            self.scores = self.scores + np.where(live, best, np.float32(0))  # float32 (best is)
        emitted = nxt[rows]
        self.out_ids[rows, self.positions[rows]] = emitted
        if self.want_alignment.any():
            hist = self.hist
            for r in np.flatnonzero(live & self.want_alignment).tolist():
                hist[r] = _node(int(nxt[r]), att[r], hist[r])
        keys = self.keys
        self.last_emitted = {keys[r]: [t] for r, t in zip(rows.tolist(), emitted.tolist())}
        self.tokens = nxt.astype(np.int64, copy=False)
        return [self._greedy_finished(r) for r in np.flatnonzero(live & (nxt == self.eos_id)).tolist()]

    def _greedy_finished(self, r: int) -> Finished:
        """Greedy sentence r (row r) ended with </s> at this step."""
        self.done[r] = True
        eos, pad = self.eos_id, self.pad_id
        toks = self.out_ids[r, : int(self.positions[r]) + 1].tolist()  # </s> last
        start = int(self.output_from[r])  # the forced language token is no part of the output
        keep = [j for j, t in enumerate(toks) if t != pad and j >= start]  # the reference drops pad ids
        alignment = None
        if self.want_alignment[r]:
            atts = _walk(self.hist[r])[1]
            alignment = _alignment([atts[j] for j in keep], self.src_lens[r])
        score = float(self.scores[r]) if self.want_scores[r] else None
        toks = [toks[j] for j in keep if toks[j] != eos]
        return Finished(self.keys[r], toks, score, score, alignment, int(self.steps[r]) + 1)

    def _rules(self) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows at a forced prefix token at this step (R,) (the token; -1: none), and the rows
        that may not end yet (R,) bool; None when no live row is under either rule at this step
        (most steps: a multilingual model's language token binds the first step only)."""
        if not self.eos_from.any():
            return None
        K, pos = self.beam, self.positions

        def per_row(a: np.ndarray) -> np.ndarray:
            return a if K == 1 else np.repeat(a, K)

        live = per_row(~self.done)
        no_eos = live & (pos < per_row(self.eos_from))
        if not no_eos.any():  # every row is past its prefix and its minimum (eos_from >= prefix_len)
            return None
        forced = np.full(len(pos), -1, dtype=np.int64)
        for r in np.flatnonzero(live & (pos < per_row(self.prefix_len))).tolist():
            forced[r] = self.target_prefix[r // K][int(pos[r])]
        return forced, no_eos

    def _apply_rules(
        self, top_ids: np.ndarray, top_lp: np.ndarray | None, forced: np.ndarray, no_eos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The step's candidates under `_rules`: a forced row gets its prefix token alone (log-prob
        0); a row that may not end loses its </s> candidate (greedy: the second best takes its place,
        which needs top_k >= 2). Copies; the step's own arrays stay."""
        top_ids = top_ids.copy()
        top_lp = None if top_lp is None else top_lp.copy()
        eos_rows = no_eos[:, None] & (top_ids == self.eos_id)
        if self.beam == 1 and eos_rows[:, 0].any():
            first = eos_rows[:, 0]
            top_ids[first, 0] = top_ids[first, 1]
            if top_lp is not None:
                top_lp[first, 0] = top_lp[first, 1]
        elif top_lp is not None:
            top_lp[eos_rows] = NEG_INF
        rows = forced >= 0
        if rows.any():
            top_ids[rows] = self.pad_id
            top_ids[rows, 0] = forced[rows]
            if top_lp is not None:
                top_lp[rows] = NEG_INF
                top_lp[rows, 0] = 0.0
        return top_ids, top_lp

    def _sample(
        self, top_ids: np.ndarray, top_lp: np.ndarray | None, rules: tuple[np.ndarray, np.ndarray] | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The step's candidates with each live sampling row's drawn token (and its log-probability)
        in column 0, where greedy search takes it; </s> is not drawn where `rules` forbid it.
        Copies; the step's own arrays stay."""
        if top_lp is None:
            raise RuntimeError("sampling needs the step's log-probabilities")
        top_ids, top_lp = top_ids.copy(), top_lp.copy()
        no_eos = None if rules is None else rules[1]
        for r in np.flatnonzero(self.samples & ~self.done).tolist():
            how = self.sampling[r]
            assert how is not None
            banned = top_ids[r] == self.eos_id if no_eos is not None and no_eos[r] else None
            j = draw(how, top_lp[r], banned)
            top_ids[r, 0], top_lp[r, 0] = top_ids[r, j], top_lp[r, j]
        return top_ids, top_lp

    def _lone_step(
        self,
        model: DecoderModel,
        k_row: int,
        scored: bool,
        no_eos: np.ndarray | None,
        rules: tuple[np.ndarray, np.ndarray] | None = None,
        sampling: bool = False,
    ) -> list[Finished]:
        """`step` for a batch of one sentence (a lone request): the same step and results, its
        bookkeeping on Python scalars and in place (the sentence's K rows share one position),
        where numpy's cost per call on arrays of one element was most of a step's host time (about
        70 µs around a 230 µs greedy decoder call). Beam search selects in `_beam_one`."""
        K, live = self.beam, not self.done[0]
        step_args = (model, self.tokens, self.positions, self.cross_k, self.cross_v, self.src_mask, k_row)
        out = self.cache.step(*step_args, scored=scored, vocab=self.vocab, no_eos=no_eos)
        if sampling:
            drawn_ids, drawn_lp = self._sample(out.top_ids, out.top_log_probs, rules)
            out = out._replace(top_ids=drawn_ids, top_log_probs=drawn_lp)
        if rules is not None:
            top_ids, top_lp = self._apply_rules(out.top_ids, out.top_log_probs, *rules)
            out = out._replace(top_ids=top_ids, top_log_probs=top_lp)
        forced = int(self.positions[0]) >= int(self.max_len[0]) - 1  # only </s> may follow the last step
        if K == 1:
            finished, rows = self._greedy_lone(out, forced, live), None
        else:
            top_lp, top_ids = out.top_log_probs, out.top_ids
            if forced:
                top_ids, top_lp = self._force_eos(top_ids, top_lp, out.eos_log_prob, slice(None))
            if top_lp is None or out.eos_log_prob is None:
                raise RuntimeError("beam search needs the step's log-probabilities")
            finished, rows = self._beam_one(top_lp, top_ids, out.cross_attention, np.full(K, forced))
        self.cache.advance(rows)
        self.positions += not self.done[0]
        self.steps[0] += live
        return finished

    def _force_eos(
        self, top_ids: np.ndarray, top_lp: np.ndarray | None, eos_log_prob: np.ndarray | None, force: np.ndarray | slice
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

    def _greedy_lone(self, out: StepResult, forced: bool, live: bool) -> list[Finished]:
        """`_greedy` for a batch of one sentence, on Python scalars."""
        tok = self.eos_id if forced else int(out.top_ids[0, 0])
        finished = []
        if live:
            if out.top_log_probs is not None:
                best = out.eos_log_prob[0] if forced and out.eos_log_prob is not None else out.top_log_probs[0, 0]
                self.scores = self.scores + best  # float32, as `_greedy` adds
            self.out_ids[0, self.positions[0]] = tok
            if self.want_alignment[0]:
                self.hist[0] = _node(tok, out.cross_attention[0], self.hist[0])
            self.last_emitted[self.keys[0]] = [tok]
            if tok == self.eos_id:
                finished.append(self._greedy_finished(0))
        self.tokens[0] = tok
        return finished

    def _beam(
        self, top_lp: np.ndarray, top_ids: np.ndarray, att: np.ndarray, force: np.ndarray
    ) -> tuple[list[Finished], np.ndarray]:
        """top_lp, top_ids: (R, k) each row's k best log-probabilities and tokens, best first."""
        n, K, k_row = self.n_sentences, self.beam, top_lp.shape[1]
        eos, pad = self.eos_id, self.pad_id
        cand = (self.scores[:, None] + top_lp).reshape(n, K * k_row)  # candidates by (beam, rank)
        k2 = 2 * K
        at = np.arange(n)[:, None]  # row index for picking per sentence (cheaper than take_along_axis)
        top_idx = np.argsort(-cand, axis=1, kind="stable")[:, :k2]  # (n, 2K), best first
        top_s = cand[at, top_idx]
        beam_idx = top_idx // k_row
        tok = top_ids.reshape(n, K * k_row)[at, top_idx]
        finite = top_s > NEG_INF
        is_eos = tok == eos
        live = ~self.done
        ends = finite & is_eos & (np.arange(k2) < K)[None, :] & live[:, None]  # finish when within the first K
        goes_on = finite & ~is_eos
        goes_on &= np.cumsum(goes_on, axis=1) <= K
        pick = np.argsort(~goes_on, axis=1, kind="stable")[:, :K]  # the kept ranks first, in rank order
        valid = goes_on[at, pick]  # (n, K)
        new_scores = np.where(valid, top_s[at, pick], np.float32(NEG_INF))
        new_src = np.where(valid, beam_idx[at, pick], 0)
        new_tok = np.where(valid, tok[at, pick], pad)
        base = (np.arange(n) * K)[:, None]

        for i, r in zip(*np.nonzero(ends)):
            self._add_finished(i, int(base[i, 0] + beam_idx[i, r]), float(top_s[i, r]), att)
        kept = valid.sum(axis=1)
        sent_force = force.reshape(n, K)[:, 0]
        stop = live & ((np.array([len(f) for f in self.finished]) >= K) | sent_force | (kept == 0))
        finished = []
        for i in np.flatnonzero(stop).tolist():
            finished.append(self._conclude(i))
            new_scores[i] = NEG_INF
            new_src[i] = np.arange(K)

        rows = (base + new_src).reshape(-1)
        tok_flat = new_tok.reshape(-1)
        tok_list, rows_list = tok_flat.tolist(), rows.tolist()
        want = np.repeat(self.want_alignment, K).tolist()
        live_rows = np.repeat(live & ~stop, K).tolist()
        old = self.hist
        self.hist = [
            _node(tok_list[r], att[rows_list[r]] if want[r] else None, old[rows_list[r]]) if live_rows[r] else None
            for r in range(len(rows_list))
        ]
        self.scores = new_scores.reshape(-1).astype(np.float32, copy=False)
        self.tokens = tok_flat.astype(np.int64, copy=False)
        return finished, rows

    def _beam_one(
        self, top_lp: np.ndarray, top_ids: np.ndarray, att: np.ndarray, force: np.ndarray
    ) -> tuple[list[Finished], np.ndarray]:
        """`_beam` for a batch of one sentence (a lone request): the same selection over Python
        lists of its K x k candidates, where numpy's cost per call would be most of the step's
        host time. The candidates' scores are the same float32 sums; Python's sort is stable, as
        `_beam`'s argsort is."""
        K, k_row = self.beam, top_lp.shape[1]
        eos, pad = self.eos_id, self.pad_id
        cand = (self.scores[:, None] + top_lp).reshape(-1).tolist()  # by (beam, rank), float32 values
        ids = top_ids.reshape(-1).tolist()
        order = sorted(range(len(cand)), key=cand.__getitem__, reverse=True)[: 2 * K]  # the 2K best, stable
        live = not self.done[0]
        goes: list[tuple[float, int, int]] = []  # (score, beam, token) of the first K going on
        for rank, j in enumerate(order):
            s, tok, b = cand[j], ids[j], j // k_row
            if s == NEG_INF:
                continue
            if tok == eos:
                if rank < K and live:  # finishes when ranked within the first K
                    self._add_finished(0, b, s, att)
            elif len(goes) < K:
                goes.append((s, b, tok))
        new_scores = [g[0] for g in goes] + [NEG_INF] * (K - len(goes))
        rows = [g[1] for g in goes] + [0] * (K - len(goes))
        new_tok = [g[2] for g in goes] + [pad] * (K - len(goes))
        finished = []
        stop = live and (len(self.finished[0]) >= K or bool(force[0]) or not goes)
        if stop:
            finished.append(self._conclude(0))
            new_scores, rows = [NEG_INF] * K, list(range(K))
        old, want = self.hist, self.want_alignment[0]
        self.hist = (
            [_node(new_tok[r], att[rows[r]] if want else None, old[rows[r]]) for r in range(K)]
            if live and not stop
            else [None] * K
        )
        self.scores = np.array(new_scores, dtype=np.float32)
        self.tokens = np.array(new_tok, dtype=np.int64)
        return finished, np.array(rows, dtype=np.int64)

    def _add_finished(self, i: int, row: int, log_prob: float, att: np.ndarray) -> None:
        """Sentence i's hypothesis of row `row` ends with </s> (sum of log-probabilities `log_prob`)."""
        score = log_prob / (_length(self.hist[row]) + 1) ** float(self.length_penalty[i])
        self.finished[i].append((score, log_prob, self.hist[row], att[row] if self.want_alignment[i] else None))

    def _conclude(self, i: int) -> Finished:
        """Sentence i stops: its best finished hypothesis (by length-normalised score)."""
        self.done[i] = True
        ranked = sorted(self.finished[i], key=lambda h: h[0], reverse=True)  # stable: ties keep their order
        if ranked:
            score, s, node, eos_att = ranked[0]
        else:  # cannot happen with a vocabulary larger than 2 * beam; kept for safety
            score, s, node, eos_att = NEG_INF, NEG_INF, None, None
        toks, atts = _walk(node)
        start = int(self.output_from[i])  # the forced language token is no part of the output
        toks, atts = toks[start:], atts[start:]
        alignment = None
        if self.want_alignment[i] and eos_att is not None:
            alignment = _alignment([*atts, eos_att], self.src_lens[i])
        self.finished[i] = []
        best = Finished(self.keys[i], toks, score, s, alignment, int(self.steps[i]) + 1)
        if self.num_hypotheses[i] > 1:
            best.hypotheses = [best.hypothesis()] + [
                Hypothesis(_walk(h[2])[0][start:], h[0], h[1]) for h in ranked[1 : int(self.num_hypotheses[i])]
            ]
        return best

    # -- batch surgery --------------------------------------------------------

    def filter(self, keep_keys: Iterable[Hashable]) -> DecodeBatch:
        """Keep only the sentences in `keep_keys` (others finished or were cancelled), in place;
        then drop source columns and cache entries no kept row uses. Returns self. The kept
        sentences keep their places, except those behind the new end, which fill the gaps in
        batch order (`fill_order`): the keys, caches and the encoder's keys and values then move
        one sentence per dropped one, not every sentence behind the first gap."""
        keep = set(keep_keys)
        idx = [i for i, k in enumerate(self.keys) if k in keep]
        if len(idx) == self.n_sentences:
            return self
        idx = fill_order(idx)
        K = self.beam
        sent = np.array(idx, dtype=np.int64)
        rows = (sent[:, None] * K + np.arange(K)[None, :]).reshape(-1)
        # The source axis shrinks to the kept sentences' longest source, the output axis to their
        # longest output (`_out_width`); the cache drops the entries that no kept row uses by itself.
        S = int(self.src_lens[sent].max()) if len(idx) else 0
        cut = {"source": S, "output": _out_width(K, self.max_len[sent])}
        picks = {"sentence": (sent, idx), "row": (rows, rows.tolist())}
        for name, layout in layouts(type(self)):
            if layout.axis != "batch":
                at, at_list = picks[layout.axis]
                setattr(self, name, _filtered(name, layout, getattr(self, name), at, at_list, keep, cut))
        return self

    @classmethod
    def concatenate(cls, batches: Sequence[DecodeBatch | None]) -> DecodeBatch:
        """Merge batches (same beam width) whose rows may be at different steps: sources are padded
        to the longest (src_mask 0), caches to the longest past (masked)."""
        present = [b for b in batches if b is not None]
        if not present:
            raise ValueError("nothing to concatenate")
        first = present[0]
        _check_batch_wide(cls, present)
        if len(present) == 1:
            return first
        keys = [k for b in present for k in b.keys]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate keys across batches")
        longest = {
            "source": max(b.src_len for b in present),
            "output": _out_width(first.beam, np.concatenate([b.max_len for b in present])),
        }
        merged = {
            name: _concatenated(name, layout, [getattr(b, name) for b in present], longest)
            for name, layout in layouts(cls)
        }
        return cls(**merged)


def _check_batch_wide(cls: type[DecodeBatch], batches: Sequence[DecodeBatch]) -> None:
    """ValueError unless the batches agree on every batch-wide field (beam width, special ids)."""
    for name, layout in layouts(cls):
        if layout.axis == "batch" and any(getattr(b, name) != getattr(batches[0], name) for b in batches):
            raise ValueError(
                f"cannot concatenate batches of different {name}: {sorted({getattr(b, name) for b in batches})}"
            )


def _take(a: np.ndarray, at: np.ndarray, padded: str | None, cut: dict[str, int]) -> np.ndarray:
    """The entries `at` of a per-sentence or per-row array, a padded axis cut to `cut[padded]`."""
    if padded is not None:
        return a[(at,) + (slice(None),) * (_pad_axis(a) - 1) + (slice(None, cut[padded]),)]
    return a[at]


def _take_layer(a: np.ndarray, at: np.ndarray, padded: str | None, cut: dict[str, int]) -> np.ndarray:
    """A layer's keys or values of the kept sentences. While the source axis keeps its length, the
    kept rows move to the front of the same array, as the fused cache's do: only those that fill a
    gap are copied, and nothing is allocated."""
    if padded == "source" and a.shape[_pad_axis(a)] != cut["source"]:
        return _take(a, at, padded, cut)
    for dst, src, n in row_moves(at):
        a[dst : dst + n] = a[src : src + n]
    return a[: len(at)]


def _filtered(
    name: str,
    layout: Layout,
    value: Any,
    at: np.ndarray,
    at_list: list[int],
    keep: set[Hashable],
    cut: dict[str, int],
) -> Any:
    """`DecodeBatch.filter` of one per-sentence or per-row field: its entries `at` (`at_list`, the
    same as a list), a dict those of the `keep` keys, a padded axis cut to `cut`."""
    if layout.layers:
        return [_take_layer(a, at, layout.padded, cut) for a in value]
    if isinstance(value, np.ndarray):
        return _take(value, at, layout.padded, cut)
    if isinstance(value, list):
        return [value[i] for i in at_list]
    if isinstance(value, dict) and layout.axis == "sentence":  # keyed by the sentences' keys
        return {k: v for k, v in value.items() if k in keep}
    if isinstance(value, RowCache) and layout.axis == "row":
        return value.select(at)
    raise TypeError(f"{name}: cannot filter a {type(value).__name__} by {layout.axis}")


def _stack(arrays: list[np.ndarray], padded: str | None, longest: dict[str, int]) -> np.ndarray:
    """The first axes of all batches' arrays (rows, or sentences) one after the other; a padded
    axis runs to `longest[padded]`, zeros after each array's own length."""
    return np.concatenate(arrays) if padded is None else stack_padded(arrays, longest[padded])


def _concatenated(name: str, layout: Layout, values: list[Any], longest: dict[str, int]) -> Any:
    """`DecodeBatch.concatenate` of one field: `values`, one per batch, merged by its layout."""
    if layout.axis == "batch":
        return values[0]
    if layout.layers:
        return [_stack([v[i] for v in values], layout.padded, longest) for i in range(len(values[0]))]
    if isinstance(values[0], np.ndarray):
        return _stack(values, layout.padded, longest)
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    if isinstance(values[0], dict) and layout.axis == "sentence":
        return {k: x for v in values for k, x in v.items()}
    if isinstance(values[0], RowCache) and layout.axis == "row":
        return type(values[0]).concatenate(values)
    raise TypeError(f"{name}: cannot concatenate a {type(values[0]).__name__} by {layout.axis}")


layouts(DecodeBatch)  # a field without a Layout fails here, at import


def generate(
    model: DecoderModel,
    src_ids_lists: Sequence[Sequence[int]],
    beam: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    batch_size: int = 64,
    want_alignment: bool = False,
    want_scores: bool = True,
    target_prefixes: Sequence[Sequence[int]] | None = None,
    min_len: int = 0,
) -> list[Hypothesis]:
    """Translate source id lists (each ending with </s>) offline: sorted by length into batches of
    at most `batch_size` sentences; results in input order. `want_scores=False`: greedy
    hypotheses come without scores (None), which spares the step its log-softmax.
    `target_prefixes`: each sentence's forced first tokens (a multilingual model's target
    language token), left out of its hypothesis; `min_len`: see `DecodeBatch`."""
    order = sorted(range(len(src_ids_lists)), key=lambda i: len(src_ids_lists[i]))
    out: dict[Hashable, Hypothesis] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = DecodeBatch.from_sources(
            model,
            [src_ids_lists[i] for i in idx],
            idx,
            beam=beam,
            length_penalty=length_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            want_alignment=want_alignment,
            want_scores=want_scores,
            min_lens=min_len,
            target_prefixes=None if target_prefixes is None else [target_prefixes[i] for i in idx],
        )
        while len(batch):
            for f in batch.step(model):
                out[f.key] = f.hypothesis()
            # Finished rows ride along until they are a quarter of the batch (or all of it): each
            # filter copies the cache, so it is done in bulk, as the server's scheduler does.
            active = batch.active_keys()
            if not active:
                break  # nothing left to decode: no need to empty the batch
            if len(active) <= (1 - COMPACT_FRACTION) * batch.n_sentences:
                batch.filter(active)
    return [out[i] for i in range(len(src_ids_lists))]
