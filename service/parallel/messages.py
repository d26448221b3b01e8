"""What an engine process and the gRPC process say to each other over their pipe.

Every message is a frozen dataclass, pickled by `multiprocessing.Connection`; each side dispatches
on the message's type. Keys name a sentence or a text to encode: the parent numbers them, and each
answer carries the key of what it answers.

    parent -> child (`ToChild`): SubmitSentences, Encode, Cancel, StopAccepting, MetricsRequest,
                                 Shutdown
    child -> parent (`ToParent`): Ready or StartupError once, then Done, Encoded, Failed, Tokens,
                                  MetricsReply

A sentence crosses as a `SentenceSpec`, without its future or callback: the parent keeps the
`Sentence` and its future, the child makes its own copy and answers with its outcome. Errors cross
as the ServiceError itself (service.errors pickles them with their fields).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import numpy as np
from prometheus_client.metrics_core import Metric

from service.batching.jobs import Sentence
from service.decoding.results import Finished
from service.decoding.sampling import Sampling
from service.decoding.terms import SourceTerm
from service.errors import ServiceError

# ----------------------------------------------------------------------------- parent -> child


@dataclass(frozen=True, slots=True)
class SentenceSpec:
    """A `service.batching.jobs.Sentence` without its future: what the child needs to decode it."""

    key: int
    src_ids: list[int]
    beam: int
    length_penalty: float
    max_len: int
    want_alignment: bool
    want_scores: bool
    deadline: float | None  # time.monotonic() (one clock for every process on the machine)
    stream: bool  # the caller wants a Tokens message at each decoder step
    target_prefix: tuple[int, ...] = ()  # forced first target tokens (a multilingual model's language)
    min_len: int = 0  # tokens the output has at least before </s>
    output_prefix: tuple[int, ...] = ()  # the request's target prefix, kept in the output
    num_hypotheses: int = 1
    sampling: Sampling | None = None  # its generator crosses with its state
    request: int | None = None  # the request whose row it is (Sentence.request): one parent's tags
    terms: tuple[SourceTerm, ...] = ()  # glossary terms forced on its output
    pieces: np.ndarray | None = None  # with terms: the target vocabulary's word-internal pieces
    # The rows it counts as arriving and answered (Sentence.arriving_rows, answered_rows): a
    # request in passes counts once in the child's scheduler too. Its decoder state does not cross.
    arriving_rows: int | None = None
    answered_rows: int | None = None

    @classmethod
    def of(cls, sentence: Sentence) -> SentenceSpec:
        """The parent's side: what crosses the pipe of `sentence` (keyed by its `key`)."""
        return cls(
            key=sentence.key,
            src_ids=list(sentence.src_ids),
            beam=sentence.beam,
            length_penalty=sentence.length_penalty,
            max_len=sentence.max_len,
            want_alignment=sentence.want_alignment,
            want_scores=sentence.want_scores,
            deadline=sentence.deadline,
            stream=sentence.on_tokens is not None,
            target_prefix=tuple(sentence.target_prefix),
            min_len=sentence.min_len,
            output_prefix=tuple(sentence.output_prefix),
            num_hypotheses=sentence.num_hypotheses,
            sampling=sentence.sampling,
            request=sentence.request,
            terms=tuple(sentence.terms),
            pieces=sentence.pieces,
            arriving_rows=sentence.arriving_rows,
            answered_rows=sentence.answered_rows,
        )

    def sentence(self, on_tokens: Callable[[list[int]], None] | None = None) -> Sentence:
        """The child's side: its own copy of the sentence, with its own future; `on_tokens` is
        where its decoder steps go when the caller streams (`stream`)."""
        return Sentence(
            src_ids=self.src_ids,
            beam=self.beam,
            length_penalty=self.length_penalty,
            max_len=self.max_len,
            target_prefix=list(self.target_prefix),
            min_len=self.min_len,
            output_prefix=list(self.output_prefix),
            num_hypotheses=self.num_hypotheses,
            sampling=self.sampling,
            want_alignment=self.want_alignment,
            want_scores=self.want_scores,
            deadline=self.deadline,
            on_tokens=on_tokens,
            key=self.key,
            request=self.request,
            terms=self.terms,
            pieces=self.pieces,
            arriving_rows=self.arriving_rows,
            answered_rows=self.answered_rows,
        )


@dataclass(frozen=True, slots=True)
class EncodeSpec:
    """A `service.batching.jobs.EncodeJob` without its future."""

    key: int
    src_ids: list[int]


@dataclass(frozen=True, slots=True)
class SubmitSentences:
    """Queue these sentences: all of them, or a Failed for each."""

    sentences: list[SentenceSpec]


@dataclass(frozen=True, slots=True)
class Encode:
    """Queue these texts for the encoder alone: all of them, or a Failed for each."""

    jobs: list[EncodeSpec]


@dataclass(frozen=True, slots=True)
class Cancel:
    """Their callers gave up: cancel these keys' futures in the child; no answer comes."""

    keys: list[int]


@dataclass(frozen=True, slots=True)
class StopAccepting:
    """Drain: the child's scheduler refuses new work from now on."""


@dataclass(frozen=True, slots=True)
class MetricsRequest:
    """Send the child's metric families; the reply carries the same token."""

    token: int


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Stop the scheduler and exit."""


ToChild: TypeAlias = SubmitSentences | Encode | Cancel | StopAccepting | MetricsRequest | Shutdown

# ----------------------------------------------------------------------------- child -> parent


@dataclass(frozen=True, slots=True)
class Ready:
    """The models are loaded: the provider they run on and how many distinct sessions there are."""

    provider: str
    sessions: int


@dataclass(frozen=True, slots=True)
class StartupError:
    """The models failed to load; the child exits after sending it."""

    message: str


@dataclass(frozen=True, slots=True)
class Done:
    """A sentence finished."""

    key: int
    result: Finished


@dataclass(frozen=True, slots=True)
class Encoded:
    """A text's encoder states, (S, d_model) float32."""

    key: int
    memory: np.ndarray


@dataclass(frozen=True, slots=True)
class Failed:
    """A sentence or a text failed; anything but a ServiceError crosses as Internal."""

    key: int
    error: ServiceError


@dataclass(frozen=True, slots=True)
class Tokens:
    """The tokens a streamed sentence emitted at the last decoder step."""

    key: int
    ids: list[int]


@dataclass(frozen=True, slots=True)
class MetricsReply:
    """The child's metric families, answering the MetricsRequest with the same token."""

    token: int
    families: list[Metric]


ToParent: TypeAlias = Ready | StartupError | Done | Encoded | Failed | Tokens | MetricsReply
