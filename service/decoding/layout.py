"""How a `DecodeBatch`'s fields follow its rows: each field declares a `Layout` (batch-wide, per
sentence or per row, padded along the source or the output, one array per decoder layer), and
`filtered` and `concatenated` carry a field through `LaidOut.filter` and `LaidOut.concatenate`
(`DecodeBatch`'s base) by that declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal, Self

import numpy as np

from service.decoding.cache import RowCache
from service.decoding.rows import fill_order, row_moves, stack_padded


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


def batch_wide() -> Any:
    return field(metadata={"layout": Layout("batch")})


def per(
    axis: Literal["sentence", "row"],
    empty: Callable[[], Any],
    padded: Literal["source", "output"] | None = None,
    layers: bool = False,
) -> Any:
    """A field indexed by sentence or row; `empty()` makes its value for no sentences."""
    return field(default_factory=empty, metadata={"layout": Layout(axis, padded, layers)})


def zeros(*shape: int, dtype: type) -> Callable[[], np.ndarray]:
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


def pad_axis(a: np.ndarray) -> int:
    """The axis that runs to the longest source: 1 of a mask (N, S), 2 of keys or values (N, H, S, d_k)."""
    return 1 if a.ndim == 2 else 2


def out_width(beam: int, max_len: np.ndarray) -> int:
    """Columns of a batch's `out_ids`: its sentences' longest output (greedy), none (beam search)."""
    return int(max_len.max()) if beam == 1 and len(max_len) else 0


def check_batch_wide(cls: type, batches: Sequence[Any]) -> None:
    """ValueError unless the batches agree on every batch-wide field (beam width, special ids)."""
    for name, layout in layouts(cls):
        if layout.axis == "batch" and any(getattr(b, name) != getattr(batches[0], name) for b in batches):
            raise ValueError(
                f"cannot concatenate batches of different {name}: {sorted({getattr(b, name) for b in batches})}"
            )


def take(a: np.ndarray, at: np.ndarray, padded: str | None, cut: dict[str, int]) -> np.ndarray:
    """The entries `at` of a per-sentence or per-row array, a padded axis cut to `cut[padded]`."""
    if padded is not None:
        return a[(at,) + (slice(None),) * (pad_axis(a) - 1) + (slice(None, cut[padded]),)]
    return a[at]


def take_layer(a: np.ndarray, at: np.ndarray, padded: str | None, cut: dict[str, int]) -> np.ndarray:
    """A layer's keys or values of the kept sentences. While the source axis keeps its length, the
    kept rows move to the front of the same array, as the fused cache's do: only those that fill a
    gap are copied, and nothing is allocated."""
    if padded == "source" and a.shape[pad_axis(a)] != cut["source"]:
        return take(a, at, padded, cut)
    for dst, src, n in row_moves(at):
        a[dst : dst + n] = a[src : src + n]
    return a[: len(at)]


def filtered(
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
        return [take_layer(a, at, layout.padded, cut) for a in value]
    if isinstance(value, np.ndarray):
        return take(value, at, layout.padded, cut)
    if isinstance(value, list):
        return [value[i] for i in at_list]
    if isinstance(value, dict) and layout.axis == "sentence":  # keyed by the sentences' keys
        return {k: v for k, v in value.items() if k in keep}
    if isinstance(value, RowCache) and layout.axis == "row":
        return value.select(at)
    raise TypeError(f"{name}: cannot filter a {type(value).__name__} by {layout.axis}")


def stack(arrays: list[np.ndarray], padded: str | None, longest: dict[str, int]) -> np.ndarray:
    """The first axes of all batches' arrays (rows, or sentences) one after the other; a padded
    axis runs to `longest[padded]`, zeros after each array's own length."""
    return np.concatenate(arrays) if padded is None else stack_padded(arrays, longest[padded])


def concatenated(name: str, layout: Layout, values: list[Any], longest: dict[str, int]) -> Any:
    """`DecodeBatch.concatenate` of one field: `values`, one per batch, merged by its layout."""
    if layout.axis == "batch":
        return values[0]
    if layout.layers:
        return [stack([v[i] for v in values], layout.padded, longest) for i in range(len(values[0]))]
    if isinstance(values[0], np.ndarray):
        return stack(values, layout.padded, longest)
    if isinstance(values[0], list):
        return [x for v in values for x in v]
    if isinstance(values[0], dict) and layout.axis == "sentence":
        return {k: x for v in values for k, x in v.items()}
    if isinstance(values[0], RowCache) and layout.axis == "row":
        return type(values[0]).concatenate(values)
    raise TypeError(f"{name}: cannot concatenate a {type(values[0]).__name__} by {layout.axis}")


def as_list(value: Any, n: int, name: str) -> list[Any]:
    """A per-sentence argument as a list of n values: a sequence of n, or one value for all."""
    if isinstance(value, (list, tuple, np.ndarray)):
        if len(value) != n:
            raise ValueError(f"{name}: {len(value)} values for {n} sentences")
        return list(value)
    return [value] * n


class LaidOut:
    """A batch whose fields declare their layout (`DecodeBatch`'s base, as `Search` is: the fields
    below are the batch's own): sentences dropped and batches merged, every field carried by its
    declaration."""

    if not TYPE_CHECKING:  # no instance dict: `DecodeBatch` declares the slots of these fields
        __slots__ = ()

    beam: int
    keys: list[Hashable]
    src_lens: np.ndarray
    src_mask: np.ndarray
    max_len: np.ndarray

    def filter(self, keep_keys: Iterable[Hashable]) -> Self:
        """Keep only the sentences in `keep_keys` (others finished or were cancelled), in place;
        then drop source columns and cache entries no kept row uses. Returns self. The kept
        sentences keep their places, except those behind the new end, which fill the gaps in
        batch order (`fill_order`): the keys, caches and the encoder's keys and values then move
        one sentence per dropped one, not every sentence behind the first gap."""
        keep = set(keep_keys)
        idx = [i for i, k in enumerate(self.keys) if k in keep]
        if len(idx) == len(self.keys):
            return self
        idx = fill_order(idx)
        K = self.beam
        sent = np.array(idx, dtype=np.int64)
        rows = (sent[:, None] * K + np.arange(K)[None, :]).reshape(-1)
        # The source axis shrinks to the kept sentences' longest source, the output axis to their
        # longest output (`out_width`); the cache drops the entries that no kept row uses by itself.
        S = int(self.src_lens[sent].max()) if len(idx) else 0
        cut = {"source": S, "output": out_width(K, self.max_len[sent])}
        picks = {"sentence": (sent, idx), "row": (rows, rows.tolist())}
        for name, layout in layouts(type(self)):
            if layout.axis != "batch":
                at, at_list = picks[layout.axis]
                setattr(self, name, filtered(name, layout, getattr(self, name), at, at_list, keep, cut))
        return self

    @classmethod
    def concatenate(cls, batches: Sequence[Self | None]) -> Self:
        """Merge batches (same beam width) whose rows may be at different steps: sources are padded
        to the longest (src_mask 0), caches to the longest past (masked)."""
        present = [b for b in batches if b is not None]
        if not present:
            raise ValueError("nothing to concatenate")
        first = present[0]
        check_batch_wide(cls, present)
        if len(present) == 1:
            return first
        keys = [k for b in present for k in b.keys]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate keys across batches")
        longest = {
            "source": max(int(b.src_mask.shape[1]) for b in present),
            "output": out_width(first.beam, np.concatenate([b.max_len for b in present])),
        }
        merged = {
            name: concatenated(name, layout, [getattr(b, name) for b in present], longest)
            for name, layout in layouts(cls)
        }
        return cls(**merged)
