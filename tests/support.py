"""Helpers for the tests that start `mtserve serve` as a process (imported as `tests.support`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import grpc

from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.client import healthcheck


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command(onnx_dir: Path, address: str, *extra: str) -> list[str]:
    """`mtserve serve` of the export in `onnx_dir` (its model dir the parent) on `address`."""
    model = ["--model-dir", str(onnx_dir.parent), "--onnx-dir", str(onnx_dir)]
    return [sys.executable, "-m", "mtserve", "serve", *model, "--address", address, *extra]


def wait_serving(address: str, proc: subprocess.Popen, timeout: float = 90) -> list[str]:
    """Poll health until SERVING; returns the statuses seen on the way. Fails with the process's
    output when it exits first (`proc` started with stdout=PIPE, text=True)."""
    try:
        return healthcheck.wait_serving(address, timeout, alive=lambda: proc.poll() is None)
    except RuntimeError:
        raise AssertionError(proc.stdout.read()) from None


def kserve_infer(
    address: str, model: str, texts: list[str], **params: str | float | int | bool
) -> kpb.ModelInferResponse:
    """One KServe ModelInfer of `texts` (the TEXT input) with `params` as request parameters."""
    req = kpb.ModelInferRequest(model_name=model)
    req.inputs.add(
        name="TEXT",
        datatype="BYTES",
        shape=[len(texts)],
        contents=kpb.InferTensorContents(bytes_contents=[t.encode() for t in texts]),
    )
    for k, v in params.items():
        if isinstance(v, bool):
            req.parameters[k].bool_param = v
        elif isinstance(v, str):
            req.parameters[k].string_param = v
        elif isinstance(v, float):
            req.parameters[k].double_param = v
        else:
            req.parameters[k].int64_param = v
    with grpc.insecure_channel(address) as ch:
        return kpb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=30)
