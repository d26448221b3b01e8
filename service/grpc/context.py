"""What a handler reads from its gRPC call context: the request id and the deadline."""

from __future__ import annotations

import uuid

import grpc


def request_id(context: grpc.aio.ServicerContext) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == "x-request-id" and value:
            return str(value)[:64]
    return uuid.uuid4().hex[:16]


def deadline(context: grpc.aio.ServicerContext) -> float | None:
    """Seconds left before the caller's deadline; None when the call has none (gRPC reports a
    huge number then)."""
    remaining = context.time_remaining()
    return remaining if remaining is not None and remaining < 1e8 else None
