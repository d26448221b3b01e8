"""Hot swap under load: a new version of a model replaces the old one while clients keep sending.

    python -m benchmarks.hot_swap --model-dir models/de-en/1 --concurrency 64 --phase-s 15

A repository in a temporary directory holds the model twice, as `NAME/1` and `NAME/2` (links to
the same checkpoint and export: what is measured is the swap, not the weights). A real
`mtserve serve` process starts with version 1 only, and `--concurrency` closed-loop clients send
single-sentence Translate requests that name the model without a version, so each goes to the
model's default version. Then, each step after `--phase-s` seconds of load, over KServe's
repository extension on the same port:

1. RepositoryModelLoad of version 2;
2. RepositoryModelLoad of version 2 with `default: true`: new requests go to version 2;
3. RepositoryModelUnload of version 1, which returns once the requests that hold version 1 are
   answered.

Reported: every request's outcome (none may fail) and the version that answered it; how many
requests were in flight on version 1 when its unload began and were answered by it afterwards;
the server's resident memory with one version loaded (after a warm-up of `--warmup-s`, so
that the heap has reached the working set of the load), with two, and after the unload (each
the median of samples over the last half of a phase); latency percentiles per phase; the load and unload
times. One JSON object on stdout (and `--json FILE`); the exit status is 0 when no request
failed and the memory after the unload is within `--max-rss-ratio` (1.10) of the one-version
figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc

from benchmarks.figures import percentile
from benchmarks.processes import free_port
from benchmarks.soak import SENTENCES, rss_bytes
from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.client.healthcheck import wait_serving

REPO = Path(__file__).resolve().parent.parent

LINKED = ("config.json", "tokenizer.json", "model.safetensors", "onnx")


def make_repository(root: Path, model_dir: Path, onnx_dir: Path | None, name: str) -> Path:
    """`root/NAME/1` and `root/NAME/2`, each linking the checkpoint's files and its export."""
    for version in ("1", "2"):
        d = root / name / version
        d.mkdir(parents=True)
        for entry in LINKED:
            target = (onnx_dir if entry == "onnx" and onnx_dir else model_dir / entry).resolve()
            if target.exists():
                (d / entry).symlink_to(target)
    return root


class Load:
    """Closed-loop clients: each sends one sentence, waits for the answer, sends the next."""

    def __init__(self, address: str, concurrency: int, model: str, beam: int):
        self.address, self.model, self.beam = address, model, beam
        self.channels = [grpc.insecure_channel(address) for _ in range(min(8, concurrency))]
        self.records: list[tuple[float, float, str, str]] = []  # (start, end, model or "", status)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(concurrency)]

    def _client(self, i: int) -> None:
        stub = pb_grpc.TranslationServiceStub(self.channels[i % len(self.channels)])
        n = i
        while not self.stop.is_set():
            text = SENTENCES[n % len(SENTENCES)]
            n += 1
            request = pb.TranslateRequest(
                texts=[text], model=self.model, options=pb.TranslationOptions(beam_size=self.beam)
            )
            t0 = time.monotonic()
            try:
                r = stub.Translate(request, timeout=120)
                self.records.append((t0, time.monotonic(), r.model, "OK"))
            except grpc.RpcError as e:
                self.records.append((t0, time.monotonic(), "", f"{e.code().name}: {e.details()}"))

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(180)
        for c in self.channels:
            c.close()


def _repository_call(stub, method: str, name: str, **params) -> float:
    """One repository call; its duration in seconds."""
    parameters = {}
    for key, value in params.items():
        if isinstance(value, bool):
            parameters[key] = kpb.ModelRepositoryParameter(bool_param=value)
        else:
            parameters[key] = kpb.ModelRepositoryParameter(string_param=str(value))
    request = getattr(kpb, f"{method}Request")(model_name=name, parameters=parameters)
    t0 = time.monotonic()
    getattr(stub, method)(request, timeout=300)
    return time.monotonic() - t0


def _rss_phase(pid: int, seconds: float) -> int:
    """The median resident memory over the second half of a phase of `seconds`."""
    time.sleep(seconds / 2)
    samples = []
    end = time.monotonic() + seconds / 2
    while time.monotonic() < end:
        samples.append(rss_bytes(pid))
        time.sleep(0.25)
    return int(statistics.median(samples)) if samples else rss_bytes(pid)


def _latency(records, start: float, end: float) -> dict[str, float]:
    xs = sorted(r[1] - r[0] for r in records if start <= r[0] < end and r[3] == "OK")
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "p50_ms": round(percentile(xs, 0.5) * 1e3, 1), "p99_ms": round(percentile(xs, 0.99) * 1e3, 1)}


