"""Greedy and beam search over the ONNX graphs, in numpy, built for continuous batching.

It reproduces exactly the semantics of the PyTorch reference (export/generate.py):
- the source is `ids + [</s>]`; decoding starts from `<s>` at position 0;
- a sentence may emit at most `max_len = min(floor(a * src_len + b), max_positions - 1)` tokens,
  the final `</s>` included; at its last allowed step `</s>` is forced;
- beam search ranks finished hypotheses by `sum(log p) / len ** length_penalty` (`len` counts
  `</s>`); at each step the `2 * beam` best candidates of a sentence are taken, those ending in
  `</s>` finish when ranked within the first `beam`, the best `beam` others go on; a sentence
  stops once `beam` hypotheses have finished, at its last allowed step, or when nothing goes on;
- `beam == 1` is greedy search (score = plain sum of log-probabilities).

The state of a running batch is a `DecodeBatch` (the text-generation-inference `Seq2SeqLMBatch`
pattern): every row carries its own self-attention cache with a `past_mask`, position and score,
so rows at different steps share a decoder call. A sentence occupies `beam` consecutive rows and
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

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

NEG_INF = float("-inf")
# The encoder runs over a batch's sources in length-sorted chunks of this many sentences: each chunk
# is padded only to its own longest source. A mixed batch of 16 padded to its longest is 42% padding
# (test_2016_flickr), and from 8 sentences on a larger encoder batch is no cheaper per sentence.
ENCODE_CHUNK = 8


def max_output_len(src_len: int, a: float, b: int, max_positions: int) -> int:
    """Tokens a sentence may emit, </s> included; src_len counts the source's </s>."""
    return max(1, min(int(a * src_len + b), max_positions - 1))


@dataclass
class Hypothesis:
    tokens: list[int]  # emitted ids without the final </s>
    score: float  # length-normalised log-probability (greedy: plain sum)
    log_prob: float  # sum of log-probabilities, </s> included
    alignment: np.ndarray | None = None  # (len(tokens) + 1, src_len) when asked for


@dataclass
class Finished:
    """A sentence that finished at the last step."""

    key: Hashable
    tokens: list[int]  # emitted ids without the final </s>
    score: float
    log_prob: float
    alignment: np.ndarray | None  # float32 (len(tokens) + 1, src_len): one row per emitted token and
    #                               the final </s>, the last decoder layer's cross-attention over
    #                               the source tokens (</s> included), averaged over heads
    steps: int  # decoder steps this sentence took

    def hypothesis(self) -> Hypothesis:
        return Hypothesis(self.tokens, self.score, self.log_prob, self.alignment)


# A row's output so far is a linked list of immutable nodes (token, attention row or None, parent,
# length), so that reordering beams costs one reference per row, not a copy of its history.
_Node = tuple  # (int, np.ndarray | None, _Node | None, int)


def _node(tok: int, att, parent: _Node | None) -> _Node:
    return (tok, att, parent, 1 if parent is None else parent[3] + 1)


def _walk(node: _Node | None) -> tuple[list[int], list]:
    toks, atts = [], []
    while node is not None:
        toks.append(node[0])
        atts.append(node[1])
        node = node[2]
    return toks[::-1], atts[::-1]


def _length(node: _Node | None) -> int:
    return 0 if node is None else node[3]


