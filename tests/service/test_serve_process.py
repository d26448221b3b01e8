"""`mtserve serve` as a process: health transitions, SIGTERM under load, start-up errors, and the
command-line client against it."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.client import Client

LONG = "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße vor vielen Menschen, die zuhören."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(onnx_dir, *extra: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--model-dir", str(onnx_dir.parent), "--onnx-dir", str(onnx_dir),
         "--address", f"127.0.0.1:{port}", "--metrics-port", "0", "--decode-workers", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"127.0.0.1:{port}"


def wait_serving(address: str, proc: subprocess.Popen, timeout: float = 90) -> list[str]:
    """Poll health until SERVING; returns the statuses seen on the way."""
    seen = []
    end = time.time() + timeout
    with grpc.insecure_channel(address) as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        while time.time() < end:
            assert proc.poll() is None, proc.stdout.read()
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status
                seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(status))
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return seen
            except grpc.RpcError as e:
                seen.append(e.code().name)
            time.sleep(0.05)
    raise TimeoutError(f"not SERVING after {timeout}s: {seen[-5:]}")


@pytest.fixture(scope="module")
def serving(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir)
    wait_serving(address, proc)
    yield address
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_sigterm_under_load_answers_every_accepted_request(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir, "--grace-period-s", "30")
    wait_serving(address, proc)
    outcomes = []
    first_answer = []

    def call(i):
        try:
            with Client(address, timeout=60) as c:
                r = c.translate([LONG, f"Ein Hund Nummer {i} rennt."], beam_size=4)
                first_answer.append(1)
                outcomes.append(("OK", len(r)))
        except grpc.RpcError as e:
            outcomes.append((e.code().name, e.details()))

    with ThreadPoolExecutor(32) as pool:
        futs = [pool.submit(call, i) for i in range(64)]
        while not first_answer:
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        for f in futs:
            f.result()
    rc = proc.wait(60)
    log = proc.stdout.read()
    codes = [o[0] for o in outcomes]
    assert rc == 0, log
    assert len(outcomes) == 64
    # Accepted requests all got their answer; the others were refused as UNAVAILABLE, never lost.
    assert set(codes) <= {"OK", "UNAVAILABLE"}, outcomes
    assert codes.count("OK") >= 2
    assert all(n == 2 for code, n in outcomes if code == "OK")
    assert "drained" in log


def test_health_goes_not_serving_on_sigterm(tiny_onnx_dir):
    proc, address = start(tiny_onnx_dir, "--grace-period-s", "5")
    seen = wait_serving(address, proc)
    assert seen[-1] == "SERVING"
    with grpc.insecure_channel(address) as ch:
        watch = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        proc.send_signal(signal.SIGTERM)
        assert next(watch).status == health_pb2.HealthCheckResponse.NOT_SERVING
    assert proc.wait(30) == 0


@pytest.mark.parametrize("problem", ["missing_dir", "corrupt_graph", "bad_setting"])
def test_startup_errors_exit_non_zero_with_one_clear_line(tiny_onnx_dir, tmp_path, problem):
    import shutil

    if problem == "missing_dir":
        proc, _ = start(tmp_path / "nothing" / "onnx")
    elif problem == "corrupt_graph":
        broken = tmp_path / "onnx"
        shutil.copytree(tiny_onnx_dir, broken)
        graph = next(broken.glob("decoder.fp32*.onnx"))
        graph.write_bytes(graph.read_bytes()[:1000])
        proc, _ = start(broken)
    else:
        proc, _ = start(tiny_onnx_dir, "--max-batch-sentences", "0")
    rc = proc.wait(60)
    out = proc.stdout.read()
    assert rc != 0
    assert "Traceback" not in out, out
    assert {"missing_dir": "manifest.json", "corrupt_graph": "checksum", "bad_setting": "max_batch_sentences"}[problem] in out


def test_cli_translate_texts_file_and_encode(serving, tmp_path):
    cli = [sys.executable, "-m", "service.cli"]
    out = subprocess.run([*cli, "translate", "--server", serving, "--beam", "1", "Ein Hund rennt durch den Schnee."],
                         capture_output=True, text=True, check=True)
    one = out.stdout.strip()
    assert one
    src = tmp_path / "de.txt"
    src.write_text("Ein Hund rennt durch den Schnee.\n\nZwei Männer sitzen auf einer Bank.\n" * 5)
    dst = tmp_path / "en.txt"
    subprocess.run([*cli, "translate", "--server", serving, "--beam", "1", "--input", str(src), "--output", str(dst),
                    "--concurrency", "4", "--batch-size", "2"], capture_output=True, text=True, check=True)
    lines = dst.read_text().split("\n")[:-1]
    assert len(lines) == 15 and lines[0] == one and lines[1] == "" and all(lines[i] for i in (0, 2, 3, 5))
    enc = subprocess.run([*cli, "encode", "--server", serving, "Ein Hund."], capture_output=True, text=True, check=True)
    item = json.loads(enc.stdout)
    assert item["tokens"] and len(item["pooled"]) > 8
    bad = subprocess.run([*cli, "translate", "--server", serving, " "], capture_output=True, text=True)
    assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr
