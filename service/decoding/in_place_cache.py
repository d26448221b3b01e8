"""`InPlaceCache`, the key/value cache of the fused decoder step (export/fused/;
service/decoding/cache.py has the interface): per layer (R, H, M, d_k) buffers of M slots, bound
once with IO binding and written in place by the graph at slot P; a beam reorder changes only
`indirection` (which beam of the sentence holds each slot of a beam's history). Nothing is copied
between steps; `select` and `concatenate` copy once, when a batch changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from contract.graphs import (
    BEAM_WIDTH,
    CACHE_INDIRECTION,
    CROSS_ATTENTION,
    EOS_BIAS,
    EOS_LOG_PROB,
    PAST_SEQUENCE_LENGTH,
    POSITIONS,
    SELF_MASK,
    SRC_MASK,
    TOKENS,
    TOP_IDS,
    TOP_K,
    TOP_LOG_PROBS,
    VOCAB_IDS,
    cache_key,
    cache_value,
    cross_key,
    cross_value,
    present_key,
    present_value,
)
from service.decoding.cache import STEP_RESULT_OUTPUTS, RowCache, StepResult, repeated
from service.decoding.concat_cache import ConcatCache
from service.decoding.model import DecoderModel
from service.decoding.rows import row_moves
from service.runtime.onnx_model import BoundStep, OrtValues


def _fused_inputs(
    tokens: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray,
    indirection: np.ndarray,
    keys: list[np.ndarray],
    values: list[np.ndarray],
    cross_k: list[np.ndarray],
    cross_v: list[np.ndarray],
    src_mask: np.ndarray,
    top_k: int | None,
    vocab_ids: np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The fused step's inputs (`contract.graphs.fused_decoder_io`) at slot 0; the caller writes the
    step's slot into `past_sequence_length` when it runs later steps on the same arrays. top_k None:
    the unscored step's inputs, which have none; vocab_ids: the shortlist step's candidates."""
    ins: dict[str, np.ndarray] = {
        TOKENS: tokens,
        POSITIONS: positions,
        PAST_SEQUENCE_LENGTH: np.zeros(1, dtype=np.int32),
        SELF_MASK: mask,
        SRC_MASK: np.ascontiguousarray(src_mask, dtype=np.int32),
        BEAM_WIDTH: np.array([indirection.shape[1]], dtype=np.int32),
        CACHE_INDIRECTION: indirection,
    }
    if top_k is not None:
        ins[TOP_K] = np.array([top_k], dtype=np.int64)
    if vocab_ids is not None:
        ins[VOCAB_IDS] = vocab_ids
    for i, (k, v) in enumerate(zip(keys, values)):
        ins[cache_key(i)], ins[cache_value(i)] = k, v
        ins[cross_key(i)] = np.ascontiguousarray(cross_k[i], dtype=np.float32)
        ins[cross_value(i)] = np.ascontiguousarray(cross_v[i], dtype=np.float32)
    return ins