def encode_sources(
    model, src_ids_lists: Sequence[Sequence[int]], chunk: int = ENCODE_CHUNK
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Run the encoder over sources of any lengths -> lens (n,), src_mask (n, S) int64 and per
    decoder layer the cross-attention keys and values (n, H, S, d_k), S the longest source, rows in
    input order. Sorted by length and run in chunks of `chunk`, so that no chunk pays for another's
    longest source; what lies past a source's end is hidden by src_mask."""
    n = len(src_ids_lists)
    lens = np.array([len(s) for s in src_ids_lists], dtype=np.int64)
    S = int(lens.max())
    mask = (np.arange(S)[None, :] < lens[:, None]).astype(np.int64)

    def run(rows) -> tuple[list[np.ndarray], list[np.ndarray]]:
        s_len = int(lens[rows].max())
        ids = np.full((len(rows), s_len), model.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : lens[r]] = src_ids_lists[r]
        _, ck, cv = model.encode(ids, np.ascontiguousarray(mask[rows, :s_len]))
        return ck, cv

    if n <= chunk:
        ck, cv = run(list(range(n)))
        return lens, mask, list(ck), list(cv)
    order = np.argsort(lens, kind="stable")
    ck_all = cv_all = None
    for start in range(0, n, chunk):
        rows = order[start : start + chunk]
        ck, cv = run(rows.tolist())
        if ck_all is None:
            shape = (n, ck[0].shape[1], S, ck[0].shape[3])
            ck_all = [np.empty(shape, dtype=ck[0].dtype) for _ in ck]
            cv_all = [np.empty(shape, dtype=cv[0].dtype) for _ in cv]
        s_len = ck[0].shape[2]
        for out, part in zip(ck_all + cv_all, list(ck) + list(cv)):
            out[rows, :, :s_len] = part
            out[rows, :, s_len:] = 0.0
    return lens, mask, ck_all, cv_all


def _as_list(value, n: int, name: str) -> list:
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} sentences")
        return list(value)
    return [value] * n


