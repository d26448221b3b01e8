"""The search over a step's candidates: greedy search (each row takes its best token) and beam
search (a sentence's 2K best candidates over its K rows; those ending in </s> finish when ranked
within the first K, the best K others go on), each with a variant for a batch of one sentence on
Python scalars and lists, where numpy's cost per call would be most of a step's host time.
`DecodeBatch` runs them on its own state (`Search` is its base: the fields below are its own).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from service.decoding.cache import StepResult
from service.decoding.output_rules import NEG_INF
from service.decoding.results import Ended, Finished, Hypothesis, Node, alignment_of, chain_length, link, walk
from service.decoding.term_rows import TermRows


class Search(TermRows):
    """Greedy and beam search steps of a `DecodeBatch`, over the batch fields they read and write
    (`TermRows`: where its glossary terms landed)."""

    if not TYPE_CHECKING:  # no instance dict: `DecodeBatch` declares the slots of these fields
        __slots__ = ()

    beam: int
    eos_id: int
    pad_id: int
    keys: list[Hashable]
    length_penalty: np.ndarray
    want_alignment: np.ndarray
    want_scores: np.ndarray
    src_lens: np.ndarray
    done: np.ndarray
    steps: np.ndarray
    finished: list[list[Ended]]
    output_from: np.ndarray
    num_hypotheses: np.ndarray
    last_emitted: dict[Hashable, list[int]]
    positions: np.ndarray
    tokens: np.ndarray
    scores: np.ndarray
    hist: list[Node | None]
    out_ids: np.ndarray

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
                hist[r] = link(int(nxt[r]), att[r], hist[r])
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
            atts = walk(self.hist[r])[1]
            alignment = alignment_of([atts[j] for j in keep], self.src_lens[r])
        score = float(self.scores[r]) if self.want_scores[r] else None
        toks = [toks[j] for j in keep if toks[j] != eos]
        return Finished(
            self.keys[r], toks, score, score, alignment, int(self.steps[r]) + 1, terms=self._landed(r, toks)
        )

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
                self.hist[0] = link(tok, out.cross_attention[0], self.hist[0])
            self.last_emitted[self.keys[0]] = [tok]
            if tok == self.eos_id:
                finished.append(self._greedy_finished(0))
        self.tokens[0] = tok
        return finished

    def _beam(
        self, top_lp: np.ndarray, top_ids: np.ndarray, att: np.ndarray, force: np.ndarray
    ) -> tuple[list[Finished], np.ndarray]:
        """top_lp, top_ids: (R, k) each row's k best log-probabilities and tokens, best first."""
        n, K, k_row = len(self.keys), self.beam, top_lp.shape[1]
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
            link(tok_list[r], att[rows_list[r]] if want[r] else None, old[rows_list[r]]) if live_rows[r] else None
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
            [link(new_tok[r], att[rows[r]] if want else None, old[rows[r]]) for r in range(K)]
            if live and not stop
            else [None] * K
        )
        self.scores = np.array(new_scores, dtype=np.float32)
        self.tokens = np.array(new_tok, dtype=np.int64)
        return finished, np.array(rows, dtype=np.int64)

    def _add_finished(self, i: int, row: int, log_prob: float, att: np.ndarray) -> None:
        """Sentence i's hypothesis of row `row` ends with </s> (sum of log-probabilities `log_prob`)."""
        score = log_prob / (chain_length(self.hist[row]) + 1) ** float(self.length_penalty[i])
        self.finished[i].append((score, log_prob, self.hist[row], att[row] if self.want_alignment[i] else None))

    def _conclude(self, i: int) -> Finished:
        """Sentence i stops: its best finished hypothesis (by length-normalised score)."""
        self.done[i] = True
        ranked = sorted(self.finished[i], key=lambda h: h[0], reverse=True)  # stable: ties keep their order
        if ranked:
            score, s, node, eos_att = ranked[0]
        else:  # cannot happen with a vocabulary larger than 2 * beam; kept for safety
            score, s, node, eos_att = NEG_INF, NEG_INF, None, None
        toks, atts = walk(node)
        start = int(self.output_from[i])  # the forced language token is no part of the output
        toks, atts = toks[start:], atts[start:]
        alignment = None
        if self.want_alignment[i] and eos_att is not None:
            alignment = alignment_of([*atts, eos_att], self.src_lens[i])
        self.finished[i] = []
        best = Finished(self.keys[i], toks, score, s, alignment, int(self.steps[i]) + 1, terms=self._landed(i, toks))
        if self.num_hypotheses[i] > 1:
            best.hypotheses = [best.hypothesis()] + [
                Hypothesis(walk(h[2])[0][start:], h[0], h[1]) for h in ranked[1 : int(self.num_hypotheses[i])]
            ]
        return best
