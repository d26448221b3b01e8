"""One error hierarchy for everything a request can run into. Each class carries its gRPC status
code; the error interceptor (service/grpc/interceptors.py) is the only place that turns them into
statuses, so the batcher and the engine never know about gRPC."""

from __future__ import annotations

from collections.abc import Callable


class ServiceError(Exception):
    """Base class; `code` is a grpc.StatusCode name."""

    code = "INTERNAL"

    def __init__(self, message: str):
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
