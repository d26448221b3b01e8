"""What a caller sends for tracing, bounded (docs/security.md "Tracing"): gRPC metadata as the
propagator's carrier without a `traceparent` or `tracestate` that is not valid W3C Trace Context
(`carrier`), each drop logged at most once a minute in one short line, and OpenTelemetry's own
warnings that quote what a caller sent held to the same rate and cut short (`limit_otel_logs`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Iterable
from typing import Any

_LOG_INTERVAL_S = 60.0
_LOG_LINE_CHARS = 200


class _RateLimit(logging.Filter):
    """At most one record per `_LOG_INTERVAL_S` through the loggers it is attached to, its message
    cut to `_LOG_LINE_CHARS` characters and followed by how many were left out before it."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._next = 0.0  # time.monotonic() from which the next record may pass
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            now = time.monotonic()
            if now < self._next:
                self._dropped += 1
                return False
            self._next, dropped, self._dropped = now + _LOG_INTERVAL_S, self._dropped, 0
        message = record.getMessage()
        if len(message) > _LOG_LINE_CHARS:
            message = f"{message[:_LOG_LINE_CHARS]}... ({len(message)} characters)"
        if dropped:
            message += f" ({dropped} more like it in the last minute not logged)"
        record.msg, record.args, record.exc_info, record.exc_text = message, None, None, None
        return True


# OpenTelemetry's loggers that quote what a caller sent (trace state, baggage).
_OTEL_LOGGERS = (
    "opentelemetry.trace.span",
    "opentelemetry.trace.propagation.tracecontext",
    "opentelemetry.baggage",
    "opentelemetry.baggage.propagation",
)
_otel_log_limit = _RateLimit()
_dropped_log = logging.getLogger("mtserve.tracing.headers")
_dropped_log.addFilter(_RateLimit())

# W3C Trace Context (https://www.w3.org/TR/trace-context/): traceparent (any version but ff, whose
# later versions may add fields), and a tracestate of at most 32 list members key=value.
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-[ -~]*)?")
_TRACESTATE_MEMBER = re.compile(
    r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
    r"=[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
)
_TRACESTATE_MAX_CHARS = 512
_TRACESTATE_MAX_MEMBERS = 32


def _valid_tracestate(value: str) -> bool:
    if len(value) > _TRACESTATE_MAX_CHARS:
        return False
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    keys = [m.split("=", 1)[0] for m in members]
    return (
        len(members) <= _TRACESTATE_MAX_MEMBERS
        and len(set(keys)) == len(keys)
        and all(_TRACESTATE_MEMBER.fullmatch(m) for m in members)
    )


def carrier(metadata: Iterable[tuple[str, Any]] | None, method: str) -> dict[str, str]:
    """gRPC metadata as the propagator's carrier, without trace headers that are not valid W3C
    Trace Context (an invalid traceparent takes its tracestate with it)."""
    carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
    dropped = []
    parent = carrier.get("traceparent")
    if parent is not None and (len(parent) > 512 or not _TRACEPARENT.fullmatch(parent.strip(" \t"))):
        dropped.append(("traceparent", len(parent)))
        carrier.pop("traceparent")
    state = carrier.get("tracestate")
    if state is not None and ("traceparent" not in carrier or not _valid_tracestate(state)):
        if "traceparent" in carrier:
            dropped.append(("tracestate", len(state)))
        carrier.pop("tracestate")
    if dropped:
        what = ", ".join(f"{name} ({n} characters)" for name, n in dropped)
        _dropped_log.warning("dropped invalid trace headers of a %s call: %s", method, what)
    return carrier


def limit_otel_logs() -> None:
    """Hold OpenTelemetry's loggers that quote what a caller sent to one short line a minute."""
    for name in _OTEL_LOGGERS:
        logging.getLogger(name).addFilter(_otel_log_limit)