class DecodeBatch:
    """Decoding state of a set of sentences, `beam` consecutive rows each (see the module doc).

    Per row: past_k/past_v per layer (R, H, P, d_k), past_mask (R, P) float32, positions (R,)
    int64 (the position of the row's next input token), tokens (R,) int64 (that token), scores
    (R,) float32 (greedy: sum of log-probabilities; beam: the beam's cumulative score) and its
    output so far. Per sentence: src_mask (n, S) int64, cross_k/cross_v per layer (n, H, S, d_k),
    key, max_len, length_penalty, want_alignment, src_len (real length), done, finished hypotheses.
    """

    def __init__(self, beam: int, eos_id: int, pad_id: int):
        self.beam, self.eos_id, self.pad_id = beam, eos_id, pad_id
        self.keys: list[Hashable] = []
        self.max_len = np.zeros(0, dtype=np.int64)
        self.length_penalty = np.zeros(0, dtype=np.float64)
        self.want_alignment = np.zeros(0, dtype=bool)
        self.src_lens = np.zeros(0, dtype=np.int64)
        self.done = np.zeros(0, dtype=bool)
        self.steps = np.zeros(0, dtype=np.int64)
        self.finished: list[list[tuple[float, float, _Node | None, np.ndarray | None]]] = []
        self.src_mask = np.zeros((0, 0), dtype=np.int64)
        self.cross_k: list[np.ndarray] = []
        self.cross_v: list[np.ndarray] = []
        self.past_k: list[np.ndarray] = []
        self.past_v: list[np.ndarray] = []
        self.past_mask = np.zeros((0, 0), dtype=np.float32)
        self.positions = np.zeros(0, dtype=np.int64)
        self.tokens = np.zeros(0, dtype=np.int64)
        self.scores = np.zeros(0, dtype=np.float32)
        self.hist: list[_Node | None] = []
        self._last: dict[Hashable, list[int]] = {}

    # -- construction ---------------------------------------------------------

    @classmethod
    def from_sources(
        cls,
        model,
        src_ids_lists: Sequence[Sequence[int]],
        keys: Sequence[Hashable],
        beam: int = 1,
        length_penalty: float | Sequence[float] = 1.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        want_alignment: bool | Sequence[bool] = False,
        max_lens: Sequence[int] | None = None,
    ) -> DecodeBatch:
        """Run the encoder over `src_ids_lists` (each ending with </s>) and set up their decoding.
        `keys` identify the sentences (unique, hashable); `max_lens` overrides the length rule per
        sentence (clamped to 1..max_positions-1)."""
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
        rule = [max_output_len(int(L), max_len_a, max_len_b, model.max_positions) for L in lens]
        if max_lens is not None:
            rule = [max(1, min(int(m), model.max_positions - 1)) for m in _as_list(max_lens, n, "max_lens")]
        self.max_len = np.array(rule, dtype=np.int64)
        self.length_penalty = np.array(_as_list(length_penalty, n, "length_penalty"), dtype=np.float64)
        self.want_alignment = np.array(_as_list(want_alignment, n, "want_alignment"), dtype=bool)
        self.src_lens = lens
        self.done = np.zeros(n, dtype=bool)
        self.steps = np.zeros(n, dtype=np.int64)
        self.finished = [[] for _ in range(n)]
        self.src_mask, self.cross_k, self.cross_v = mask, list(ck), list(cv)
        self.past_k, self.past_v, self.past_mask = model.empty_past(R)
        self.positions = np.zeros(R, dtype=np.int64)
        self.tokens = np.full(R, model.bos_id, dtype=np.int64)
        scores = np.zeros((n, K), dtype=np.float32)
        scores[:, 1:] = NEG_INF  # all beams start identical: only the first one is live
        self.scores = scores.reshape(-1)
        self.hist = [None] * R
        return self

    def _empty_state(self, model) -> None:
        H, dk, L = model.n_heads, model.d_k, model.n_layers
        z = np.zeros((0, H, 0, dk), dtype=np.float32)
        self.cross_k, self.cross_v = [z] * L, [z] * L
        self.past_k, self.past_v = [z] * L, [z] * L

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
        return int(self.past_mask.shape[1])

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
        return dict(self._last)

    # -- one decoder step -----------------------------------------------------

    def step(self, model) -> list[Finished]:
        """Run one decoder step for every row; return the sentences that finished at it. Their rows
        (and those of sentences done earlier) stay until `filter()`; they get no more results."""
        self._last = {}
        if len(self) == 0:
            return []
        live_before = ~self.done
        K = self.beam
        # The graph ranks the vocabulary: the best token of a row (greedy), or its 2K best (beam:
        # a sentence's 2K best candidates over K rows x V tokens are among its rows' 2K best).
        k_row = 1 if K == 1 else min(2 * K, model.vocab_size)
        out = model.step(
            self.tokens,
            self.positions,
            self.past_k,
            self.past_v,
            self.past_mask,
            self.cross_k,
            self.cross_v,
            self.src_mask,
            top_k=k_row,
        )
        top_lp, top_ids, att = out.top_log_probs, out.top_ids, out.cross_attention
        force = self.positions >= np.repeat(self.max_len, K) - 1  # (R,) last allowed step: </s> only
        if force.any():
            top_lp, top_ids = top_lp.copy(), top_ids.copy()
            top_lp[force] = NEG_INF
            top_lp[force, 0] = out.eos_log_prob[force]
            top_ids[force] = self.pad_id
            top_ids[force, 0] = self.eos_id
        if K == 1:
            finished, rows = self._greedy(top_lp[:, 0], top_ids[:, 0], att), None
        elif self.n_sentences == 1:
            finished, rows = self._beam_one(top_lp, top_ids, att, force)
        else:
            finished, rows = self._beam(top_lp, top_ids, att, force)
        self._advance_cache(out.present_k, out.present_v, rows)
        self.steps += live_before
        return finished

    def _greedy(self, best: np.ndarray, nxt: np.ndarray, att: np.ndarray) -> list[Finished]:
        """best, nxt: (R,) each row's best log-probability and token."""
        live = ~self.done
        self.scores = self.scores + np.where(live, best, np.float32(0))  # float32 (best is)
        finished = []
        eos, pad = self.eos_id, self.pad_id
        nxt_list = nxt.tolist()
        for r in np.flatnonzero(live).tolist():
            tok = nxt_list[r]
            self.hist[r] = _node(tok, att[r] if self.want_alignment[r] else None, self.hist[r])
            self._last[self.keys[r]] = [tok]
            if tok == eos:
                self.done[r] = True
                toks, atts = _walk(self.hist[r])
                keep = [j for j, t in enumerate(toks) if t != pad]  # the reference drops pad ids
                alignment = None
                if self.want_alignment[r]:
                    alignment = np.stack([atts[j][: self.src_lens[r]] for j in keep]).astype(np.float32, copy=False)
                score = float(self.scores[r])
                finished.append(
                    Finished(
                        self.keys[r],
                        [toks[j] for j in keep if toks[j] != eos],
                        score,
                        score,
                        alignment,
                        int(self.steps[r]) + 1,
                    )
                )
        self.tokens = nxt.astype(np.int64, copy=False)
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
        want = np.repeat(self.want_alignment, K)
        live_rows = np.repeat(live & ~stop, K)
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
        order = sorted(range(len(cand)), key=lambda j: -cand[j])[: 2 * K]  # the 2K best, best first
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
        if self.finished[i]:
            score, s, node, eos_att = max(self.finished[i], key=lambda h: h[0])
        else:  # cannot happen with a vocabulary larger than 2 * beam; kept for safety
            score, s, node, eos_att = NEG_INF, NEG_INF, None, None
        toks, atts = _walk(node)
        alignment = None
        if self.want_alignment[i] and eos_att is not None:
            L = self.src_lens[i]
            alignment = np.stack([a[:L] for a in atts] + [eos_att[:L]]).astype(np.float32, copy=False)
        self.finished[i] = []
        return Finished(self.keys[i], toks, score, s, alignment, int(self.steps[i]) + 1)

    def _advance_cache(self, present_k: list[np.ndarray], present_v: list[np.ndarray], rows: np.ndarray | None) -> None:
        """The graph's present cache (past + this step) becomes the past, rows reordered to follow
        their beams (`rows[r]`: the row whose history row r continues; None: unchanged)."""
        R = len(self)
        if rows is not None and np.array_equal(rows, np.arange(R)):
            rows = None
        if rows is None:
            self.past_k, self.past_v = list(present_k), list(present_v)
        else:
            self.past_k = [k[rows] for k in present_k]
            self.past_v = [v[rows] for v in present_v]
        mask = np.concatenate([self.past_mask, np.ones((R, 1), dtype=np.float32)], axis=1)
        self.past_mask = mask if rows is None else mask[rows]
        # Rows of finished sentences may ride along until the next filter(): they stay at their
        # last position, which is within the position table (the next ones may not be).
        self.positions = self.positions + np.repeat(~self.done, self.beam)

    # -- batch surgery --------------------------------------------------------

    def filter(self, keep_keys) -> DecodeBatch:
        """Keep only the sentences in `keep_keys` (others finished or were cancelled), in batch
        order, in place; then drop source columns and cache entries no kept row uses. Returns self."""
        keep = set(keep_keys)
        idx = [i for i, k in enumerate(self.keys) if k in keep]
        if len(idx) == self.n_sentences:
            return self
        K = self.beam
        sent = np.array(idx, dtype=np.int64)
        rows = (sent[:, None] * K + np.arange(K)[None, :]).reshape(-1)
        self.keys = [self.keys[i] for i in idx]
        for name in ("max_len", "length_penalty", "want_alignment", "src_lens", "done", "steps"):
            setattr(self, name, getattr(self, name)[sent])
        self.finished = [self.finished[i] for i in idx]
        self.hist = [self.hist[r] for r in rows.tolist()]
        self.positions, self.tokens, self.scores = self.positions[rows], self.tokens[rows], self.scores[rows]
        S = int(self.src_lens.max()) if len(idx) else 0
        self.src_mask = self.src_mask[sent, :S]
        self.cross_k = [k[sent, :, :S] for k in self.cross_k]
        self.cross_v = [v[sent, :, :S] for v in self.cross_v]
        pm = self.past_mask[rows]
        used = np.flatnonzero(pm.any(axis=0)) if len(rows) else np.zeros(0, dtype=np.int64)
        if len(used) == pm.shape[1]:
            self.past_mask = pm
            self.past_k = [k[rows] for k in self.past_k]
            self.past_v = [v[rows] for v in self.past_v]
        else:  # entries that were padding in every kept row
            self.past_mask = np.ascontiguousarray(pm[:, used])
            self.past_k = [np.ascontiguousarray(k[rows][:, :, used]) for k in self.past_k]
            self.past_v = [np.ascontiguousarray(v[rows][:, :, used]) for v in self.past_v]
        self._last = {k: t for k, t in self._last.items() if k in keep}
        return self

    @classmethod
    def concatenate(cls, batches: Sequence[DecodeBatch]) -> DecodeBatch:
        """Merge batches (same beam width) whose rows may be at different steps: sources are padded
        to the longest (src_mask 0), caches to the longest past (past_mask 0)."""
        batches = [b for b in batches if b is not None]
        if not batches:
            raise ValueError("nothing to concatenate")
        first = batches[0]
        if any(b.beam != first.beam for b in batches):
            raise ValueError(f"cannot concatenate batches of beam widths {sorted({b.beam for b in batches})}")
        if len(batches) == 1:
            return first
        keys = [k for b in batches for k in b.keys]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate keys across batches")
        out = cls(first.beam, first.eos_id, first.pad_id)
        out.keys = keys
        for name in (
            "max_len",
            "length_penalty",
            "want_alignment",
            "src_lens",
            "done",
            "steps",
            "positions",
            "tokens",
            "scores",
        ):
            setattr(out, name, np.concatenate([getattr(b, name) for b in batches]))
        out.finished = [f for b in batches for f in b.finished]
        out.hist = [h for b in batches for h in b.hist]
        out._last = {k: t for b in batches for k, t in b._last.items()}
        S = max(b.src_len for b in batches)
        P = max(b.past_len for b in batches)

        def stack(arrays: list[np.ndarray], axis_len: int, dtype) -> np.ndarray:
            """The first axes of all batches' arrays (rows, or sentences) one after the other,
            padded with zeros along axis 1 (masks) or 2 (k/v) to axis_len."""
            shape = list(arrays[0].shape)
            pad_axis = 1 if len(shape) == 2 else 2
            shape[0], shape[pad_axis] = sum(a.shape[0] for a in arrays), axis_len
            res = np.zeros(shape, dtype=dtype)
            r0 = 0
            for a in arrays:
                if pad_axis == 1:
                    res[r0 : r0 + a.shape[0], : a.shape[1]] = a
                else:
                    res[r0 : r0 + a.shape[0], :, : a.shape[2]] = a
                r0 += a.shape[0]
            return res

        out.src_mask = stack([b.src_mask for b in batches], S, np.int64)
        out.past_mask = stack([b.past_mask for b in batches], P, np.float32)
        L = len(first.cross_k)
        out.cross_k = [stack([b.cross_k[i] for b in batches], S, np.float32) for i in range(L)]
        out.cross_v = [stack([b.cross_v[i] for b in batches], S, np.float32) for i in range(L)]
        out.past_k = [stack([b.past_k[i] for b in batches], P, np.float32) for i in range(L)]
        out.past_v = [stack([b.past_v[i] for b in batches], P, np.float32) for i in range(L)]
        return out


def generate(
    model,
    src_ids_lists: Sequence[Sequence[int]],
    beam: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    batch_size: int = 64,
    want_alignment: bool = False,
) -> list[Hypothesis]:
    """Translate source id lists (each ending with </s>) offline: sorted by length into batches of
    at most `batch_size` sentences; results in input order."""
    order = sorted(range(len(src_ids_lists)), key=lambda i: len(src_ids_lists[i]))
    out: list[Hypothesis | None] = [None] * len(src_ids_lists)
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
        )
        while len(batch):
            finished = batch.step(model)
            for f in finished:
                out[f.key] = f.hypothesis()
            if finished:
                batch.filter(batch.active_keys())
    return out  # type: ignore[return-value]
