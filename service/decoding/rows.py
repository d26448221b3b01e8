"""Moving and padding the rows of a batch's arrays: in place to the front (`row_moves`,
`fill_order`: a filter that copies as few rows as it can), and one after the other with padding
(`stack_padded`: a concatenation of batches at different steps).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def row_moves(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """How to bring `rows` of an array to its front in place, row j of the result from row
    rows[j]: (dst, src, n) slices to copy in order. Rows already in place stay; each run of rows
    that move together (consecutive sources to consecutive places) is one slice. Either every
    source lies behind the new end (`fill_order`: nothing overlaps) or `rows` ascend, so that rows
    move down onto lower addresses (numpy copies overlapping slices safely)."""
    moved = np.flatnonzero(rows != np.arange(len(rows)))
    if not len(moved):
        return []
    src = rows[moved]
    breaks = (np.flatnonzero((np.diff(moved) != 1) | (np.diff(src) != 1)) + 1).tolist()
    return [(int(moved[a]), int(src[a]), b - a) for a, b in zip([0, *breaks], [*breaks, len(moved)])]


def fill_order(kept: Sequence[int]) -> list[int]:
    """The order in which the ascending indices `kept` take the first len(kept) places, moving as
    few as possible: an index that is already within them stays, and those behind fill the gaps
    the others left, in order. A filter then copies one row for each dropped one within the new
    length, where keeping the order would move every row behind the first gap."""
    m = len(kept)
    order = list(range(m))
    gaps = sorted(set(order).difference(kept))
    for gap, i in zip(gaps, kept[m - len(gaps) :]):
        order[gap] = i
    return order


def stack_padded(arrays: Sequence[np.ndarray], axis_len: int) -> np.ndarray:
    """The arrays' first axes (rows or sentences) one after the other, each padded with zeros to
    `axis_len` along axis 1 (masks: (N, T)) or axis 2 (keys and values: (N, H, T, d_k))."""
    shape = list(arrays[0].shape)
    pad_axis = 1 if len(shape) == 2 else 2
    shape[0], shape[pad_axis] = sum(a.shape[0] for a in arrays), axis_len
    out = np.zeros(shape, dtype=np.result_type(*arrays))
    r0 = 0
    for a in arrays:
        if pad_axis == 1:
            out[r0 : r0 + a.shape[0], : a.shape[1]] = a
        else:
            out[r0 : r0 + a.shape[0], :, : a.shape[2]] = a
        r0 += a.shape[0]
    return out
