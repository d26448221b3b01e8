"""The splitting and tokenising of large requests' texts (`documents.plan_texts`) in worker
processes at the lowest CPU priority (nice 19), so that neither the server's GIL nor its heap
is touched by it: the event loop and the decode workers keep the cores and their memory.

Texts, the request's `documents.Rules` and its deadline go to a worker; each text's spans and
rows come back. A worker loads the tokenizer of an export once (from its manifest) and exits
after TASKS_PER_CHILD requests, giving back what a large request made its allocator keep. The
caller stops waiting at the deadline (DEADLINE_EXCEEDED) and when cancelled; a request already
running in a worker stops at its own check of the deadline, or finishes at nice 19."""

from __future__ import annotations

import asyncio
import functools
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from contract.manifest import load_manifest
from service.engine import documents
from service.engine.work import Checkpoint
from service.errors import DeadlineExceeded
from service.runtime.tokenizer import TextTokenizer, load_tokenizer

# Requests a worker plans before it exits (and a fresh one starts when needed).
TASKS_PER_CHILD = 64
NICE = 19

Outline = tuple[list[tuple[int, int]], list[list[list[int]]]]  # a plan less its text


class PlanProcesses:
    """A pool of `processes` worker processes (started by a fork server when first used)."""

    def __init__(self, processes: int, tasks_per_child: int = TASKS_PER_CHILD):
        self.processes = processes
        self._pool = ProcessPoolExecutor(
            processes,
            mp_context=multiprocessing.get_context("forkserver"),
            initializer=_lower_priority,
            max_tasks_per_child=tasks_per_child,
        )

    async def plans(
        self, export_dir: Path, texts: list[str], field: str, rules: documents.Rules, timeout: float | None
    ) -> list[documents.Plan]:
        """`documents.plan_texts(texts, field, rules, <the export's tokenizer>)` in a worker:
        DEADLINE_EXCEEDED when `timeout` passes first; its errors (INVALID_ARGUMENT) as raised."""
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            outlines = await asyncio.wait_for(self._run(export_dir, texts, field, rules, deadline), timeout)
        except TimeoutError:
            raise DeadlineExceeded("deadline expired while the texts were prepared") from None
        return [documents.Plan(t, spans, rows) for t, (spans, rows) in zip(texts, outlines)]

    async def _run(
        self, export_dir: Path, texts: list[str], field: str, rules: documents.Rules, deadline: float | None
    ) -> list[Outline]:
        # Submitting may start a worker, and the fork server first (seconds): off the event loop.
        loop = asyncio.get_running_loop()
        future = await loop.run_in_executor(
            None, self._pool.submit, _outline, str(export_dir), texts, field, rules, deadline
        )
        return await asyncio.wrap_future(future)  # cancelled: so is a task not started yet

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


@functools.cache
def shared(processes: int) -> PlanProcesses:
    """The one pool of a process (every model version's engine uses it)."""
    return PlanProcesses(processes)


# -- in the worker ------------------------------------------------------------------------


def _lower_priority() -> None:
    os.nice(NICE)


@functools.cache
def _tokenizer(export_dir: str) -> TextTokenizer:
    d = Path(export_dir)
    return load_tokenizer(d, load_manifest(d, verify_checksums=False))


def _outline(
    export_dir: str, texts: list[str], field: str, rules: documents.Rules, deadline: float | None
) -> list[Outline]:
    # CLOCK_MONOTONIC is the system's: the caller's deadline holds here.
    plans = documents.plan_texts(texts, field, rules, _tokenizer(export_dir), Checkpoint(deadline))
    return [(p.spans, p.rows) for p in plans]
