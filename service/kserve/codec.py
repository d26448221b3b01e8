"""The Open Inference Protocol's (KServe v2) tensors and parameters as mtserve's texts, options
and results, for `service.kserve.servicer`. Messages of the errors raised here name the v2 field
at fault (`inputs[0].datatype: ...`, `parameters.beam_size: ...`).

Two models, named after the export's manifest (`de-en` for the shipped one):

    NAME          input TEXT BYTES [N]  ->  output TRANSLATION BYTES [N]
                  request parameters: beam_size, max_output_tokens, min_output_tokens (int),
                  length_penalty (double), source_language, target_language (string: validated
                  against the model, and a multilingual model needs target_language); the
                  decoding options of mtserve.v1's TranslationOptions: num_hypotheses,
                  sampling_topk, seed (int), sampling_topp, sampling_temperature (double), and
                  target_prefix (string: the same forced prefix for every text of the request),
                  split (string: "sentences", the default, "newlines" or "none"; docs/documents.md);
                  text_type (string: "text", the default, "html" or "xml"; docs/markup.md),
                  glossary (string: JSON, an object {"source": "target", ...} or a list of
                  {"source", "target", "forms"} objects), do_not_translate (string: a JSON list
                  of phrases), glossary_id (string), detect_per_segment (bool; docs/terminology.md,
                  docs/language_detection.md). The response's parameters carry "applied_terms" (a
                  JSON list per text of mtserve.v1's AppliedTerm fields) when the request had terms,
                  and "detected_languages" (a JSON list per text of [language, probability]) with
                  source_language "auto".
                  TRANSLATION holds each text's best hypothesis: n-best lists
                  (num_hypotheses, validated here) come back on mtserve.v1 only.
    NAME-encoder  input TEXT BYTES [N]  ->  output EMBEDDING FP32 [N, d_model] (mean-pooled encoder states)
                  request parameter: source_language (string; a multilingual model may need it)

Inputs may come in `contents.bytes_contents` or in `raw_input_contents` (each element a 4-byte
little-endian length and its bytes), with shape [N] or [N, 1]. Outputs mirror the request: raw
in, raw out (what tritonclient sends and reads), contents in, contents out.

Versions: Triton numbers a model's versions, and its tools parse them as integers (perf_analyzer
matches statistics by `std::stoll(version)`). A repository's versions are its VERSION
directories; a model directory served on its own has its export's version when that is a
positive integer, else "1" (`served_version`). The export's own version string (config.json's
`version`, else a hash of the weights) is in ModelConfig's `parameters.model_version`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from contract.manifest import Manifest
from service.api.inference import grpc_service_pb2 as pb
from service.api.inference import model_config_pb2 as mc
from service.engine.engine import model_names
from service.engine.requests import GlossaryEntry, TranslationResult
from service.errors import InvalidArgument, NotFound, quote
from service.settings import Settings

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


def model_specs(name: str, manifest: Manifest) -> dict[str, ModelSpec]:
    """The two KServe models a served model `name` is, by name."""
    translator, encoder = model_names(name)
    return {
        translator: ModelSpec(
            translator,
            "translate",
            "TRANSLATION",
            "BYTES",
            (-1,),
            {
                "beam_size": int,
                "max_output_tokens": int,
                "min_output_tokens": int,
                "length_penalty": float,
                "source_language": str,
                "target_language": str,
                "num_hypotheses": int,
                "sampling_topk": int,
                "sampling_topp": float,
                "sampling_temperature": float,
                "seed": int,
                "target_prefix": str,
                "split": str,
                "text_type": str,
                "glossary": str,
                "do_not_translate": str,
                "glossary_id": str,
                "detect_per_segment": bool,
            },
        ),
        encoder: ModelSpec(
            encoder, "encode", "EMBEDDING", "FP32", (-1, manifest.dims.d_model), {"source_language": str}
        ),
    }


def served_version(manifest: Manifest) -> str:
    """The version number a model directory served on its own (`--model-dir`) has: its
    config.json's version when that is a number, else 1."""
    v = manifest.version
    return v if v.isdecimal() and int(v) > 0 else "1"


# -- model configuration (Triton's ModelConfig) ---------------------------------------------

DATA_TYPES = {"BYTES": mc.TYPE_STRING, "FP32": mc.TYPE_FP32}


