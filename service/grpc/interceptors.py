"""Server interceptors: the one place where the error hierarchy becomes gRPC status codes, and
where every RPC is counted and timed."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time

import grpc
from grpc.aio import AbortError

from service.errors import InvalidArgument, ServiceError
from service.grpc.context import request_id
from service.metrics import Metrics

log = logging.getLogger("mtserve.rpc")


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


class MalformedRequest:
    """What the request deserializer returns for bytes that are not a valid message (corrupt wire
    format, invalid UTF-8 in a string field): the handler then answers INVALID_ARGUMENT instead
    of grpc's own UNKNOWN "Exception deserializing request"."""

    def __init__(self, reason: str):
        self.reason = reason


def _tolerant(deserializer):
    if deserializer is None:
        return None

    def parse(raw: bytes):
        try:
            return deserializer(raw)
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError, or anything else a parser raises
            return MalformedRequest(str(e) or type(e).__name__)

    return parse


def _check_parsed(request) -> None:
    if isinstance(request, MalformedRequest):
        raise InvalidArgument("request", f"not a valid protobuf message: {request.reason}")


def error_status(exc: BaseException, method: str, rid) -> tuple[grpc.StatusCode, str]:
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


async def _checked(requests):
    """A client stream's messages, ending the call with INVALID_ARGUMENT at a malformed one."""
    async for request in requests:
        _check_parsed(request)
        yield request


def _parsed(request, streaming: bool):
    """The request checked now (INVALID_ARGUMENT if malformed), or a client stream checked message
    by message as it is read."""
    if streaming:
        return _checked(request)
    _check_parsed(request)
    return request


class ErrorAndMetricsInterceptor(grpc.aio.ServerInterceptor):
    """Maps ServiceError subclasses to their status code with their message; anything unexpected
    becomes INTERNAL with a request id that is logged with the traceback. Counts and times RPCs."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = _short(details.method)
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(method, handler.unary_unary),
                request_deserializer=_tolerant(handler.request_deserializer),
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

    async def _fail(self, context, method: str, exc: BaseException) -> None:
        code, message = error_status(exc, method, lambda: request_id(context))
        await context.abort(code, message)

    @staticmethod
    def _code_name(context, cancelled: bool) -> str:
        """The status the client saw. A handler cancelled by gRPC (client cancel, or the deadline
        passing while it ran) never sets a code itself: tell the two apart by the deadline."""
        if cancelled:
            remaining = context.time_remaining()
            return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"
        code = context.code()
        if code is None:
            return "OK"
        if isinstance(code, grpc.StatusCode):
            return code.name
        for sc in grpc.StatusCode:  # some grpc versions hand back the integer code
            if sc.value[0] == code:
                return sc.name
        return "UNKNOWN"

    def _record(self, method: str, context, start: float, cancelled: bool = False) -> None:
        name = self._code_name(context, cancelled)
        self.metrics.requests.labels(method, name).inc()
        self.metrics.request_latency.labels(method, name).observe(time.perf_counter() - start)

    def _wrap_unary(self, method, inner, streaming_request: bool = False):
        async def behaviour(request, context):
            start = time.perf_counter()
            gauge = self.metrics.in_flight.labels(method)
            gauge.inc()
            cancelled = False
            try:
                return await inner(_parsed(request, streaming_request), context)
            except AbortError:
                raise
            except asyncio.CancelledError:
                cancelled = True
                raise
            except Exception as exc:  # noqa: BLE001 - the whole point: nothing escapes unmapped
                await self._fail(context, method, exc)
            finally:
                gauge.dec()
                self._record(method, context, start, cancelled)

        return behaviour

    def _wrap_stream(self, method, inner, streaming_request: bool = False):
        # A streaming handler is either an async generator (ours) or a coroutine writing with
        # context.write() (grpc's health Watch); the wrapper must be of the same kind.
        if inspect.isasyncgenfunction(inner):

            async def behaviour(request, context):
                start = time.perf_counter()
                gauge = self.metrics.in_flight.labels(method)
                gauge.inc()
                cancelled = False
                try:
                    async for message in inner(_parsed(request, streaming_request), context):
                        yield message
                except AbortError:
                    raise
                except (asyncio.CancelledError, GeneratorExit):  # client gone mid-stream
                    cancelled = True
                    raise
                except Exception as exc:  # noqa: BLE001
                    await self._fail(context, method, exc)
                finally:
                    gauge.dec()
                    self._record(method, context, start, cancelled)

            return behaviour
        return self._wrap_unary(method, inner, streaming_request)
