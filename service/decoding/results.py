"""What decoding returns: a sentence that finished (`Finished`) and its hypotheses (`Hypothesis`),
and the list a beam keeps its output in while it decodes: linked immutable nodes (token, attention
row or None, parent, length), so that reordering beams costs one reference per row, not a copy of
its history (`link`, `walk`). Greedy rows never reorder: their tokens go to
`DecodeBatch.out_ids`, and nodes carry only the attention rows of those that want their alignment.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

from service.decoding.resume import DecoderState


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
    # Glossary terms (`service.decoding.terms`): (term, start, end) token positions in `tokens`
    # where each term's target stands, in output order.
    terms: list[tuple[int, int, int]] = field(default_factory=list)
    # Its decoder state, where its sentence kept it (service.decoding.resume); else None.
    state: DecoderState | None = None

    def hypothesis(self) -> Hypothesis:
        return Hypothesis(self.tokens, self.score, self.log_prob, self.alignment)


Node: TypeAlias = "tuple[int, np.ndarray | None, Node | None, int]"
# A hypothesis that ended with </s> while its sentence still decodes: (length-normalised score,
# sum of log-probabilities, its output without the </s>, the </s> step's attention row or None).
Ended: TypeAlias = "tuple[float, float, Node | None, np.ndarray | None]"


def link(tok: int, att: np.ndarray | None, parent: Node | None) -> Node:
    return (tok, att, parent, 1 if parent is None else parent[3] + 1)


def walk(node: Node | None) -> tuple[list[int], list[np.ndarray | None]]:
    toks: list[int] = []
    atts: list[np.ndarray | None] = []
    while node is not None:
        toks.append(node[0])
        atts.append(node[1])
        node = node[2]
    return toks[::-1], atts[::-1]


def chain_length(node: Node | None) -> int:
    return 0 if node is None else node[3]


def alignment_of(atts: list[np.ndarray | None], src_len: int) -> np.ndarray:
    """float32 (len(atts), src_len): a finished hypothesis's attention rows, cut to its source."""
    cut = []
    for a in atts:
        assert a is not None, "a sentence that wants its alignment records the attention of every step"
        cut.append(a[:src_len])
    return np.stack(cut).astype(np.float32, copy=False)