def model_config(
    spec: ModelSpec, manifest: Manifest, settings: Settings, provider: str, version: str
) -> mc.ModelConfig:
    """Triton's configuration of a served model, from the manifest and the settings the server runs
    with: a batch is the texts of one request (max_batch_size = max_texts_per_request), each a
    scalar string ([1] reshaped to [], Triton's way of writing a 1-D batch input); the dynamic
    batcher's delay and queue bound are the scheduler's; one instance group of the decode workers.
    The rest of the scheduler's settings travel as parameters."""
    st = settings
    scalar = mc.ModelTensorReshape(shape=[])  # each element [1], seen as []
    output = mc.ModelOutput(name=spec.output, data_type=DATA_TYPES[spec.output_datatype])
    if len(spec.output_shape) > 1:
        output.dims.extend(spec.output_shape[1:])
    else:
        output.dims.append(1)
        output.reshape.CopyFrom(scalar)
    gpu = provider == "cuda"
    params = {
        "model_version": manifest.version,
        "precision": st.precision,
        "execution_provider": provider,
        "engine_process": str(st.engine_process).lower(),
        "intra_op_threads": str(st.intra_op_threads),
        "continuous_batching": str(st.continuous_batching).lower(),
        "max_batch_sentences": str(st.max_batch_sentences),
        "max_batch_tokens": str(st.max_batch_tokens),
        "max_queue_delay_ms": f"{st.max_queue_delay_ms:g}",
        "max_input_tokens": str(st.max_input_tokens),
        "max_text_bytes": str(st.max_text_bytes),
        "max_request_bytes": str(st.max_request_bytes),
    }
    if st.continuous_batching:
        params |= {
            "admit_fraction": f"{st.admit_fraction:g}",
            "admit_delay_ms": f"{st.admit_delay_ms:g}",
            "compact_fraction": f"{st.compact_fraction:g}",
        }
    if spec.kind == "translate":
        params |= {
            "default_beam_size": str(st.default_beam_size),
            "max_beam_size": str(st.max_beam_size),
            "max_output_tokens": str(st.max_output_tokens),
            "length_penalty": f"{manifest.generation.length_penalty:g}",
        }
    return mc.ModelConfig(
        name=spec.name,
        platform=PLATFORM,
        backend="onnxruntime",
        version_policy=mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=1)),
        max_batch_size=st.max_texts_per_request,
        input=[mc.ModelInput(name=INPUT, data_type=mc.TYPE_STRING, dims=[1], reshape=scalar)],
        output=[output],
        dynamic_batching=mc.ModelDynamicBatching(
            max_queue_delay_microseconds=round(st.max_queue_delay_ms * 1000),
            # Deadlines are each request's own (its gRPC deadline); the bound counts sentences.
            default_queue_policy=mc.ModelQueuePolicy(allow_timeout_override=True, max_queue_size=st.max_queue_size),
        ),
        instance_group=[
            mc.ModelInstanceGroup(
                name=f"{spec.name}_0",
                kind=mc.ModelInstanceGroup.KIND_GPU if gpu else mc.ModelInstanceGroup.KIND_CPU,
                count=st.decode_workers,
                gpus=[0] if gpu else [],
            )
        ],
        parameters={k: mc.ModelParameter(string_value=v) for k, v in params.items()},
    )


# -- BYTES tensors ------------------------------------------------------------------------


def serialize_bytes(items: list[bytes]) -> bytes:
    """The v2 raw BYTES layout: each element as a uint32 little-endian length and its bytes."""
    return b"".join(struct.pack("<I", len(b)) + b for b in items)


def deserialize_bytes(raw: bytes, field: str) -> list[bytes]:
    out: list[bytes] = []
    i = 0
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


# -- requests --------------------------------------------------------------------------------


def input_texts(request: pb.ModelInferRequest) -> tuple[int, list[str]]:
    """The TEXT input as strings: (its index in `inputs`, texts)."""
    inputs = request.inputs
    for i, t in enumerate(inputs):
        if t.name != INPUT:
            raise InvalidArgument(f"inputs[{i}].name", f"unknown input {quote(t.name)} (the model's input is {INPUT})")
    if len(inputs) != 1:
        raise InvalidArgument("inputs", f"expected exactly one input ({INPUT}), got {len(inputs)}")
    t = inputs[0]
    field = "inputs[0]"
    if t.datatype != "BYTES":
        raise InvalidArgument(
            f"{field}.datatype", f"{INPUT} must be BYTES, got {quote(t.datatype) if t.datatype else 'none'}"
        )
    # [N], or [N, 1]: ModelConfig describes each text as dims [1] (reshaped to []).
    if not (len(t.shape) == 1 or (len(t.shape) == 2 and t.shape[1] == 1)) or t.shape[0] < 0:
        raise InvalidArgument(f"{field}.shape", f"{INPUT} must have shape [N] or [N, 1], got {list(t.shape)}")
    items = _input_items(request)
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