def run(
    model_dir: Path,
    onnx_dir: Path | None = None,
    name: str = "de-en",
    concurrency: int = 64,
    phase_s: float = 15.0,
    beam: int = 1,
    server_args: Sequence[str] = (),
    warmup_s: float | None = None,
) -> dict:
    with tempfile.TemporaryDirectory(prefix="mtserve-hot-swap-") as tmp:
        repository = make_repository(Path(tmp), Path(model_dir), onnx_dir, name)
        address = f"127.0.0.1:{free_port()}"
        log = open(Path(tmp) / "server.log", "w+")
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mtserve",
                "serve",
                "--model-repository",
                str(repository),
                "--models",
                f"{name}:1",
                "--address",
                address,
                "--metrics-port",
                "0",
                "--log-level",
                "warning",
                *server_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env={**os.environ},
        )
        try:
            wait_serving(address, 180, alive=lambda: proc.poll() is None)
            return _scenario(proc, address, name, concurrency, phase_s, beam, phase_s if warmup_s is None else warmup_s)
        except Exception:
            log.seek(0)
            sys.stderr.write(log.read()[-4000:])
            raise
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(60)
            log.close()


def _scenario(
    proc: subprocess.Popen, address: str, name: str, concurrency: int, phase_s: float, beam: int, warmup_s: float
) -> dict:
    channel = grpc.insecure_channel(address)
    repo = kpb_grpc.GRPCInferenceServiceStub(channel)
    load = Load(address, concurrency, name, beam)
    load.start()
    time.sleep(warmup_s)  # warm-up: the heap reaches the working set of this load
    t_one = time.monotonic()
    rss_one = _rss_phase(proc.pid, phase_s)
    t_load = time.monotonic()
    load_s = _repository_call(repo, "RepositoryModelLoad", name, version="2")
    rss_two = _rss_phase(proc.pid, phase_s)
    t_switch = time.monotonic()
    _repository_call(repo, "RepositoryModelLoad", name, version="2", default=True)
    t_switched = time.monotonic()
    t_unload = time.monotonic()
    unload_s = _repository_call(repo, "RepositoryModelUnload", name, version="1")
    t_unloaded = time.monotonic()
    rss_after = _rss_phase(proc.pid, phase_s)
    load.finish()
    t_end = time.monotonic()
    index = repo.RepositoryIndex(kpb.RepositoryIndexRequest(), timeout=30)
    channel.close()

    records = load.records
    v1, v2 = f"{name}:1", f"{name}:2"
    failed = [r for r in records if r[3] != "OK"]
    by_version = {m: sum(1 for r in records if r[2] == m) for m in (v1, v2)}
    report = {
        "model": name,
        "concurrency": concurrency,
        "beam": beam,
        "phase_s": phase_s,
        "warmup_s": warmup_s,
        "requests": len(records),
        "failed": len(failed),
        "failures": sorted({r[3] for r in failed})[:5],
        "answered_by": by_version,
        # Requests version 1 was still answering when its unload began: they started on it and
        # finished on it (no version-1 request can start once the switch has returned).
        "v1_answered_after_unload_began": sum(1 for r in records if r[2] == v1 and r[1] > t_unload),
        "v1_started_after_switch": sum(1 for r in records if r[2] == v1 and r[0] > t_switched),
        "v2_answered_before_switch": sum(1 for r in records if r[2] == v2 and r[1] < t_switch),
        "load_v2_s": round(load_s, 2),
        "unload_v1_s": round(unload_s, 2),
        "rss_mb": {
            "one_version": round(rss_one / 2**20, 1),
            "two_versions": round(rss_two / 2**20, 1),
            "after_unload": round(rss_after / 2**20, 1),
        },
        "rss_after_unload_over_one_version": round(rss_after / rss_one, 3),
        "latency": {
            "v1_only": _latency(records, t_one, t_load),
            "during_load_of_v2": _latency(records, t_load, t_switch),
            "during_swap": _latency(records, t_switch, t_unloaded),
            "v2_only": _latency(records, t_unloaded, t_end),
        },
        "repository_index": sorted((m.name, m.version, m.state) for m in index.models),
    }
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--onnx-dir", help="its export (default MODEL_DIR/onnx)")
    p.add_argument("--name", default="de-en")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--phase-s", type=float, default=15.0)
    p.add_argument("--warmup-s", type=float, help="load before the first measurement (default: --phase-s)")
    p.add_argument("--beam", type=int, default=1)
    p.add_argument("--max-rss-ratio", type=float, default=1.10)
    p.add_argument("--json", help="also write the report here")
    p.add_argument("server_args", nargs="*", help="extra `mtserve serve` flags (after --)")
    args = p.parse_args(argv)
    report = run(
        Path(args.model_dir),
        Path(args.onnx_dir) if args.onnx_dir else None,
        args.name,
        args.concurrency,
        args.phase_s,
        args.beam,
        args.server_args,
        args.warmup_s,
    )
    report["passed"] = report["failed"] == 0 and report["rss_after_unload_over_one_version"] <= args.max_rss_ratio
    text = json.dumps(report)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
