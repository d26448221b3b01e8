"""`python -m service.healthcheck [ADDRESS] [--service NAME]`: the container's health check.

Asks the server's `grpc.health.v1.Health/Check` and exits 0 when it answers SERVING, 1 otherwise
(NOT_SERVING while starting or draining, unreachable, timeout). ADDRESS defaults to the port of
`MTSERVE_ADDRESS` on 127.0.0.1. Plaintext only: with TLS on the listener, probe with a tool that
has the certificates (Kubernetes' native gRPC probes are plaintext too). Imports grpc only, so a
probe every few seconds stays cheap.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def default_address() -> str:
    port = os.environ.get("MTSERVE_ADDRESS", "0.0.0.0:50051").rsplit(":", 1)[-1]
    return f"127.0.0.1:{port}"


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The serving status name, or the gRPC status code name when the call itself fails."""
    with grpc.insecure_channel(address) as channel:
        try:
            resp = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=service),
                                                             timeout=timeout)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m service.healthcheck", description=__doc__.split("\n\n")[0])
    p.add_argument("address", nargs="?", default=None, help="host:port (default: 127.0.0.1 and MTSERVE_ADDRESS's port)")
    p.add_argument("--service", default="", help="service name to ask about ('' = the server as a whole)")
    p.add_argument("--timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    address = args.address or default_address()
    status = check(address, args.service, args.timeout)
    print(f"{address}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