def _input_items(request: pb.ModelInferRequest) -> list[bytes]:
    """The one input's elements, from raw_input_contents or from its bytes_contents."""
    t, field = request.inputs[0], "inputs[0]"
    if request.raw_input_contents:
        if len(request.raw_input_contents) != len(request.inputs):
            raise InvalidArgument(
                "raw_input_contents", f"{len(request.raw_input_contents)} entries for {len(request.inputs)} input(s)"
            )
        if t.HasField("contents"):
            raise InvalidArgument(f"{field}.contents", "set together with raw_input_contents; use one of them")
        return deserialize_bytes(request.raw_input_contents[0], "raw_input_contents[0]")
    c = t.contents
    others = [f.name for f, _ in c.ListFields() if f.name != "bytes_contents"]
    if others:
        raise InvalidArgument(f"{field}.contents", f"BYTES data goes in bytes_contents, got {others[0]}")
    return list(c.bytes_contents)


def check_outputs(request: pb.ModelInferRequest, spec: ModelSpec) -> None:
    """The outputs the request names, if any, must be the model's one output."""
    for i, o in enumerate(request.outputs):
        if o.name != spec.output:
            raise InvalidArgument(
                f"outputs[{i}].name", f"model {spec.name!r} has no output {quote(o.name)} (outputs: {spec.output})"
            )


def parameter_value(value: pb.InferParameter, field: str, kind: type) -> int | float | str | bool:
    choice = value.WhichOneof("parameter_choice")
    if kind is bool:
        if choice != "bool_param":
            raise InvalidArgument(field, f"expected a boolean (bool_param), got {choice or 'no value'}")
        return bool(value.bool_param)
    if kind is str:
        if choice != "string_param":
            raise InvalidArgument(field, f"expected a string (string_param), got {choice or 'no value'}")
        return str(value.string_param)
    if kind is int and choice in ("int64_param", "uint64_param"):
        return int(getattr(value, choice))
    if kind is float and choice in ("double_param", "int64_param", "uint64_param"):
        return float(getattr(value, choice))
    want = "an integer (int64_param)" if kind is int else "a number (double_param)"
    raise InvalidArgument(field, f"expected {want}, got {choice or 'no value'}")


def request_parameters(request: pb.ModelInferRequest, spec: ModelSpec) -> dict[str, Any]:
    """The model's request parameters by name (keyword arguments of TranslateOptions, each of the
    type `spec.parameters` gives it, hence Any); standard ones of other clients are dropped."""
    out: dict[str, Any] = {}
    for key in sorted(request.parameters):
        field = f"parameters.{key}" if len(key) <= 64 and key.isprintable() else f"parameters[{quote(key)}]"
        if key in spec.parameters:
            out[key] = parameter_value(request.parameters[key], field, spec.parameters[key])
        elif key not in STANDARD_PARAMETERS:
            accepted = ", ".join(spec.parameters) or "none"
            raise InvalidArgument(field, f"not a parameter of model {spec.name!r} (accepted: {accepted})")
    if "glossary" in out:
        out["glossary"] = glossary_entries(out["glossary"], "parameters.glossary")
    if "do_not_translate" in out:
        out["do_not_translate"] = phrases(out["do_not_translate"], "parameters.do_not_translate")
    return out


