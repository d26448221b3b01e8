"""The CPU work of a request's texts (splitting, normalising, tokenising, and putting the
translations back together) off the event loop: on a bounded pool of threads (`text_threads`), so
that Health, GetModelInfo and small requests are served while a large request is being split.
A request small enough (INLINE_BYTES of text at most) runs on the loop: well under a
millisecond, less than handing it to a thread. The threads run at nice 19, so that the event loop
and the decode workers win the cores; with `text_processes`, a Translate request's splitting and
tokenising runs in worker processes instead (service.engine.plan_processes).

The work checks its request's `Checkpoint` before it starts and between texts and segments: a
request whose deadline passed or whose client went away stops there (DEADLINE_EXCEEDED,
CANCELLED), and the caller is answered at its deadline even while a thread finishes a step.
After a request of more than RELEASE_BYTES of text, the C allocator is asked to give freed memory
back to the system (glibc's malloc_trim), which it otherwise keeps in its arenas."""

from __future__ import annotations

import asyncio
import functools
import gc
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from service.errors import Cancelled, DeadlineExceeded
from service.runtime.memory import release_freed_memory

T = TypeVar("T")

# Requests of at most this many UTF-8 bytes of text are prepared on the event loop.
INLINE_BYTES = 4096
# After a request of more text than this, freed memory goes back to the system.
RELEASE_BYTES = 256 * 1024
RELEASE_DELAY_S = 0.5
RELEASE_EVERY_S = 5.0
# The text threads' nice value: the lowest priority.
NICE = 19


class Checkpoint:
    """A request's deadline (time.monotonic(), None: none) and whether it was cancelled, for the
    thread that prepares its texts to check between steps."""

    def __init__(self, deadline: float | None = None):
        self.deadline = deadline
        self.cancelled = False

    def check(self) -> None:
        if self.cancelled:
            raise Cancelled("request cancelled")
        if self.deadline is not None and time.monotonic() >= self.deadline:
            raise DeadlineExceeded("deadline expired while the texts were prepared")

    def remaining(self) -> float | None:
        """Seconds left to the deadline (None: no deadline)."""
        return None if self.deadline is None else self.deadline - time.monotonic()


NO_CHECK = Checkpoint()


def checked(items: Iterable[T], point: Checkpoint, every: int = 1024) -> Iterator[T]:
    """`items`, `point` checked before the first and every `every` more."""
    for i, item in enumerate(items):
        if i % every == 0:
            point.check()
        yield item


class TextWork:
    """A pool of `threads` threads for the CPU work of texts."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="mtserve-text", initializer=_lower_priority)
        self._release: asyncio.Task[None] | None = None
        self._asked = 0.0  # when a large request last asked for its memory to be given back

    async def run(
        self, fn: Callable[[Checkpoint], T], size: int, timeout: float | None = None, inline_bytes: int = INLINE_BYTES
    ) -> T:
        """`fn(checkpoint)` for a request of `size` bytes of text and `timeout` seconds left:
        on the loop when small (`inline_bytes` at most), else on the pool. DEADLINE_EXCEEDED when
        the timeout passes first; a cancelled caller stops the work at its next check."""
        point = Checkpoint(None if timeout is None else time.monotonic() + timeout)
        point.check()
        if size <= inline_bytes:
            return fn(point)
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self._pool, fn, point)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            point.cancelled = True
            raise DeadlineExceeded("deadline expired while the texts were prepared") from None
        except asyncio.CancelledError:
            point.cancelled = True
            raise

    def release_soon(self) -> None:
        """Give freed memory back to the system once no large request has come for
        RELEASE_DELAY_S (its messages are freed by then), or every RELEASE_EVERY_S during a run of
        them; one task does it however many ask."""
        self._asked = time.monotonic()
        if self._release is None or self._release.done():
            self._release = asyncio.get_running_loop().create_task(self._release_later())

    async def _release_later(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = time.monotonic()
            while (wait := min(self._asked + RELEASE_DELAY_S, started + RELEASE_EVERY_S) - time.monotonic()) > 0:
                await asyncio.sleep(wait)
            asked = self._asked
            await loop.run_in_executor(self._pool, release_memory)
            if self._asked == asked:  # no large request since: done
                return


def _lower_priority() -> None:
    """The calling thread at the lowest CPU priority (Linux: a thread's own nice value), so that
    the event loop and the decode workers win the cores."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
    except (AttributeError, OSError):  # not Linux: the thread keeps the process's priority
        pass


@functools.cache
def shared(threads: int) -> TextWork:
    """The one pool of a process (every model version's engine uses it)."""
    return TextWork(threads)


def release_memory() -> None:
    """Give the C allocator's free memory back to the system, where it can (glibc)."""
    gc.collect()  # the cycles an error's traceback makes with the frames that hold a request's texts
    release_freed_memory()
