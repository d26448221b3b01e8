"""`python -m service.client.healthcheck`, the container's HEALTHCHECK: exit 0 only on SERVING."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from service.client.healthcheck import default_address, main
from service.server import SERVICE_NAME


def test_serving_server_passes_and_others_fail(make_server, capsys):
    srv = make_server()
    assert main([srv.address]) == 0
    assert main([srv.address, "--service", SERVICE_NAME]) == 0
    assert "SERVING" in capsys.readouterr().out
    assert main([srv.address, "--service", "no.such.Service"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().out
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    assert main([closed, "--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().out


def test_module_entry_point_and_default_address(make_server):
    srv = make_server()
    env = {**os.environ, "MTSERVE_ADDRESS": f"0.0.0.0:{srv.server.port}"}
    r = subprocess.run(
        [sys.executable, "-m", "service.client.healthcheck"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"127.0.0.1:{srv.server.port}: SERVING"
    assert default_address().startswith("127.0.0.1:")
