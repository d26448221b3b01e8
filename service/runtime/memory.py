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
import logging

log = logging.getLogger("mtserve.memory")

_M_TRIM_THRESHOLD = -1  # <malloc.h>
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(mmap_threshold: int = 256 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Serve blocks below `mmap_threshold` bytes from the heap and keep up to `trim_threshold`
    bytes of freed heap. Returns False (and changes nothing) off glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        log.debug("no glibc mallopt here; allocator left as it is")
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1 and mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    log.debug("mallopt(mmap_threshold=%d, trim_threshold=%d): %s", mmap_threshold, trim_threshold, ok)
    return ok


def release_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel (`malloc_trim(0)`): after a model version is
    unloaded, the memory its sessions and caches held leaves the process instead of staying at
    the high-water mark that `keep_freed_memory` keeps for steady traffic."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))
