"""One error hierarchy for everything a request can run into. Each class carries its gRPC status
code; the error interceptor (service/grpc/interceptors.py) is the only place that turns them into
statuses, so the batcher and the engine never know about gRPC."""

from __future__ import annotations

from collections.abc import Callable

# A status message's length at most: the statuses travel in gRPC's metadata (16 KiB at most), and
# the log lines that quote them stay short whatever a client sends.
MAX_MESSAGE_CHARS = 1024


def quote(value: str, limit: int = 64) -> str:
    """Client input as a status message or a log line quotes it: repr() when short, else its first
    `limit` characters and its length ("'abcd…' (100000 chars)"). Every message that echoes what a
    client sent goes through here."""
    if len(value) <= limit:
        return repr(value)
    shown = repr(value[:limit])  # ends with its closing quote
    return f"{shown[:-1]}…{shown[-1]} ({len(value)} chars)"


class ServiceError(Exception):
    """Base class; `code` is a grpc.StatusCode name. The message is cut to MAX_MESSAGE_CHARS (a
    backstop: the messages quote client input with `quote`)."""

    code = "INTERNAL"

    def __init__(self, message: str):
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 20] + f"… ({len(message)} chars)"
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[Callable[..., ServiceError], tuple[type[ServiceError], str, dict[str, object]]]:
        # Pickled as itself, fields included, whatever its __init__ takes (engine processes send
        # them over a pipe).
        return _restore, (type(self), self.message, dict(self.__dict__))


def _restore(cls: type[ServiceError], message: str, state: dict[str, object]) -> ServiceError:
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    error.__dict__.update(state)
    return error


class InvalidArgument(ServiceError):
    """The request itself is wrong; the message names the field."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field


class NotFound(ServiceError):
    """A model or version that is not served (KServe v2 `model_name`, `model_version`)."""

    code = "NOT_FOUND"


class ResourceExhausted(ServiceError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(ServiceError):
    code = "DEADLINE_EXCEEDED"


class Unavailable(ServiceError):
    code = "UNAVAILABLE"


class Cancelled(ServiceError):
    code = "CANCELLED"


class Unauthenticated(ServiceError):
    code = "UNAUTHENTICATED"


class PermissionDenied(ServiceError):
    """An operation this server's settings turn off (the repository's load and unload)."""

    code = "PERMISSION_DENIED"


class FailedPrecondition(ServiceError):
    """An operation this server cannot do as configured (a repository call on one model dir)."""

    code = "FAILED_PRECONDITION"


class Internal(ServiceError):
    code = "INTERNAL"


class StartupError(Exception):
    """The server cannot start (bad TLS files, no tokens, no model...): `mtserve serve` prints
    one line and exits non-zero."""


class ModelLoadError(StartupError):
    """Startup problems: a missing model dir, a corrupt graph, a checksum mismatch."""
