"""`mtserve serve --replicas 2`: two server processes on one port under a supervisor. Requests
over many connections reach both and none is lost; /metrics merges them with a `replica` label; a
replica that is killed is restarted while the other serves; SIGTERM drains both; a port in use, a
model that does not load and an address without a port fail the start with exit code 2; KServe's
repository calls are refused, since they would reach one replica only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.processes import replica_pids, terminate
from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.errors import StartupError
from service.replicas import claim_address
from tests.support import free_port, serve_command

TEXT = "Ein Mann fährt Fahrrad ."


class Supervised:
    """`mtserve serve --replicas 2` in a subprocess, its output in a file (a pipe nobody reads
    would fill and block it)."""

    def __init__(self, onnx_dir: Path, *extra: str, port: int | None = None):
        self.port, self.metrics_port = port or free_port(), free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="mtserve-replicas-", suffix=".log")
        self.proc = subprocess.Popen(
            serve_command(
                onnx_dir,
                self.address,
                "--metrics-port",
                str(self.metrics_port),
                "--metrics-address",
                "127.0.0.1",
                "--replicas",
                "2",
                "--decode-workers",
                "1",
                "--grace-period-s",
                "10",
                *extra,
            ),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def output(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")

    def wait_serving(self, timeout: float = 120) -> None:
        """Until /metrics says both replicas serve (health answers as soon as one does)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, self.output()
            try:
                if self.sample("mtserve_replicas_ready") == 2:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"replicas not ready after {timeout}s:\n{self.output()}")

    def metrics(self) -> list:
        body = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=30).read().decode()
        return [s for f in text_string_to_metric_families(body) for s in f.samples]

    def sample(self, name: str, **labels: str) -> float:
        return sum(s.value for s in self.metrics() if s.name == name and labels.items() <= s.labels.items())

    def replica_pids(self) -> list[int]:
        return replica_pids(self.proc.pid)

    def stop(self) -> int:
        return terminate(self.proc, 60)


def translate_over_connections(address: str, n: int, connections: int) -> list[str]:
    """`n` Translate calls spread over `connections` connections of their own; their status codes."""
    opts = [("grpc.use_local_subchannel_pool", 1)]  # else channels with equal arguments share one connection
    channels = [grpc.insecure_channel(address, options=opts) for _ in range(connections)]
    try:
        stubs = [pb_grpc.TranslationServiceStub(ch) for ch in channels]

        def one(i: int) -> str:
            req = pb.TranslateRequest(texts=[TEXT], options=pb.TranslationOptions(beam_size=1, max_output_tokens=8))
            try:
                stubs[i % connections].Translate(req, timeout=60)
                return "OK"
            except grpc.RpcError as e:
                return e.code().name

        with ThreadPoolExecutor(connections) as pool:
            return list(pool.map(one, range(n)))
    finally:
        for ch in channels:
            ch.close()


@pytest.fixture(scope="module")
def supervised(tiny_onnx_dir) -> Iterator[Supervised]:
    server = Supervised(tiny_onnx_dir)
    try:
        server.wait_serving()
        yield server
    finally:
        server.stop()


def test_requests_over_many_connections_reach_both_replicas_and_none_is_lost(supervised):
    before = {i: supervised.sample("mtserve_requests_total", method="Translate", replica=str(i)) for i in (0, 1)}
    codes = translate_over_connections(supervised.address, 64, connections=16)
    assert codes == ["OK"] * 64
    after = {i: supervised.sample("mtserve_requests_total", method="Translate", replica=str(i)) for i in (0, 1)}
    served = {i: after[i] - before[i] for i in (0, 1)}
    assert sum(served.values()) == 64  # every request counted once, by the replica that answered it
    # 16 connections hashed over 2 listeners: all on one replica has probability 2**-15.
    assert served[0] > 0 and served[1] > 0, served


