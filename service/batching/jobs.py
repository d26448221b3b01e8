"""What the scheduler queues: a sentence to translate and a text to encode, each with the future
its caller waits on. Knows nothing of gRPC."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.decoding.resume import Resume
from service.decoding.sampling import Sampling
from service.decoding.terms import SourceTerm

_keys = itertools.count()
_requests = itertools.count()


def new_request() -> int:
    """A tag for the sentences of one request (Sentence.request)."""
    return next(_requests)


@dataclass(eq=False)
class Sentence:
    """One source sentence to translate."""

    src_ids: list[int]
    beam: int
    length_penalty: float
    max_len: int  # tokens it may emit, </s> and target_prefix included
    # A multilingual model's target language token, forced as the first generated token and left
    # out of the result; min_len: tokens the output has at least before </s> (the prefix not counted).
    target_prefix: list[int] = field(default_factory=list)
    min_len: int = 0
    # The request's target prefix: forced after target_prefix and kept in the output (min_len counts it).
    output_prefix: list[int] = field(default_factory=list)
    num_hypotheses: int = 1  # beam search's n-best list when > 1
    sampling: Sampling | None = None  # greedy search draws its tokens (service.decoding.sampling)
    # Glossary terms forced on its output (service.decoding.terms); none: it decodes as without.
    terms: tuple[SourceTerm, ...] = ()
    # With terms: the word-internal pieces of the target vocabulary ((V,) bool), which may not
    # follow a term (service.decoding.terms); None: any may.
    pieces: np.ndarray | None = None
    want_alignment: bool = False
    # Greedy: its `Finished.state` carries its decoder state (service.decoding.resume); stays in
    # the process that decoded it (an engine process answers without it).
    keep_state: bool = False
    # It goes on from another sentence's decoder state instead of from the start: no encoder, the
    # state's first tokens forced (service.decoding.resume). Dropped once it joins a batch.
    resume: Resume | None = None
    want_scores: bool = True  # False: greedy search may skip the log-probabilities (score None)
    deadline: float | None = None  # time.monotonic() after which it is dropped if still queued
    on_tokens: Callable[[list[int]], None] | None = None  # streaming: called from a worker thread
    # Called with its `Finished` by the worker thread that decoded it: True when it took the
    # sentence on (a request decoded in passes queued its next pass from there, without a round
    # trip through the event loop: service.engine.placement), and will settle its future itself;
    # False, or an exception (logged), and the future is settled with the result as ever. Stays in
    # the process that decodes it.
    then: Callable[[Any], bool] | None = None
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    key: int = field(default_factory=lambda: next(_keys))
    enqueued: float = field(default_factory=time.monotonic)
    admitted: float | None = None  # time.monotonic() when it joined a decode batch
    trace: Any = None  # a service.tracing.SentenceTrace when its RPC is traced
    # The request whose row it is (new_request()): an idle worker may batch the many rows of one
    # request (a long text's sentences) alone, past max_batch_sentences (Scheduler._admit).
    request: int | None = None

    # The rows it counts as in the scheduler's closed-loop accounting (`Scheduler._share`): those
    # of a client's request that arrive with it, and those answered to the client when it ends;
    # None: its beam. A request decoded in passes (service.engine.placement) arrives with its
    # first pass and is answered with its last: the passes between are the engine's own.
    arriving_rows: int | None = None
    answered_rows: int | None = None

    @property
    def arriving(self) -> int:
        return self.beam if self.arriving_rows is None else self.arriving_rows

    @property
    def answered(self) -> int:
        return self.beam if self.answered_rows is None else self.answered_rows

    @property
    def mode(self) -> tuple[int, float]:
        return self.beam, self.length_penalty

    def again(self, **changes: Any) -> Sentence:
        """A new sentence of this one's fields but `changes`, with its own future, key and queue
        time (not yet admitted nor traced)."""
        return dataclasses.replace(
            self,
            future=concurrent.futures.Future(),
            key=next(_keys),
            enqueued=time.monotonic(),
            admitted=None,
            trace=None,
            **changes,
        )


@dataclass(eq=False)
class EncodeJob:
    src_ids: list[int]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


def settle(future: concurrent.futures.Future, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a future unless its caller gave up on it already."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile
        pass
