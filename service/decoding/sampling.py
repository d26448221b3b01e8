"""Random sampling of the next token (CTranslate2's sampling_topk / sampling_topp /
sampling_temperature), on the host, from the candidates the decoder step ranked in the graph.

A sampling sentence decodes as greedy search does (beam 1); at each step the token is drawn from
its row's candidates instead of taking the best one: the `topk` best (all the step returned when
topk is 0), their log-probabilities divided by `temperature`, cut to the smallest best-first set
whose probability reaches `topp`. Each sentence draws from its own numpy Generator, so a seeded
request is reproducible whatever else shares its batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(eq=False)
class Sampling:
    """How one sentence samples."""

    topk: int  # 0: every candidate of the step; else at most this many (1: the best, as greedy search)
    topp: float  # in (0, 1]
    temperature: float  # > 0
    rng: np.random.Generator

    def candidates(self, vocab_size: int) -> int:
        """The candidates a step must rank for this sentence."""
        return min(self.topk, vocab_size) if self.topk else vocab_size


def sampling_rng(seed: int, index: int) -> np.random.Generator:
    """The generator of a request's text `index`: derived from (seed, index); seed 0 = random."""
    return np.random.default_rng([seed, index] if seed else None)


def draw(sampling: Sampling, log_probs: np.ndarray, banned: np.ndarray | None = None) -> int:
    """The index of the candidate drawn among `log_probs` (one row's candidates, best first);
    `banned` (bool, same shape): candidates that may not be drawn (</s> before min_len)."""
    k = log_probs.shape[0] if sampling.topk == 0 else min(sampling.topk, log_probs.shape[0])
    logits = log_probs[:k].astype(np.float64) / sampling.temperature
    if banned is not None:
        logits = np.where(banned[:k], -np.inf, logits)
    top = logits.max()
    if not np.isfinite(top):
        return 0  # nothing may be drawn: the step's own rules decide
    p = np.exp(logits - top)
    p /= p.sum()
    if sampling.topp < 1.0:
        order = np.argsort(-p, kind="stable")
        keep = np.cumsum(p[order]) - p[order] < sampling.topp  # the best first, until topp is reached
        cut = np.zeros_like(p)
        cut[order[keep]] = p[order[keep]]
        p = cut / cut.sum()
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, sampling.rng.random() * cdf[-1], side="right"), k - 1))