def test_metrics_merge_the_replicas_with_a_replica_label(supervised):
    samples = supervised.metrics()
    info = [s for s in samples if s.name == "mtserve_model_info"]
    assert sorted(s.labels["replica"] for s in info) == ["0", "1"]
    assert supervised.sample("mtserve_replicas_ready") == 2
    # A family appears once, with both replicas' samples: Prometheus refuses a repeated family.
    body = urllib.request.urlopen(f"http://127.0.0.1:{supervised.metrics_port}/metrics", timeout=30).read().decode()
    assert body.count("# TYPE mtserve_requests_total counter") == 1


def test_kserve_repository_calls_are_refused_naming_the_field(supervised):
    with grpc.insecure_channel(supervised.address) as ch:
        with pytest.raises(grpc.RpcError) as e:
            kpb_grpc.GRPCInferenceServiceStub(ch).RepositoryModelLoad(
                kpb.RepositoryModelLoadRequest(model_name="tiny"), timeout=30
            )
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert e.value.details().startswith("model_name: ") and "replicas" in e.value.details()


def test_a_killed_replica_is_restarted_while_the_other_serves(supervised):
    restarts = supervised.sample("mtserve_replica_restarts_total")
    pids = supervised.replica_pids()
    assert len(pids) == 2, pids
    os.kill(pids[0], signal.SIGKILL)
    end = time.monotonic() + 30
    while "exited (exit code -9)" not in supervised.output():  # the supervisor has reaped it
        assert time.monotonic() < end, supervised.output()
        time.sleep(0.05)
    # New connections go to the replica that is left, while the supervisor starts another. (Those
    # made in the instant between the kill and the listener's close are reset: UNAVAILABLE, which
    # clients retry.)
    assert translate_over_connections(supervised.address, 16, connections=8) == ["OK"] * 16
    supervised.wait_serving()
    assert supervised.sample("mtserve_replica_restarts_total") == restarts + 1
    new = supervised.replica_pids()
    assert len(new) == 2 and pids[0] not in new and pids[1] in new
    assert translate_over_connections(supervised.address, 32, connections=16) == ["OK"] * 32


def test_sigterm_drains_every_replica_and_exits_0(tiny_onnx_dir):
    server = Supervised(tiny_onnx_dir)
    try:
        server.wait_serving()
        pids = server.replica_pids()
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(translate_over_connections, server.address, 32, 8)
            time.sleep(0.3)
            server.proc.send_signal(signal.SIGTERM)
            codes = load.result(60)
        assert server.proc.wait(60) == 0, server.output()
        # Accepted requests are answered; those that arrive during the drain are refused cleanly.
        assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
        assert all(not Path(f"/proc/{pid}").exists() or "zombie" in _status(pid) for pid in pids)
        assert "all replicas stopped" in server.output()
    finally:
        server.stop()


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().lower()
    except FileNotFoundError:
        return "zombie"


def test_a_port_in_use_fails_the_start(tiny_onnx_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        server = Supervised(tiny_onnx_dir, port=taken.getsockname()[1])
        assert server.proc.wait(60) == 2
    assert "cannot start: address: cannot listen on 127.0.0.1:" in server.output()


def test_a_model_that_does_not_load_fails_the_start_and_stops_the_other_replica(tiny_onnx_dir, tmp_path):
    server = Supervised(tiny_onnx_dir, "--onnx-dir", str(tmp_path))  # no export there
    assert server.proc.wait(120) == 2, server.output()
    assert "cannot start: replica " in server.output()
    assert not [line for line in server.output().splitlines() if "serving on" in line]


def test_claim_address_resolves_port_0_and_refuses_what_replicas_cannot_share():
    host, port = claim_address("127.0.0.1:0").rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    with pytest.raises(StartupError, match="address: replicas need host:port"):
        claim_address("unix:/tmp/mtserve.sock")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(StartupError, match="cannot listen"):
            claim_address(f"127.0.0.1:{taken.getsockname()[1]}")