def _json(text: str, field: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise InvalidArgument(field, f"not JSON: {e}") from None


def glossary_entries(text: str, field: str) -> list[GlossaryEntry]:
    """The `glossary` parameter: a JSON object {source: target} or a list of objects with "source",
    "target" and optionally "forms" (a list of strings)."""
    value = _json(text, field)
    if isinstance(value, dict):
        value = [{"source": k, "target": v} for k, v in value.items()]
    if not isinstance(value, list):
        raise InvalidArgument(field, "a JSON object {source: target} or a list of {source, target, forms} objects")
    entries = []
    for i, e in enumerate(value):
        forms = e.get("forms", []) if isinstance(e, dict) else None
        if (
            not isinstance(e, dict)
            or not isinstance(e.get("source"), str)
            or not isinstance(e.get("target"), str)
            or not isinstance(forms, list)
            or not all(isinstance(f, str) for f in forms)
            or set(e) - {"source", "target", "forms"}
        ):
            raise InvalidArgument(
                f"{field}[{i}]", 'an entry is {"source": string, "target": string, "forms": [string]}'
            )
        entries.append(GlossaryEntry(e["source"], e["target"], tuple(forms)))
    return entries


def phrases(text: str, field: str) -> list[str]:
    """The `do_not_translate` parameter: a JSON list of strings."""
    value = _json(text, field)
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        raise InvalidArgument(field, "a JSON list of strings")
    return value


def v2_argument_error(exc: InvalidArgument, input_index: int) -> InvalidArgument:
    """The engine names mtserve.v1 fields (`texts[1]`, `options.beam_size`); name the v2 ones."""
    f = exc.field
    problem = exc.message[len(f) + 2 :] if exc.message.startswith(f + ": ") else exc.message
    if f == "texts":
        return InvalidArgument(f"inputs[{input_index}]", f"{INPUT}: {problem}")
    if f.startswith("texts["):
        return InvalidArgument(f"inputs[{input_index}]{f[len('texts') :]}", f"{INPUT}: {problem}")
    if f.startswith("options."):
        return InvalidArgument("parameters." + f[len("options.") :], problem)
    if f in ("source_language", "target_language", "target_prefix"):
        return InvalidArgument("parameters." + f, problem)
    return exc


def v2_not_found(exc: NotFound) -> NotFound:
    """A NOT_FOUND that names an mtserve.v1 option (`options.glossary_id`) names its parameter."""
    text = str(exc)
    return NotFound("parameters." + text[len("options.") :]) if text.startswith("options.") else exc


# -- responses ------------------------------------------------------------------------------


def result_parameters(results: list[TranslationResult], terms: bool, detected: bool) -> dict[str, str]:
    """The response parameters of translations (module doc): "applied_terms" when the request had
    terms, "detected_languages" when it asked for detection; each a JSON list, a text an item."""
    out = {}
    if terms:
        out["applied_terms"] = json.dumps(
            [
                [
                    {
                        "source": t.source,
                        "target": t.target,
                        "source_start": t.source_start,
                        "source_end": t.source_end,
                        "start": t.start,
                        "end": t.end,
                        "origin": t.origin,
                    }
                    for t in r.applied_terms
                ]
                for r in results
            ],
            ensure_ascii=False,
        )
    if detected:
        out["detected_languages"] = json.dumps(
            [[r.detected_language, r.detected_confidence] for r in results], ensure_ascii=False
        )
    return out


def infer_response(
    request: pb.ModelInferRequest,
    spec: ModelSpec,
    version: str,
    output: list[bytes] | np.ndarray,
    parameters: dict[str, str] | None = None,
) -> pb.ModelInferResponse:
    """The response carrying `output` (BYTES elements, or an FP32 array) as the model's output,
    raw when the request's input was raw; `parameters`: string parameters of the response."""
    out = pb.ModelInferResponse(model_name=spec.name, model_version=version, id=request.id)
    for key, value in (parameters or {}).items():
        out.parameters[key].string_param = value
    raw = bool(request.raw_input_contents)
    if isinstance(output, np.ndarray):
        tensor = out.outputs.add(name=spec.output, datatype=spec.output_datatype, shape=list(output.shape))
        if raw:
            out.raw_output_contents.append(output.tobytes())
        else:
            tensor.contents.fp32_contents.extend(output.ravel().tolist())
    else:
        # [N], or [N, 1] for a request that sent [N, 1] (ModelConfig's dims [1] on both sides)
        column = len(request.inputs) == 1 and len(request.inputs[0].shape) == 2
        tensor = out.outputs.add(
            name=spec.output, datatype=spec.output_datatype, shape=[len(output), 1] if column else [len(output)]
        )
        if raw:
            out.raw_output_contents.append(serialize_bytes(output))
        else:
            tensor.contents.bytes_contents.extend(output)
    return out
