"""Which model versions stay in memory under a memory budget (MTSERVE_MEMORY_BUDGET_MB), as KServe
ModelMesh keeps them: a version is loaded on its first request, and when a load needs room the
least recently used loaded versions are evicted first. A version with requests in flight (leases)
or with requests waiting for its load is never evicted.

A version's size is measured by its load (loads run one at a time): what the process's resident
set (RSS) grew by, or what its allocator handed out and kept (service.runtime.memory.
heap_in_use_bytes), whichever is more. The RSS alone measures a load small where it reuses
memory that an eviction freed and the allocator kept: such loads let five versions in under a
budget of four and a half, and the RSS rose a version's size over the budget. Before its first
load a version is expected to take what its graph and tokenizer files take on disk (the
loader's estimate); after an eviction, what it took when it was last loaded. The budget counts the versions' sizes, not the process's baseline (the Python
runtime, ONNX Runtime's libraries, the decode buffers)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from service.errors import ModelLoadError, ResourceExhausted
from service.repository.layout import VersionDir

MB = 1 << 20
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """The process's resident set size now, in bytes (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class Resident(Protocol):
    """What the budget needs of a loaded version (service.repository.registry.ServedModel)."""

    @property
    def name(self) -> str: ...
    @property
    def version(self) -> str: ...

    leases: int
    last_used: float
    resident_bytes: int


Key = tuple[str, str]


class Residency:
    """The memory budget's bookkeeping: each version's measured size, the expected size of one
    not measured yet, and which loaded versions to evict for a load. `budget_bytes` 0: no budget
    (nothing is evicted)."""

    def __init__(self, budget_bytes: int, estimate: Callable[[VersionDir], int]):
        self.budget_bytes = budget_bytes
        self._estimate = estimate
        self.measured: dict[Key, int] = {}  # kept after an eviction: the size of its next load

    @property
    def budget_mb(self) -> int:
        return self.budget_bytes // MB

    def expected(self, source: VersionDir) -> int:
        """What loading `source` is expected to take: its last measured size, else its files' size."""
        key = (source.name, source.version)
        if key in self.measured:
            return self.measured[key]
        try:
            return max(0, self._estimate(source))
        except (
            OSError,
            ValueError,
            KeyError,
            ModelLoadError,
        ):  # an unreadable export: the load itself fails with the reason
            return 0

    def record(self, key: Key, before: int, after: int, heap_before: int = 0, heap_after: int = 0) -> int:
        """The size of a load that took the RSS from `before` to `after` and the allocator's bytes
        in use from `heap_before` to `heap_after` (module doc; never below 0)."""
        size = max(0, after - before, heap_after - heap_before)
        self.measured[key] = size
        return size

    def fits(self, source: VersionDir, loaded: Iterable[Resident]) -> bool:
        """Whether `source` fits beside `loaded` without evicting anything."""
        if not self.budget_bytes:
            return True
        return sum(s.resident_bytes for s in loaded) + self.expected(source) <= self.budget_bytes

    def victims(self, source: VersionDir, loaded: Sequence[Resident], pinned: set[Key]) -> list[Resident]:
        """The loaded versions to evict, least recently used first, so that `source` fits under the
        budget; never one with leases or in `pinned` (requests waiting for it). RESOURCE_EXHAUSTED
        naming the budget when even evicting every other one leaves no room."""
        key = (source.name, source.version)
        need = self.expected(source)
        return self._evictable(need, [s for s in loaded if (s.name, s.version) != key], pinned, key)

    def over_budget(self, loaded: Sequence[Resident], pinned: set[Key], keep: Key) -> list[Resident]:
        """After a load measured larger than expected: the least recently used others to evict so
        that the loaded versions fit again (those it can, leased and pinned ones kept)."""
        if not self.budget_bytes:
            return []
        total = sum(s.resident_bytes for s in loaded)
        out: list[Resident] = []
        for s in self._lru([s for s in loaded if (s.name, s.version) != keep], pinned):
            if total <= self.budget_bytes:
                break
            out.append(s)
            total -= s.resident_bytes
        return out

    def _evictable(self, need: int, others: list[Resident], pinned: set[Key], key: Key) -> list[Resident]:
        if not self.budget_bytes:
            return []
        total = sum(s.resident_bytes for s in others)
        out: list[Resident] = []
        for s in self._lru(others, pinned):
            if total + need <= self.budget_bytes:
                break
            out.append(s)
            total -= s.resident_bytes
        if total + need <= self.budget_bytes:
            return out
        held = [f"{s.name}:{s.version}" for s in others if s not in out]
        raise ResourceExhausted(
            f"model: {key[0]}:{key[1]} (expected {need / MB:.1f} MB) does not fit the memory budget "
            f"(memory_budget_mb={self.budget_mb}): "
            + (
                f"{', '.join(held)} ({total / MB:.1f} MB) have requests in flight or waiting and cannot be evicted"
                if held
                else "it is larger than the budget on its own"
            )
        )

    @staticmethod
    def _lru(loaded: Sequence[Resident], pinned: set[Key]) -> list[Resident]:
        free = [s for s in loaded if not s.leases and (s.name, s.version) not in pinned]
        return sorted(free, key=lambda s: s.last_used)


def now() -> float:
    """The clock of `last_used` (monotonic)."""
    return time.monotonic()
