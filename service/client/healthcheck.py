"""`python -m service.client.healthcheck [ADDRESS] [--service NAME]`: the container's health check.

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
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def default_address() -> str:
    port = os.environ.get("MTSERVE_ADDRESS", "0.0.0.0:50051").rsplit(":", 1)[-1]
    return f"127.0.0.1:{port}"


def _status(stub: health_pb2_grpc.HealthStub, service: str, timeout: float) -> str:
    try:
        resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
    except grpc.RpcError as e:
        return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The serving status name, or the gRPC status code name when the call itself fails."""
    with grpc.insecure_channel(address) as channel:
        return _status(health_pb2_grpc.HealthStub(channel), service, timeout)


def wait_serving(
    address: str, timeout: float = 90.0, alive: Callable[[], bool] | None = None, interval: float = 0.05
) -> list[str]:
    """Ask until the server answers SERVING; return what it answered on the way (status names,
    or gRPC code names while it cannot answer yet). TimeoutError after `timeout` seconds;
    RuntimeError as soon as `alive()` (e.g. "the server process still runs") turns false."""
    seen: list[str] = []
    end = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            if alive is not None and not alive():
                raise RuntimeError(f"{address} went away before SERVING: {seen[-5:]}")
            seen.append(_status(stub, "", 1.0))
            if seen[-1] == "SERVING":
                return seen
            time.sleep(interval)
    raise TimeoutError(f"{address} not SERVING after {timeout}s: {seen[-5:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m service.client.healthcheck", description=__doc__.split("\n\n")[0])
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
