"""The Open Inference Protocol (KServe v2, `inference.GRPCInferenceService`), beside mtserve.v1 on
the same port. A thin servicer: it converts v2 tensors to texts and options, calls the same
Engine (so the same scheduler, limits and metrics), and converts the results back. Errors are
the service's own (`service.errors`), mapped to status codes by the interceptor; their messages
name the v2 field at fault (`inputs[0].datatype: ...`, `parameters.beam_size: ...`).

Two models, named after the export's manifest (`de-en` for the shipped one):

    NAME          input TEXT BYTES [N]  ->  output TRANSLATION BYTES [N]
                  request parameters: beam_size, max_output_tokens (int), length_penalty (double)
    NAME-encoder  input TEXT BYTES [N]  ->  output EMBEDDING FP32 [N, d_model] (mean-pooled encoder states)

Inputs may come in `contents.bytes_contents` or in `raw_input_contents` (each element a 4-byte
little-endian length and its bytes). Outputs mirror the request: raw in, raw out (what
tritonclient sends and reads), contents in, contents out.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata

import numpy as np

from service.api.inference import grpc_service_pb2 as pb
from service.api.inference import grpc_service_pb2_grpc as pb_grpc
from service.engine.engine import Engine, TranslateOptions
from service.errors import InvalidArgument, NotFound
from service.grpc.context import deadline

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
PLATFORM = "onnxruntime_onnx"
INPUT = "TEXT"
# Request parameters that standard clients may set on their own (tritonclient: sequence and
# priority fields, timeout; HTTP-only flags): accepted and ignored.
STANDARD_PARAMETERS = {
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
    "triton_enable_empty_final_response",
}


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "translate" or "encode"
    output: str
    output_datatype: str
    output_shape: tuple[int, ...]  # -1 = variable
    parameters: dict[str, type]  # accepted request parameters and their type


def _version() -> str:
    try:
        return metadata.version("mtserve")
    except metadata.PackageNotFoundError:
        return "0"


# -- tensor encoding ------------------------------------------------------------------


def serialize_bytes(items: list[bytes]) -> bytes:
    """The v2 raw BYTES layout: each element as a uint32 little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def deserialize_bytes(raw: bytes, field: str) -> list[bytes]:
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise InvalidArgument(
                field,
                f"truncated BYTES data: {len(raw) - i} bytes left where a 4-byte length "
                f"was expected (element {len(out)})",
            )
        (n,) = struct.unpack_from("<I", raw, i)
        i += 4
        if i + n > len(raw):
            raise InvalidArgument(field, f"BYTES element {len(out)} says {n} bytes but only {len(raw) - i} remain")
        out.append(raw[i : i + n])
        i += n
    return out


def _parameter(value: pb.InferParameter, field: str, kind: type):
    choice = value.WhichOneof("parameter_choice")
    if kind is int and choice in ("int64_param", "uint64_param"):
        return int(getattr(value, choice))
    if kind is float and choice in ("double_param", "int64_param", "uint64_param"):
        return float(getattr(value, choice))
    want = "an integer (int64_param)" if kind is int else "a number (double_param)"
    raise InvalidArgument(field, f"expected {want}, got {choice or 'no value'}")


