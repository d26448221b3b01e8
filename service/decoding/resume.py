"""A decode that goes on from another's first tokens: the decoder state a finished greedy row
leaves (`DecoderState`, kept where its sentence asks: `DecodeBatch.from_sources(keep_states=)`),
and what a later sentence takes of it (`Resume`: the state's first `upto` emitted tokens).

A resumed sentence runs no encoder and none of those tokens' decoder steps: its cache starts with
the state's self-attention entries of the positions before `upto`, its encoder's keys and values
are the state's, and the `upto` tokens stand as a forced prefix (log-probability 0, kept in the
output after the language token), so it decodes exactly as the same sentence from scratch with
them as its target prefix (`kept_prefixes`), up to the float rounding of batch shapes. All beams
of a sentence share that history (the fused cache's indirection names its first beam's slots;
the portable cache repeats them).

This is what lets a glossary row's second pass (service.engine.placement) start where its first
term goes instead of at the start.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class DecoderState:
    """A finished greedy row's decoder state: every token it emitted (its forced prefix included,
    </s> last), per decoder layer the self-attention keys and values of its inputs ((H, T, d_k):
    the start token at position 0, then its emitted tokens), and its encoder's cross-attention
    keys and values ((H, S, d_k), S its source length, </s> included)."""

    tokens: list[int]
    self_k: list[np.ndarray]
    self_v: list[np.ndarray]
    cross_k: list[np.ndarray]
    cross_v: list[np.ndarray]

    @property
    def inputs(self) -> int:
        """T: the positions whose keys and values it holds."""
        return int(self.self_k[0].shape[1]) if self.self_k else 0

    @property
    def src_len(self) -> int:
        return int(self.cross_k[0].shape[1]) if self.cross_k else 0


@dataclass(frozen=True, eq=False)
class Resume:
    """What a sentence takes of a `DecoderState`: its first `upto` emitted tokens (before its
    </s>; none: it starts from the start, its encoder's results taken), forced, with the keys and
    values of the positions before `upto`; and, where
    the sentence wants its alignment, the attention rows of those of them in its output (after the
    language token: (upto - output_from, S))."""

    state: DecoderState
    upto: int
    attention: np.ndarray | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.upto <= min(self.state.inputs, len(self.state.tokens) - 1):
            raise ValueError(
                f"resume: {self.upto} tokens of a state of {self.state.inputs} inputs and {len(self.state.tokens)} tokens"
            )

    @property
    def tokens(self) -> list[int]:
        """The tokens forced: the state's first `upto`."""
        return self.state.tokens[: self.upto]

    def history(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per layer the keys and values (H, upto, d_k) of positions 0..upto-1."""
        n = self.upto
        return [k[:, :n] for k in self.state.self_k], [v[:, :n] for v in self.state.self_v]


def encoded(resumes: list[Resume]) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """The encoder pass's results for resumed sentences, from their states (`encode_sources`'
    form): lens (n,), src_mask (n, S) int64 and per layer the keys and values (n, H, S, d_k), S the
    longest source, zeros past each source's end."""
    lens = np.array([r.state.src_len for r in resumes], dtype=np.int64)
    S = int(lens.max())
    mask = (np.arange(S)[None, :] < lens[:, None]).astype(np.int64)
    first = resumes[0].state.cross_k
    ck: list[np.ndarray] = []
    cv: list[np.ndarray] = []
    for i in range(len(first)):
        H, _, dk = first[i].shape
        k = np.zeros((len(resumes), H, S, dk), dtype=np.float32)
        v = np.zeros_like(k)
        for j, r in enumerate(resumes):
            k[j, :, : lens[j]] = r.state.cross_k[i]
            v[j, :, : lens[j]] = r.state.cross_v[i]
        ck.append(k)
        cv.append(v)
    return lens, mask, ck, cv
