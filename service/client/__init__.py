"""The Python client of mtserve.v1, its command line, the alignment picture and the container's
health probe. It talks to a server over gRPC only and imports nothing of the server side."""

from service.client.client import (
    DEFAULT_SERVER,
    STATUS_BY_NUMBER,
    Client,
    ItemFailed,
    alignment_matrix,
    channel_target,
    options,
    pb,
    tls_credentials,
    to_json,
)

__all__ = [
    "DEFAULT_SERVER",
    "STATUS_BY_NUMBER",
    "Client",
    "ItemFailed",
    "alignment_matrix",
    "channel_target",
    "options",
    "pb",
    "tls_credentials",
    "to_json",
]