class InPlaceCache(RowCache):
    """Per layer key and value buffers (R, H, M, d_k), mask (R, M) int32 (1: the row's own slot),
    indirection (n, K, M) int32, and P, the slot the next step writes (slots 0..P-1 are used)."""

    def __init__(self, k: list[np.ndarray], v: list[np.ndarray], mask: np.ndarray, indirection: np.ndarray, P: int):
        self.k, self.v, self.mask, self.indirection, self.P = k, v, mask, indirection, P
        # The IO bindings of these buffers and the step's inputs, one for the scored step and one for
        # the unscored, made at the first step of each and again when the batch's sources (after a
        # filter or a concatenation) or shortlist change; a step that ranks another number of
        # candidates (a glossary row's steps switch between a few) binds its ranked outputs only.
        self._bindings: dict[bool, _Binding] = {}
        self._bound_for: tuple[np.ndarray, np.ndarray | None] | None = None
        self._values: OrtValues = {}  # the OrtValues of the bound buffers, which the bindings share
        # The batch's vocab_ids (a shortlist's candidates), worked out when its sentences change.
        self._vocab_for: Sequence[np.ndarray] | None = None
        self._vocab_ids: np.ndarray | None = None

    @classmethod
    def empty(cls, model: DecoderModel, rows: int, beam: int, capacity: int) -> InPlaceCache:
        # Not zeroed: rows that start together write every slot before any step reads it (the
        # kernel reads slots up to P only, and a beam's slot through the indirection, which names
        # only written rows); zeroing them costs 1.5 ms a batch of 32 x 4 beams.
        shape = (rows, model.n_heads, capacity, model.d_k)
        k = [np.empty(shape, dtype=np.float32) for _ in range(model.n_layers)]
        v = [np.empty(shape, dtype=np.float32) for _ in range(model.n_layers)]
        indirection = np.broadcast_to(np.arange(beam, dtype=np.int32)[None, :, None], (rows // beam, beam, capacity))
        return cls(k, v, np.zeros((rows, capacity), dtype=np.int32), np.ascontiguousarray(indirection), 0)

    @property
    def past_len(self) -> int:
        return self.P

    def __len__(self) -> int:
        return len(self.mask)

    def entries(self) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray]:
        k, v = self._resolved(np.arange(len(self.mask)), np.arange(self.P))
        return k, v, self.mask[:, : self.P] > 0

    def history(self, row: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        own = np.flatnonzero(self.mask[row, : self.P] > 0)
        k, v = self._resolved(np.array([row]), own)
        return [x[0] for x in k], [x[0] for x in v]

    @classmethod
    def resumed(
        cls,
        model: DecoderModel,
        histories: Sequence[tuple[list[np.ndarray], list[np.ndarray]]],
        beam: int,
        capacity: int,
    ) -> InPlaceCache:
        """Each history in its sentence's first beam's first slots, which the indirection names for
        every beam of it; the slots after a shorter history are padding (mask 0), zeroed. Nothing
        else is zeroed (as in `empty`): the other beams' rows are read only through the
        indirection, at slots a step writes first."""
        P = max(int(ks[0].shape[1]) for ks, _ in histories)
        n, L = len(histories), model.n_layers
        capacity = max(capacity, P + 1)
        shape = (n * beam, model.n_heads, capacity, model.d_k)
        k = [np.empty(shape, dtype=np.float32) for _ in range(L)]
        v = [np.empty(shape, dtype=np.float32) for _ in range(L)]
        mask = np.zeros((n * beam, capacity), dtype=np.int32)
        indirection = np.empty((n, beam, capacity), dtype=np.int32)
        indirection[...] = np.arange(beam, dtype=np.int32)[None, :, None]
        for i, (ks, vs) in enumerate(histories):
            T, rows = int(ks[0].shape[1]), slice(i * beam, (i + 1) * beam)
            for layer in range(L):
                k[layer][i * beam, :, :T] = ks[layer]
                v[layer][i * beam, :, :T] = vs[layer]
                k[layer][rows, :, T:P] = 0.0
                v[layer][rows, :, T:P] = 0.0
            mask[rows, :T] = 1
            indirection[i, :, :T] = 0
        return cls(k, v, mask, indirection, P)

    @property
    def capacity(self) -> int:
        return int(self.mask.shape[1])

    @property
    def beam(self) -> int:
        return int(self.indirection.shape[1])

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
        if self.P >= self.capacity:
            self._grow(max(2 * self.capacity, self.P + 1))
        scored = scored or not model.unscored_steps
        vocab_ids = self._batch_vocab(model, vocab)
        if vocab_ids is not None:
            top_k = min(top_k, len(vocab_ids))
        if self._bound_for is None or self._bound_for[0] is not cross_k[0] or self._bound_for[1] is not vocab_ids:
            self._unbind()
            self._bound_for = (cross_k[0], vocab_ids)
        binding = self._bindings.get(scored)
        if binding is None:
            binding = self._bind(model, cross_k, cross_v, src_mask, top_k, scored, vocab_ids)
        elif scored and binding.top_k != top_k:
            binding.rank(top_k)
        bound, ins, out = binding.bound, binding.ins, binding.outs
        ins[TOKENS][:, 0] = tokens
        ins[POSITIONS][:, 0] = positions
        ins[PAST_SEQUENCE_LENGTH][0] = self.P
        if EOS_BIAS in ins:
            bias = ins[EOS_BIAS]
            if no_eos is None:
                bias.fill(0.0)
            else:
                np.copyto(bias[:, 0], np.where(no_eos, -np.inf, 0.0))
        self.mask[:, self.P] = 1
        bound.run()
        # The output buffers are the next step's too: the search keeps what it needs as copies.
        return StepResult(
            out[TOP_LOG_PROBS].copy() if scored else None,
            out[TOP_IDS].copy(),
            out[EOS_LOG_PROB].copy() if scored else None,
            out[CROSS_ATTENTION].copy(),
        )

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
        K = self.beam
        assert self.P == 0, "the first step is a batch's first"
        vocab_ids = self._batch_vocab(model, vocab)
        if vocab_ids is not None:
            top_k = min(top_k, len(vocab_ids))
        # The first beams alone, in a cache of one slot; their entries go to slot 0 of their rows,
        # the only rows of slot 0 that the indirection names after this step.
        n, L = len(self) // K, len(self.k)
        empty = [np.zeros((n, model.n_heads, 1, model.d_k), dtype=np.float32)] * L
        tokens, positions = np.ascontiguousarray(tokens[::K, None]), np.ascontiguousarray(positions[::K, None])
        one_slot, one_beam = np.ones((n, 1), dtype=np.int32), np.zeros((n, 1, 1), dtype=np.int32)
        feeds = _fused_inputs(
            tokens, positions, one_slot, one_beam, empty, empty, cross_k, cross_v, src_mask, top_k, vocab_ids
        )
        present = [name for i in range(L) for name in (present_key(i), present_value(i))]
        out = model.run_fused(feeds, [*STEP_RESULT_OUTPUTS, *present])
        for i in range(L):
            self.k[i][::K, :, 0] = out[4 + 2 * i][:, :, 0]
            self.v[i][::K, :, 0] = out[5 + 2 * i][:, :, 0]
        self.mask[:, 0] = 1
        return repeated(StepResult(*out[:4]), K)

    def _bind(
        self,
        model: DecoderModel,
        cross_k: list[np.ndarray],
        cross_v: list[np.ndarray],
        src_mask: np.ndarray,
        top_k: int,
        scored: bool,
        vocab_ids: np.ndarray | None,
    ) -> _Binding:
        R = len(self.mask)
        tokens, positions = np.zeros((R, 1), dtype=np.int64), np.zeros((R, 1), dtype=np.int64)
        ins = _fused_inputs(
            tokens,
            positions,
            self.mask,
            self.indirection,
            self.k,
            self.v,
            cross_k,
            cross_v,
            src_mask,
            top_k if scored else None,
            vocab_ids,
        )
        if not scored and model.unscored_bans_eos:
            ins[EOS_BIAS] = np.zeros((R, 1), dtype=np.float32)
        outs: dict[str, np.ndarray] = {
            TOP_IDS: np.empty((R, top_k), dtype=np.int64),
            CROSS_ATTENTION: np.empty((R, src_mask.shape[1]), dtype=np.float32),
        }
        if scored:
            outs[TOP_LOG_PROBS] = np.empty((R, top_k), dtype=np.float32)
            outs[EOS_LOG_PROB] = np.empty(R, dtype=np.float32)
        for i in range(len(self.k)):
            outs[present_key(i)], outs[present_value(i)] = self.k[i], self.v[i]  # the inputs' buffers
        binding = _Binding(model.bind_step(ins, outs, scored, self._values), ins, outs, top_k)
        self._bindings[scored] = binding
        return binding

    def _batch_vocab(self, model: DecoderModel, vocab: Sequence[np.ndarray]) -> np.ndarray | None:
        """The batch's vocab_ids where the model ranks over a shortlist (None: it does not), made
        from the sentences' candidates `vocab` again only when the batch's sentences changed (a
        filter or a concatenation gives a new list)."""
        shortlist = model.shortlist
        if shortlist is None:
            return None
        if self._vocab_ids is None or self._vocab_for is not vocab:
            self._vocab_ids, self._vocab_for = shortlist.batch_ids(vocab, fill=model.pad_id), vocab
        return self._vocab_ids

    def advance(self, rows: np.ndarray | None) -> None:
        """Slot P is written; beams follow their parents through the indirection alone."""
        P, K = self.P, self.beam
        if rows is not None and K > 1:
            n = len(rows) // K
            parent = (rows % K).reshape(n, K)  # the parent beam of each beam (rows[r] is in r's sentence)
            ind = self.indirection
            ind[:, :, :P] = ind[np.arange(n)[:, None], parent, :P]
            ind[:, :, P] = parent  # slot P was written in the parent's own row
        self.P = P + 1

    def _resolved(self, rows: np.ndarray, slots: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per layer the keys and values of `rows` at `slots`, each row's history gathered from the
        beams the indirection names: (len(rows), H, len(slots), d_k)."""
        K = self.beam
        owner = (rows // K * K)[:, None] + self.indirection.reshape(-1, self.capacity)[rows][:, slots]  # (r, t)
        gather = (owner, slice(None), slots[None, :])
        return (
            [np.ascontiguousarray(k[gather].transpose(0, 2, 1, 3)) for k in self.k],
            [np.ascontiguousarray(v[gather].transpose(0, 2, 1, 3)) for v in self.v],
        )

    def select(self, rows: np.ndarray) -> InPlaceCache:
        """`rows` (whole sentences), without the slots that none of them uses. A sentence's beams
        move together, so the indirection stays valid as it is.

        When every slot is still used (rows that started together: static batches, offline), the
        kept rows move to the front of the same buffers (`row_moves`: only rows out of place, only
        their used slots), and the new cache holds views of those: no allocation, nothing zeroed.
        This cache is not used after."""
        mask = self.mask[rows, : self.P]
        slots = np.flatnonzero(mask.any(axis=0)) if len(rows) else np.zeros(0, dtype=np.int64)
        if len(slots) < self.P or len(rows) == 0:
            return self._packed([self], [rows], [slots], self.capacity - self.P + len(slots))
        m, P, K = len(rows), self.P, self.beam
        for dst, src, n in row_moves(rows):
            for buf in self.k + self.v:
                buf[dst : dst + n, :, :P] = buf[src : src + n, :, :P]
        self.mask[:m] = self.mask[rows]
        self.indirection[: m // K] = self.indirection[rows[::K] // K]
        return InPlaceCache(
            [b[:m] for b in self.k], [b[:m] for b in self.v], self.mask[:m], self.indirection[: m // K], P
        )

    @classmethod
    def concatenate(cls, caches: Sequence[InPlaceCache]) -> InPlaceCache:
        """Rows one after the other, each history in the first slots (mask 0 after it up to the
        longest); capacity for the steps each batch still had room for."""
        P = max(c.P for c in caches)
        capacity = P + max(c.capacity - c.P for c in caches)
        every = [np.arange(len(c.mask)) for c in caches]
        return cls._packed(caches, every, [np.arange(c.P) for c in caches], capacity)

    @classmethod
    def _packed(
        cls,
        caches: Sequence[InPlaceCache],
        rows_of: Sequence[np.ndarray],
        slots_of: Sequence[np.ndarray],
        capacity: int,
    ) -> InPlaceCache:
        """The `rows_of` each cache at its `slots_of` (the same slots for all its rows) in new
        buffers of `capacity` slots, one cache after the other, each from slot 0."""
        first = caches[0]
        R = sum(len(r) for r in rows_of)
        H, dk, L, K = first.k[0].shape[1], first.k[0].shape[3], len(first.k), first.beam
        k = [np.zeros((R, H, capacity, dk), dtype=np.float32) for _ in range(L)]
        v = [np.zeros((R, H, capacity, dk), dtype=np.float32) for _ in range(L)]
        mask = np.zeros((R, capacity), dtype=np.int32)
        indirection = np.empty((R // K, K, capacity), dtype=np.int32)
        indirection[...] = np.arange(K, dtype=np.int32)[None, :, None]
        r0, P = 0, 0
        for c, rows, slots in zip(caches, rows_of, slots_of):
            n0, T = r0 // K, len(slots)
            prefix = T == 0 or (slots[0] == 0 and slots[-1] == T - 1)  # slots 0..T-1: slicing, no gather
            at = (rows, slice(None), slice(None, T)) if prefix else None
            for i in range(L):
                k[i][r0 : r0 + len(rows), :, :T] = c.k[i][at] if at else c.k[i][rows][:, :, slots]
                v[i][r0 : r0 + len(rows), :, :T] = c.v[i][at] if at else c.v[i][rows][:, :, slots]
            mask[r0 : r0 + len(rows), :T] = c.mask[rows][:, slots]
            indirection[n0 : n0 + len(rows) // K, :, :T] = c.indirection[rows[::K] // K][:, :, slots]
            r0 += len(rows)
            P = max(P, T)
        return cls(k, v, mask, indirection, P)

    def _grow(self, capacity: int) -> None:
        """Larger buffers (a batch that admitted rows late decodes past its first capacity)."""
        grown = InPlaceCache._packed([self], [np.arange(len(self.mask))], [np.arange(self.P)], capacity)
        self.k, self.v, self.mask, self.indirection = grown.k, grown.v, grown.mask, grown.indirection
        self._unbind()

    def _unbind(self) -> None:
        """Drop the bindings and their OrtValues (the buffers they name are gone or go)."""
        self._bindings.clear()
        self._values.clear()


class _Binding:
    """A cache's bound step, its input and output buffers, and the candidates it ranks (`top_k`):
    a step that ranks another number writes it into the bound top_k input and binds the ranked
    outputs of that width (kept for the next switch back), the rest bound as it was."""

    def __init__(self, bound: BoundStep, ins: dict[str, np.ndarray], outs: dict[str, np.ndarray], top_k: int):
        self.bound, self.ins, self.outs, self.top_k = bound, ins, outs, top_k
        self._ranked = {top_k: {n: outs[n] for n in (TOP_IDS, TOP_LOG_PROBS) if n in outs}}

    def rank(self, top_k: int) -> None:
        ranked = self._ranked.get(top_k)
        if ranked is None:
            R = len(self.outs[TOP_IDS])
            ranked = self._ranked[top_k] = {
                TOP_IDS: np.empty((R, top_k), dtype=np.int64),
                TOP_LOG_PROBS: np.empty((R, top_k), dtype=np.float32),
            }
        self.ins[TOP_K][0] = top_k
        self.outs.update(ranked)
        self.bound.bind_outputs(ranked)
        self.top_k = top_k


def new_cache(model: DecoderModel, rows: int, beam: int, capacity: int) -> RowCache:
    """An empty cache for the graph `model` runs (`model.graph`): the fused graph's in-place
    buffers, else the portable graph's concatenated past; room for `capacity` steps."""
    cls = InPlaceCache if model.graph == "fused" else ConcatCache
    return cls.empty(model, rows, beam, capacity)


def resumed_cache(
    model: DecoderModel,
    histories: Sequence[tuple[list[np.ndarray], list[np.ndarray]]],
    beam: int,
    capacity: int,
) -> RowCache:
    """`new_cache`'s class for `model`, with each sentence's beams holding its history
    (`RowCache.resumed`)."""
    cls = InPlaceCache if model.graph == "fused" else ConcatCache
    return cls.resumed(model, histories, beam, capacity)
