"""Server interceptors: the one place where the error hierarchy becomes gRPC status codes, and
where every RPC is counted and timed."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any

import grpc
from grpc.aio import AbortError

from service import tracing
from service.errors import InvalidArgument, ServiceError
from service.grpc.context import request_id
from service.grpc.oversize import cut_texts
from service.metrics import Metrics

log = logging.getLogger("mtserve.rpc")

Deserializer = Callable[[bytes], object]
TRANSLATE = "/mtserve.v1.TranslationService/Translate"
Handler = Callable[[Any, grpc.aio.ServicerContext], Any]
"""A method handler's behaviour: (request or request iterator, context) -> a response's
awaitable, or an async iterator of responses."""


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class MalformedRequest:
    """What the request deserializer returns for bytes that are not a valid message (corrupt wire
    format, invalid UTF-8 in a string field): the handler then answers INVALID_ARGUMENT instead
    of grpc's own UNKNOWN "Exception deserializing request"."""

    def __init__(self, reason: str):
        self.reason = reason


def _tolerant(deserializer: Deserializer | None, cut: Callable[[bytes], bytes] | None = None) -> Deserializer | None:
    """`deserializer`, answering MalformedRequest instead of raising; `cut` first, when given (a
    Translate request's texts past max_request_bytes are not parsed: service.grpc.oversize)."""
    if deserializer is None:
        return None

    def parse(raw: bytes) -> object:
        try:
            return deserializer(raw if cut is None else cut(raw))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, or anything else a parser raises
            return MalformedRequest(str(e) or type(e).__name__)

    return parse


def _check_parsed(request: object) -> None:
    if isinstance(request, MalformedRequest):
        raise InvalidArgument("request", f"not a valid protobuf message: {request.reason}")


