"""Scale-out: two `mtserve serve` processes behind one client. With a list of addresses (as with
a headless Service's DNS name) the client balances per request (round_robin), so requests reach
both replicas: each server's own metrics count its share."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from service.client import Client
from tests.support import free_port, wait_serving


def translate_count(metrics_port: int) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(body)
        for s in f.samples
        if s.name == "mtserve_requests_total" and s.labels == {"method": "Translate", "code": "OK"}
    )


def test_round_robin_client_reaches_both_replicas(tiny_onnx_dir):
    replicas = []
    try:
        for _ in range(2):
            port, metrics = free_port(), free_port()
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mtserve",
                    "serve",
                    "--model-dir",
                    str(tiny_onnx_dir.parent),
                    "--onnx-dir",
                    str(tiny_onnx_dir),
                    "--address",
                    f"127.0.0.1:{port}",
                    "--metrics-port",
                    str(metrics),
                    "--metrics-address",
                    "127.0.0.1",
                    "--decode-workers",
                    "1",
                    "--grace-period-s",
                    "5",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            replicas.append((proc, f"127.0.0.1:{port}", metrics))
        for proc, address, _ in replicas:
            wait_serving(address, proc)
        before = [translate_count(m) for _, _, m in replicas]
        n = 40
        with Client([a for _, a, _ in replicas], timeout=30) as c:
            c.wait_ready(30)
            texts = [c.translate([f"Ein Hund Nummer {i} rennt."], beam_size=1)[0].text for i in range(n)]
        assert all(texts)
        served = [translate_count(m) - b for (_, _, m), b in zip(replicas, before)]
        assert sum(served) == n
        assert min(served) >= n // 4, served  # round robin: both take a real share (about half each)
    finally:
        for proc, _, _ in replicas:
            proc.send_signal(signal.SIGTERM)
        for proc, _, _ in replicas:
            assert proc.wait(30) == 0
