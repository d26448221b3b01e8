"""service.engine.work: texts' CPU work on the pool, not the event loop; the deadline kept while a
thread works, and the work stopped at its next check; cancellation likewise."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from service.engine.work import INLINE_BYTES, Checkpoint, TextWork
from service.errors import Cancelled, DeadlineExceeded


def test_small_work_runs_on_the_loop_and_large_work_on_the_pool():
    work = TextWork(1)

    async def main():
        loop_thread = threading.get_ident()
        small = await work.run(lambda point: threading.get_ident(), INLINE_BYTES)
        large = await work.run(lambda point: threading.get_ident(), INLINE_BYTES + 1)
        return loop_thread, small, large

    loop_thread, small, large = asyncio.run(main())
    assert small == loop_thread and large != loop_thread


def test_the_loop_keeps_serving_while_the_pool_works():
    work = TextWork(1)

    def busy(point: Checkpoint) -> int:
        end = time.monotonic() + 0.5
        n = 0
        while time.monotonic() < end:
            n += 1
        return n

    async def main():
        ticks = []

        async def ticker():
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await work.run(busy, INLINE_BYTES + 1)
        task.cancel()
        return ticks

    ticks = asyncio.run(main())
    assert len(ticks) >= 10 and max(b - a for a, b in zip(ticks, ticks[1:])) < 0.25


def test_a_deadline_answers_in_time_and_stops_the_work_at_its_next_check():
    work = TextWork(1)
    checks: list[float] = []
    stopped = threading.Event()

    def slow(point: Checkpoint) -> None:
        try:
            for _ in range(100):
                time.sleep(0.05)
                checks.append(time.monotonic())
                point.check()
        finally:
            stopped.set()

    async def main():
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await work.run(slow, INLINE_BYTES + 1, timeout=0.3)
        return time.monotonic() - start

    took = asyncio.run(main())
    assert took < 1.0
    assert stopped.wait(2.0) and len(checks) < 20  # not the 100 steps of 5 s
    with pytest.raises(DeadlineExceeded):
        Checkpoint(time.monotonic() - 1).check()


def test_a_cancelled_caller_stops_the_work():
    work = TextWork(1)
    stopped = threading.Event()
    seen: list[BaseException] = []

    def slow(point: Checkpoint) -> None:
        try:
            for _ in range(100):
                time.sleep(0.05)
                point.check()
        except Cancelled as e:
            seen.append(e)
            raise
        finally:
            stopped.set()

    async def main():
        task = asyncio.create_task(work.run(slow, INLINE_BYTES + 1))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert stopped.wait(2.0) and seen