def _renamed(exc: InvalidArgument, input_index: int) -> InvalidArgument:
    """The engine names mtserve.v1 fields (`texts[1]`, `options.beam_size`); name the v2 ones."""
    f = exc.field
    problem = exc.message[len(f) + 2 :] if exc.message.startswith(f + ": ") else exc.message
    if f == "texts":
        return InvalidArgument(f"inputs[{input_index}]", f"{INPUT}: {problem}")
    if f.startswith("texts["):
        return InvalidArgument(f"inputs[{input_index}]{f[len('texts') :]}", f"{INPUT}: {problem}")
    if f.startswith("options."):
        return InvalidArgument("parameters." + f[len("options.") :], problem)
    return exc


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, engine: Engine, ready: Callable[[], bool]):
        self.engine = engine
        self.ready = ready
        m = engine.manifest
        self.version = m.version
        self.models = {
            m.name: ModelSpec(
                m.name,
                "translate",
                "TRANSLATION",
                "BYTES",
                (-1,),
                {"beam_size": int, "max_output_tokens": int, "length_penalty": float},
            ),
            f"{m.name}-encoder": ModelSpec(
                f"{m.name}-encoder", "encode", "EMBEDDING", "FP32", (-1, m.dims.d_model), {}
            ),
        }

    # -- health and metadata ---------------------------------------------------------------

    async def ServerLive(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context) -> pb.ModelReadyResponse:
        known = request.name in self.models and request.version in ("", self.version)
        return pb.ModelReadyResponse(ready=known and self.ready())

    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="mtserve", version=_version(), extensions=["parameters"])

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:
        spec = self._model(request.name, request.version, "name", "version")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=[self.version],
            platform=PLATFORM,
            inputs=[tensor(name=INPUT, datatype="BYTES", shape=[-1])],
            outputs=[tensor(name=spec.output, datatype=spec.output_datatype, shape=list(spec.output_shape))],
        )

    def _model(self, name: str, version: str, name_field: str, version_field: str) -> ModelSpec:
        if name not in self.models:
            raise NotFound(f"{name_field}: unknown model {name!r} (served: {', '.join(self.models)})")
        if version not in ("", self.version):
            raise NotFound(f"{version_field}: model {name!r} has no version {version!r} (served: {self.version})")
        return self.models[name]

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context) -> pb.ModelInferResponse:
        spec = self._model(request.model_name, request.model_version, "model_name", "model_version")
        index, texts = self._texts(request)
        requested = [o.name for o in request.outputs]
        for i, name in enumerate(requested):
            if name != spec.output:
                raise InvalidArgument(
                    f"outputs[{i}].name", f"model {spec.name!r} has no output {name!r} (outputs: {spec.output})"
                )
        params = self._parameters(request, spec)
        try:
            if spec.kind == "translate":
                opts = TranslateOptions(**params)
                results = await self.engine.translate(texts, opts, timeout=deadline(context))
                data = [r.text.encode("utf-8") for r in results]
                shape = [len(data)]
            else:
                encodings = await self.engine.encode(texts, False, timeout=deadline(context))
                data = np.stack([e.pooled for e in encodings]).astype("<f4")
                shape = list(data.shape)
        except InvalidArgument as e:
            raise _renamed(e, index) from None

        out = pb.ModelInferResponse(model_name=spec.name, model_version=self.version, id=request.id)
        tensor = out.outputs.add(name=spec.output, datatype=spec.output_datatype, shape=shape)
        if request.raw_input_contents:
            out.raw_output_contents.append(serialize_bytes(data) if spec.output_datatype == "BYTES" else data.tobytes())
        elif spec.output_datatype == "BYTES":
            tensor.contents.bytes_contents.extend(data)
        else:
            tensor.contents.fp32_contents.extend(data.ravel().tolist())
        return out

    def _texts(self, request: pb.ModelInferRequest) -> tuple[int, list[str]]:
        """The TEXT input as strings: (its index in `inputs`, texts)."""
        inputs = request.inputs
        for i, t in enumerate(inputs):
            if t.name != INPUT:
                raise InvalidArgument(f"inputs[{i}].name", f"unknown input {t.name!r} (the model's input is {INPUT})")
        if len(inputs) != 1:
            raise InvalidArgument("inputs", f"expected exactly one input ({INPUT}), got {len(inputs)}")
        t = inputs[0]
        field = "inputs[0]"
        if t.datatype != "BYTES":
            raise InvalidArgument(f"{field}.datatype", f"{INPUT} must be BYTES, got {t.datatype or 'none'}")
        if len(t.shape) != 1 or t.shape[0] < 0:
            raise InvalidArgument(f"{field}.shape", f"{INPUT} must have shape [N], got {list(t.shape)}")
        if request.raw_input_contents:
            if len(request.raw_input_contents) != len(inputs):
                raise InvalidArgument(
                    "raw_input_contents", f"{len(request.raw_input_contents)} entries for {len(inputs)} input(s)"
                )
            if t.HasField("contents"):
                raise InvalidArgument(f"{field}.contents", "set together with raw_input_contents; use one of them")
            items = deserialize_bytes(request.raw_input_contents[0], "raw_input_contents[0]")
        else:
            c = t.contents
            others = [f.name for f, _ in c.ListFields() if f.name != "bytes_contents"]
            if others:
                raise InvalidArgument(f"{field}.contents", f"BYTES data goes in bytes_contents, got {others[0]}")
            items = list(c.bytes_contents)
        if len(items) != t.shape[0]:
            raise InvalidArgument(
                f"{field}.shape", f"shape {list(t.shape)} says {t.shape[0]} elements, the data holds {len(items)}"
            )
        texts = []
        for j, b in enumerate(items):
            try:
                texts.append(b.decode("utf-8"))
            except UnicodeDecodeError:
                raise InvalidArgument(f"{field}[{j}]", f"{INPUT} element is not valid UTF-8") from None
        return 0, texts

    def _parameters(self, request: pb.ModelInferRequest, spec: ModelSpec) -> dict:
        out = {}
        for key in sorted(request.parameters):
            field = f"parameters.{key}"
            if key in spec.parameters:
                out[key] = _parameter(request.parameters[key], field, spec.parameters[key])
            elif key not in STANDARD_PARAMETERS:
                accepted = ", ".join(spec.parameters) or "none"
                raise InvalidArgument(field, f"not a parameter of model {spec.name!r} (accepted: {accepted})")
        return out
