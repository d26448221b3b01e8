"""`ConcatCache`, the key/value cache of the portable decoder step (service/decoding/cache.py has
the interface): per layer (R, H, P, d_k) arrays that the graph returns grown by one entry each
step; a beam reorder gathers them on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.decoding.cache import RowCache, StepResult, repeated
from service.decoding.model import DecoderModel
from service.decoding.rows import stack_padded


class ConcatCache(RowCache):
    """Per layer past keys and values (R, H, P, d_k) and past_mask (R, P) float32."""

    def __init__(self, past_k: list[np.ndarray], past_v: list[np.ndarray], past_mask: np.ndarray):
        self.past_k, self.past_v, self.past_mask = past_k, past_v, past_mask
        self._present: tuple[list[np.ndarray], list[np.ndarray]] | None = None

    @classmethod
    def empty(cls, model: DecoderModel, rows: int, beam: int, capacity: int) -> ConcatCache:
        return cls(*model.empty_past(rows))

    @property
    def past_len(self) -> int:
        return int(self.past_mask.shape[1])

    def __len__(self) -> int:
        return len(self.past_mask)

    def entries(self) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        return self.past_k, self.past_v, self.past_mask > 0

    def history(self, row: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        own = np.flatnonzero(self.past_mask[row] > 0)
        return [k[row][:, own] for k in self.past_k], [v[row][:, own] for v in self.past_v]

    @classmethod
    def resumed(
        cls,
        model: DecoderModel,
        histories: Sequence[tuple[list[np.ndarray], list[np.ndarray]]],
        beam: int,
        capacity: int,
    ) -> ConcatCache:
        """Each history repeated over its sentence's beams, padded to the longest (past_mask 0)."""
        P = max(int(ks[0].shape[1]) for ks, _ in histories)
        R, L = len(histories) * beam, model.n_layers
        past_k = [np.zeros((R, model.n_heads, P, model.d_k), dtype=np.float32) for _ in range(L)]
        past_v = [np.zeros_like(k) for k in past_k]
        mask = np.zeros((R, P), dtype=np.float32)
        for i, (ks, vs) in enumerate(histories):
            rows, T = slice(i * beam, (i + 1) * beam), int(ks[0].shape[1])
            for layer in range(L):
                past_k[layer][rows, :, :T] = ks[layer][None]
                past_v[layer][rows, :, :T] = vs[layer][None]
            mask[rows, :T] = 1.0
        return cls(past_k, past_v, mask)

    def step(
        self,
        model: DecoderModel,
        tokens: np.ndarray,
        positions: np.ndarray,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int,
        scored: bool = True,
        vocab: Sequence[np.ndarray] = (),
        no_eos: np.ndarray | None = None,
    ) -> StepResult:
        out = model.step(tokens, positions, self.past_k, self.past_v, self.past_mask, cross_k, cross_v, src_mask, top_k)
        self._present = (out.present_k, out.present_v)
        return StepResult(out.top_log_probs, out.top_ids, out.eos_log_prob, out.cross_attention)

    def first_step(
        self,
        model: DecoderModel,
        tokens: np.ndarray,
        positions: np.ndarray,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int,
        vocab: Sequence[np.ndarray] = (),
    ) -> StepResult:
        K = len(self) // len(src_mask)
        assert self.past_len == 0, "the first step is a batch's first"
        pk, pv, pm = model.empty_past(len(src_mask))
        out = model.step(tokens[::K], positions[::K], pk, pv, pm, cross_k, cross_v, src_mask, top_k)
        self._present = (
            [np.repeat(k, K, axis=0) for k in out.present_k],
            [np.repeat(v, K, axis=0) for v in out.present_v],
        )
        return repeated(StepResult(out.top_log_probs, out.top_ids, out.eos_log_prob, out.cross_attention), K)

    def advance(self, rows: np.ndarray | None) -> None:
        """The graph's present cache (past + this step) becomes the past, reordered by `rows`."""
        assert self._present is not None, "advance() follows step()"
        present_k, present_v = self._present
        self._present = None
        R = len(self.past_mask)
        if rows is not None and np.array_equal(rows, np.arange(R)):
            rows = None
        mask = np.concatenate([self.past_mask, np.ones((R, 1), dtype=np.float32)], axis=1)
        if rows is None:
            self.past_k, self.past_v, self.past_mask = list(present_k), list(present_v), mask
        else:
            self.past_k = [k[rows] for k in present_k]
            self.past_v = [v[rows] for v in present_v]
            self.past_mask = mask[rows]

    def select(self, rows: np.ndarray) -> ConcatCache:
        """The cache of `rows` only, without the entries that are padding in all of them."""
        pm = self.past_mask[rows]
        used = np.flatnonzero(pm.any(axis=0)) if len(rows) else np.zeros(0, dtype=np.int64)
        if len(used) == pm.shape[1]:
            return ConcatCache([k[rows] for k in self.past_k], [v[rows] for v in self.past_v], pm)
        return ConcatCache(
            [np.ascontiguousarray(k[rows][:, :, used]) for k in self.past_k],
            [np.ascontiguousarray(v[rows][:, :, used]) for v in self.past_v],
            np.ascontiguousarray(pm[:, used]),
        )

    @classmethod
    def concatenate(cls, caches: Sequence[ConcatCache]) -> ConcatCache:
        """Rows one after the other, each padded to the longest past (past_mask 0)."""
        P = max(c.past_len for c in caches)
        return cls(
            [stack_padded([c.past_k[i] for c in caches], P) for i in range(len(caches[0].past_k))],
            [stack_padded([c.past_v[i] for c in caches], P) for i in range(len(caches[0].past_v))],
            stack_padded([c.past_mask for c in caches], P),
        )
