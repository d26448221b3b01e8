"""Process-level allocator tuning for the serving process.

Every decode step allocates and frees key/value cache arrays of a few MB (ONNX Runtime's present
outputs, the rows a batch keeps or admits). glibc serves blocks that big with a fresh `mmap` and
returns them to the kernel on `free`, so every new array pays one page fault per 4 KiB page as
it is first written: at concurrency 64 that was an eighth of a decode worker's time, in
`np.zeros` alone. Raising the mmap and trim thresholds keeps freed blocks in the heap for reuse.
The heap then stays at its high-water mark (bounded by the batch limits), which is what a server
with steady traffic wants anyway."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

log = logging.getLogger("mtserve.memory")

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


_kept: tuple[int, int] | None = None  # the thresholds keep_freed_memory set
_mapping = threading.Lock()
_mapping_depth = 0


def keep_freed_memory(mmap_threshold: int = 256 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Serve blocks below `mmap_threshold` bytes from the heap and keep up to `trim_threshold`
    bytes of freed heap. Returns False (and changes nothing) off glibc.

    Also at most one malloc arena per core (glibc's default is eight): each model version has
    decode worker threads of its own, and a new thread would otherwise get a fresh arena that
    grows to the working set of decoding while the arenas of unloaded versions' threads keep
    theirs; capped, the new threads take over the old arenas and their freed blocks."""
    global _kept
    if _mallopt(mmap_threshold, trim_threshold):
        _kept = (mmap_threshold, trim_threshold)
        if "MALLOC_ARENA_MAX" not in os.environ and "arena_max" not in os.environ.get("GLIBC_TUNABLES", ""):
            _set(_M_ARENA_MAX, os.cpu_count() or 1)  # an operator's own choice stands
        return True
    return False


@contextmanager
def mapped_allocations(mmap_threshold: int = 64 << 10) -> Iterator[None]:
    """While a model loads, blocks from `mmap_threshold` bytes up get mappings of their own, so a
    model's weights and buffers never sit among the heap's blocks: unloading it unmaps them, and
    the heap that `keep_freed_memory` keeps for decoding does not grow by a model-sized hole that
    later traffic would fault back in. Other threads' large blocks are mapped too meanwhile."""
    global _mapping_depth
    if _kept is None:  # the default allocator maps large blocks already
        yield
        return
    with _mapping:
        _mapping_depth += 1
        if _mapping_depth == 1:
            _mallopt(mmap_threshold, _kept[1])
    try:
        yield
    finally:
        with _mapping:
            _mapping_depth -= 1
            if _mapping_depth == 0:
                _mallopt(*_kept)


def _glibc(function: str, argtypes: list, restype: Any) -> Any:
    """glibc's `function`, typed; None off glibc (or where it lacks it)."""
    try:
        f = getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), function)
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = argtypes, restype
    return f


def _set(option: int, value: int) -> bool:
    """glibc's mallopt(option, value); False off glibc or when it refuses."""
    mallopt = _glibc("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    if mallopt is None:
        log.debug("no glibc mallopt here; allocator left as it is")
        return False
    return bool(mallopt(option, value) == 1)


def _mallopt(mmap_threshold: int, trim_threshold: int) -> bool:
    ok = _set(_M_MMAP_THRESHOLD, mmap_threshold) and _set(_M_TRIM_THRESHOLD, trim_threshold)
    log.debug("mallopt(mmap_threshold=%d, trim_threshold=%d): %s", mmap_threshold, trim_threshold, ok)
    return ok


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel (`malloc_trim(0)`): after a model version is
    unloaded, the memory its sessions and caches held leaves the process instead of staying at
    the high-water mark that `keep_freed_memory` keeps for steady traffic."""
    trim = _glibc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    return trim is not None and bool(trim(0))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def heap_in_use_bytes() -> int:
    """The bytes the process's malloc has handed out and not taken back (glibc's mallinfo2: in
    use in every arena, and in blocks mapped on their own); 0 off glibc. Unlike the resident set,
    it grows by what a model's load allocates even where the load reuses memory that an earlier
    unload freed and the allocator kept."""
    info = _glibc("mallinfo2", [], _MallInfo2)
    if info is None:
        return 0
    m = info()
    return int(m.uordblks + m.hblkhd)


def freeze_loaded() -> None:
    """Move every object alive now (modules, sessions, tokenizers: what loading a model made)
    out of the cycle collector's reach (`gc.freeze`). A full collection otherwise walks them all
    while it holds the interpreter lock, and one that a large request's allocations set off
    paused Health for a second; after this it walks only what requests made since."""
    gc.collect()
    gc.freeze()


def collect_all() -> None:
    """A full collection over every object, those `freeze_loaded` set aside included (an
    unloaded version's cycles are among them), then those left set aside again, and the heap's
    free pages handed back to the kernel."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    release_freed_memory()
