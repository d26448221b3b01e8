"""Transport security and authentication, all from settings (docs/security.md).

- TLS: `tls_cert_file` + `tls_key_file` (PEM) make the listener TLS-only; `tls_client_ca_file`
  additionally requires every client to present a certificate signed by that CA (mutual TLS).
- Bearer tokens: `auth_tokens_file` (one token per line, `#` comments) and/or `auth_token`.
  When any token is configured, every RPC except the health checks needs the metadata
  `authorization: Bearer TOKEN`; `AuthInterceptor` refuses the others with UNAUTHENTICATED
  (raised as `errors.Unauthenticated`, so the error interceptor is still the one place that
  turns errors into statuses). Health stays open so that load balancers and kubelets can probe.

Tokens are compared in constant time and never logged; neither is the request text.
"""

from __future__ import annotations

import hmac
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import NoReturn

import grpc

from service.errors import StartupError, Unauthenticated
from service.settings import Settings

log = logging.getLogger("mtserve.security")

# Methods that never need a token: probes must work without secrets (gRPC health, and the
# liveness/readiness calls of the Open Inference Protocol). They reveal nothing but up/down.
OPEN_METHODS = frozenset(
    {
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/inference.GRPCInferenceService/ServerLive",
        "/inference.GRPCInferenceService/ServerReady",
        "/inference.GRPCInferenceService/ModelReady",
    }
)
AUTH_METADATA_KEY = "authorization"


def _read(path: Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise StartupError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    if not data.strip():
        raise StartupError(f"{what}: {path} is empty")
    return data


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """TLS credentials from the settings, or None for a plaintext listener."""
    if settings.tls_cert_file is None:
        return None
    cert = _read(settings.tls_cert_file, "tls_cert_file")
    if settings.tls_key_file is None:  # Settings' validator pairs the two; a copy made without validation may not
        raise StartupError("tls_key_file: required with tls_cert_file")
    key = _read(settings.tls_key_file, "tls_key_file")
    if b"-----BEGIN" not in cert or b"CERTIFICATE" not in cert:
        raise StartupError(f"tls_cert_file: {settings.tls_cert_file} is not a PEM certificate")
    if b"-----BEGIN" not in key or b"PRIVATE KEY" not in key:
        raise StartupError(f"tls_key_file: {settings.tls_key_file} is not a PEM private key")
    client_ca = None
    if settings.tls_client_ca_file is not None:
        client_ca = _read(settings.tls_client_ca_file, "tls_client_ca_file")
        if b"CERTIFICATE" not in client_ca:
            raise StartupError(f"tls_client_ca_file: {settings.tls_client_ca_file} is not a PEM certificate bundle")
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=client_ca, require_client_auth=client_ca is not None
    )


def load_tokens(settings: Settings) -> list[str]:
    """Accepted bearer tokens: `auth_token` plus the lines of `auth_tokens_file` (blank lines
    and `#` comments skipped). An empty list means authentication is off."""
    tokens = []
    if settings.auth_token is not None:
        tokens.append(settings.auth_token.get_secret_value().strip())
    if settings.auth_tokens_file is not None:
        text = _read(settings.auth_tokens_file, "auth_tokens_file").decode("utf-8", "replace")
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not tokens:
            raise StartupError(f"auth_tokens_file: {settings.auth_tokens_file} holds no token")
    for t in tokens:
        if len(t) < 16 or any(c.isspace() for c in t):
            raise StartupError("auth tokens must be at least 16 characters without whitespace")
    return tokens


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Bearer-token authentication. Place it after the error interceptor, which maps the
    `Unauthenticated` raised here to UNAUTHENTICATED (and counts it)."""

    def __init__(self, tokens: list[str]):
        if not tokens:
            raise ValueError("AuthInterceptor needs at least one token")
        self._tokens = [t.encode("utf-8") for t in tokens]

    def problem(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> str | None:
        """None when the metadata carries an accepted token, else what is wrong (no secrets)."""
        values = [v for k, v in (metadata or ()) if k == AUTH_METADATA_KEY]
        if not values:
            return f"{AUTH_METADATA_KEY}: missing; send `{AUTH_METADATA_KEY}: Bearer TOKEN` metadata"
        value = values[0] if isinstance(values[0], str) else values[0].decode("utf-8", "replace")
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return f"{AUTH_METADATA_KEY}: expected `Bearer TOKEN`"
        given = token.strip().encode("utf-8")
        ok = False
        for accepted in self._tokens:  # no early exit: the time taken does not depend on which matched
            ok |= hmac.compare_digest(given, accepted)
        return None if ok else f"{AUTH_METADATA_KEY}: token not accepted"

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler | None]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        if details.method in OPEN_METHODS:
            return await continuation(details)
        problem = self.problem(details.invocation_metadata)
        handler = await continuation(details)
        if problem is None or handler is None:
            return handler
        return _denying(handler, problem)


def _denying(handler: grpc.RpcMethodHandler, problem: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that raises Unauthenticated without running it."""

    async def unary(request: object, context: grpc.aio.ServicerContext) -> NoReturn:
        raise Unauthenticated(problem)

    async def streaming(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[None]:
        raise Unauthenticated(problem)
        yield  # an async generator, like the handlers it replaces

    kw = dict(request_deserializer=handler.request_deserializer, response_serializer=handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(unary, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            streaming if inspect.isasyncgenfunction(handler.unary_stream) else unary, **kw
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    return grpc.stream_stream_rpc_method_handler(
        streaming if inspect.isasyncgenfunction(handler.stream_stream) else unary, **kw
    )