def error_status(exc: BaseException, method: str, rid: Callable[[], str]) -> tuple[grpc.StatusCode, str]:
    """The status and message a client gets for `exc`: a ServiceError's own code and message;
    anything else INTERNAL with a request id (`rid()`), logged with its traceback. TranslateMany
    answers each failed item with this too."""
    if isinstance(exc, ServiceError) and exc.code != "INTERNAL":
        return getattr(grpc.StatusCode, exc.code), exc.message
    request = rid()
    if isinstance(exc, ServiceError):  # an Internal raised on purpose (the scheduler logged the traceback)
        log.error("request %s: %s in %s", request, exc.message, method)
        return grpc.StatusCode.INTERNAL, f"{exc.message} (request id {request})"
    log.error("request %s: unexpected error in %s", request, method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error (request id {request})"


async def _checked(requests: AsyncIterator[object]) -> AsyncIterator[object]:
    """A client stream's messages, ending the call with INVALID_ARGUMENT at a malformed one."""
    async for request in requests:
        _check_parsed(request)
        yield request


def _parsed(request: Any, streaming: bool) -> Any:
    """The request checked now (INVALID_ARGUMENT if malformed), or a client stream checked message
    by message as it is read."""
    if streaming:
        return _checked(request)
    _check_parsed(request)
    return request


class RpcActivity:
    """How many RPCs are in their handlers now, and when the last one arrived: the drain closes the
    listener only once both say the server is quiet, because gRPC cancels (rather than refuses) the
    calls that arrive while it shuts down."""

    def __init__(self) -> None:
        self.active = 0
        self.last_arrival = 0.0  # time.monotonic()

    def arrived(self) -> None:
        self.active += 1
        self.last_arrival = time.monotonic()

    def finished(self) -> None:
        self.active -= 1

    async def wait_quiet(self, quiet_s: float, deadline: float) -> bool:
        """Wait until no handler runs and none has arrived for `quiet_s` (or `deadline`, monotonic)."""
        while True:
            now = time.monotonic()
            if self.active == 0 and now - self.last_arrival >= quiet_s:
                return True
            if now >= deadline:
                return False
            await asyncio.sleep(min(0.02, quiet_s or 0.02))


class _ObservedCall:
    """One RPC as the interceptor sees it, around the handler: times it, holds it in the in-flight
    gauge, records its status (and whether the client or the deadline cut it short), and maps
    whatever the handler raised to a status. Both wrappers use it, so unary and streaming calls
    are counted and mapped the same way. With tracing on, it also holds the RPC's server span,
    made current by `current()` around each step of the handler."""

    def __init__(self, metrics: Metrics, activity: RpcActivity, full_method: str, context: grpc.aio.ServicerContext):
        self.metrics, self.activity, self.method, self.context = metrics, activity, _short(full_method), context
        self.full_method = full_method
        self.gauge = metrics.in_flight.labels(self.method)
        self.start = 0.0
        self.span: tracing.RpcSpan | None = None
        self.error: tuple[BaseException, str] | None = None  # what was raised, and the client's message

    async def __aenter__(self) -> None:
        self.start = time.perf_counter()
        self.gauge.inc()
        self.activity.arrived()
        if tracing.traced_method(self.full_method):
            self.span = tracing.RpcSpan(self.full_method, self.context.invocation_metadata())

    def current(self) -> contextlib.AbstractContextManager[None]:
        """The RPC's span current in the block (nothing without one). A streaming handler gets it
        around each message it makes, never across a yield: grpc may finish a cancelled stream's
        generator in a task of its own, where a context attached in the call's task cannot be
        detached."""
        return self.span.current() if self.span is not None else contextlib.nullcontext()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        # GeneratorExit: a streaming client went away mid-stream and grpc closed the generator.
        cancelled = isinstance(exc, (asyncio.CancelledError, GeneratorExit))
        finished = False
        try:
            if isinstance(exc, Exception) and not isinstance(exc, AbortError):
                # Nothing escapes unmapped; context.abort() raises AbortError, which replaces `exc`.
                code, message = error_status(exc, self.method, lambda: request_id(self.context))
                self.error = exc, message
                # Counted before the client can see the status: a client that reads the metrics
                # right after its error finds it there.
                self._finish(code.name)
                finished = True
                await self.context.abort(code, message)
                return True
            return False  # success, an abort already made, or a cancellation: as they are
        finally:
            if not finished:
                self._finish(self._code_name(cancelled))

    def _finish(self, name: str) -> None:
        """The call's end under status `name`: the in-flight gauge, its count and latency, its span."""
        self.gauge.dec()
        self.activity.finished()
        self.metrics.requests.labels(self.method, name).inc()
        self.metrics.request_latency.labels(self.method, name).observe(time.perf_counter() - self.start)
        if self.span is not None:
            error, message = self.error or (None, "")
            self.span.end(name, getattr(grpc.StatusCode, name, grpc.StatusCode.UNKNOWN).value[0], error, message)

    def _code_name(self, cancelled: bool) -> str:
        """The status the client saw. A handler cancelled by gRPC (client cancel, or the deadline
        passing while it ran) never sets a code itself: tell the two apart by the deadline."""
        if cancelled:
            remaining = self.context.time_remaining()
            return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
        code = self.context.code()
        if code is None:
            return "OK"
        if isinstance(code, grpc.StatusCode):
            return code.name
        for sc in grpc.StatusCode:  # some grpc versions hand back the integer code
            if sc.value[0] == code:
                return sc.name
        return "UNKNOWN"


class ErrorAndMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Maps ServiceError subclasses to their status code with their message; anything unexpected
    becomes INTERNAL with a request id that is logged with the traceback. Counts and times RPCs."""

    def __init__(self, metrics: Metrics, max_request_bytes: int | None = None):
        self.metrics = metrics
        self.activity = RpcActivity()
        # Translate's texts past the bound are not parsed (service.grpc.oversize); None: every request is parsed whole.
        self.cut = (
            None if max_request_bytes is None else functools.partial(cut_texts, max_request_bytes=max_request_bytes)
        )

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer, self.cut if method == TRANSLATE else None),
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        # Client-streaming methods (TranslateMany, reflection; the auth interceptor's refusals of
        # them): the first argument is the request iterator, checked message by message.
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                self._wrap_unary(method, handler.stream_unary, streaming_request=True),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        if handler.stream_stream:
            return grpc.stream_stream_rpc_method_handler(
                self._wrap_stream(method, handler.stream_stream, streaming_request=True),
                request_deserializer=_tolerant(handler.request_deserializer),
                response_serializer=handler.response_serializer,
            )
        return handler

    def _wrap_unary(self, method: str, inner: Handler, streaming_request: bool = False) -> Handler:
        async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
            call = _ObservedCall(self.metrics, self.activity, method, context)
            async with call:
                with call.current():
                    return await inner(_parsed(request, streaming_request), context)

        return behaviour

    def _wrap_stream(self, method: str, inner: Handler, streaming_request: bool = False) -> Handler:
        # A streaming handler is either an async generator (ours) or a coroutine writing with
        # context.write() (grpc's health Watch); the wrapper must be of the same kind.
        if inspect.isasyncgenfunction(inner):

            async def behaviour(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                call = _ObservedCall(self.metrics, self.activity, method, context)
                async with call:
                    messages = inner(_parsed(request, streaming_request), context)
                    try:
                        while True:
                            with call.current():
                                try:
                                    message = await anext(messages)
                                except StopAsyncIteration:
                                    break
                            yield message
                    finally:
                        with call.current():
                            await messages.aclose()

            return behaviour
        return self._wrap_unary(method, inner, streaming_request)
