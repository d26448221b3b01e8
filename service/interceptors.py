"""Server interceptors: the one place where the error hierarchy becomes gRPC status codes, and
where every RPC is counted and timed."""

from __future__ import annotations

import inspect
import logging
import time
import uuid

import grpc
from grpc.aio import AbortError

from service.errors import ServiceError
from service.metrics import Metrics

log = logging.getLogger("mtserve.rpc")


def _short(method: str) -> str:
    return method.rsplit("/", 1)[-1]


def request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and value:
            return str(value)[:64]
    return uuid.uuid4().hex[:16]


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
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(method, handler.unary_stream),
                request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
        return handler  # client-streaming methods (none of ours) pass through untouched

    async def _fail(self, context, method: str, exc: BaseException) -> None:
        if isinstance(exc, ServiceError):
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
        rid = request_id(context)
        log.exception("request %s: unexpected error in %s", rid, method, exc_info=exc)
        await context.abort(grpc.StatusCode.INTERNAL, f"internal error (request id {rid})")

    def _record(self, method: str, context, start: float) -> None:
        code = context.code() if hasattr(context, "code") else None
        name = code.name if isinstance(code, grpc.StatusCode) else "OK"
        self.metrics.requests.labels(method, name).inc()
        self.metrics.request_latency.labels(method, name).observe(time.perf_counter() - start)

    def _wrap_unary(self, method, inner):
        async def behaviour(request, context):
            start = time.perf_counter()
            gauge = self.metrics.in_flight.labels(method)
            gauge.inc()
            try:
                return await inner(request, context)
            except AbortError:
                raise
            except Exception as exc:  # noqa: BLE001 - the whole point: nothing escapes unmapped
                await self._fail(context, method, exc)
            finally:
                gauge.dec()
                self._record(method, context, start)

        return behaviour

    def _wrap_stream(self, method, inner):
        # A streaming handler is either an async generator (ours) or a coroutine writing with
        # context.write() (grpc's health Watch); the wrapper must be of the same kind.
        if inspect.isasyncgenfunction(inner):
            async def behaviour(request, context):
                start = time.perf_counter()
                gauge = self.metrics.in_flight.labels(method)
                gauge.inc()
                try:
                    async for message in inner(request, context):
                        yield message
                except AbortError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    await self._fail(context, method, exc)
                finally:
                    gauge.dec()
                    self._record(method, context, start)

            return behaviour
        return self._wrap_unary(method, inner)
