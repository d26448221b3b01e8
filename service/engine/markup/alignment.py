"""The decoder's alignment of a block's translation to its source (`Alignment`), which places the
block's inline markup (`service.engine.markup.project`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Alignment:
    """The decoder's alignment of one block: `source` the source tokens' spans in `Block.text`,
    `target` the target tokens' spans in the translation, `links[i]` the source token that target
    token i aligns to (its attention's argmax; -1: none). `word_starts`, when given, says for each
    target token whether it begins a word (SentencePiece's "▁"): a language written without spaces
    has words there too; without it, words are the runs between spaces."""

    source: tuple[tuple[int, int], ...]
    target: tuple[tuple[int, int], ...]
    links: tuple[int, ...]
    word_starts: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        if len(self.links) != len(self.target):
            raise ValueError(f"{len(self.links)} links for {len(self.target)} target tokens")
        if self.word_starts and len(self.word_starts) != len(self.target):
            raise ValueError(f"{len(self.word_starts)} word starts for {len(self.target)} target tokens")
        if any(not -1 <= link < len(self.source) for link in self.links):
            raise ValueError(f"a link outside the {len(self.source)} source tokens")

    @classmethod
    def from_matrix(
        cls, source: Sequence[tuple[int, int]], target: Sequence[tuple[int, int]], matrix: npt.ArrayLike
    ) -> Alignment:
        """From a (target tokens, source tokens) attention or alignment matrix: each target token
        aligns to its row's largest weight (an all-zero row, or no source token: none)."""
        weights = np.asarray(matrix, dtype=np.float64).reshape(len(target), len(source))
        if not len(source):
            return cls(tuple(source), tuple(target), (-1,) * len(target))
        best = weights.argmax(axis=1)
        links = tuple(int(b) if weights[i, b] > 0 else -1 for i, b in enumerate(best))
        return cls(tuple(source), tuple(target), links)

    @classmethod
    def join(cls, parts: Sequence[tuple[int, int, Alignment]]) -> Alignment:
        """A block's alignment from its sentences': each part is (where the sentence starts in
        `Block.text`, where its translation starts in the block's translation, its alignment)."""
        if len(parts) == 1 and parts[0][0] == parts[0][1] == 0:
            return parts[0][2]  # one sentence at the start of both: its own
        source: list[tuple[int, int]] = []
        target: list[tuple[int, int]] = []
        links: list[int] = []
        starts: list[bool] = []
        for source_at, target_at, part in parts:
            links += [link + len(source) if link >= 0 else -1 for link in part.links]
            source += [(start + source_at, end + source_at) for start, end in part.source]
            target += [(start + target_at, end + target_at) for start, end in part.target]
            starts += part.word_starts or [False] * len(part.target)
        return cls(tuple(source), tuple(target), tuple(links), tuple(starts) if any(starts) else ())
