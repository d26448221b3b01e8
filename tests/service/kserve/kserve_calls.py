"""The client side of tests/service/kserve/test_kserve.py: calls made with tritonclient, run in a child
process. tritonclient registers its own copy of the standard `inference` protos in protobuf's
global descriptor pool, which refuses a second file defining the same symbols; the server's
generated code (service.api.inference) lives in the test process, so tritonclient must not:
this module imports it only inside its functions, which run in the child.

Every function takes plain values and returns plain values (errors as {"error": (code, text)}),
so that they cross the process boundary."""

from __future__ import annotations

import numpy as np


def _error(e) -> dict:
    return {"error": (str(e.status()).rsplit(".", 1)[-1], e.message())}


def state(address: str, models: list[str], other_version: str = "") -> dict:
    """Liveness, readiness and metadata, as tritonclient reports them (`other_version`: readiness
    under that version name too)."""
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    with tc.InferenceServerClient(address) as c:
        out = {
            "live": c.is_server_live(),
            "ready": c.is_server_ready(),
            "server": c.get_server_metadata(as_json=True),
            "model_ready": {m: c.is_model_ready(m) for m in models},
            "model_ready_wrong_version": {m: c.is_model_ready(m, "no-such-version") for m in models},
            "model_ready_other_version": {m: c.is_model_ready(m, other_version) for m in models},
            "metadata": {},
        }
        for m in models:
            try:
                out["metadata"][m] = c.get_model_metadata(m, as_json=True)
            except InferenceServerException as e:
                out["metadata"][m] = _error(e)
        return out


def infer(
    address: str,
    model: str,
    inputs: list[dict],
    outputs: list[str] | None = None,
    parameters: dict | None = None,
    version: str = "",
    reshape: list[int] | None = None,
) -> dict:
    """One ModelInfer. Each input: {"name", "datatype", "data": array-like[, "shape"]}; `reshape`
    overrides the first input's declared shape after its data was set (a shape/data mismatch
    that tritonclient itself would refuse to build)."""
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException, triton_to_np_dtype

    tensors = []
    for spec in inputs:
        data = np.asarray(spec["data"], dtype=triton_to_np_dtype(spec["datatype"]))
        t = tc.InferInput(spec["name"], list(spec.get("shape", data.shape)), spec["datatype"])
        t.set_data_from_numpy(data)
        tensors.append(t)
    if reshape is not None:
        tensors[0].set_shape(reshape)
    requested = [tc.InferRequestedOutput(o) for o in outputs] if outputs else None
    with tc.InferenceServerClient(address) as c:
        try:
            result = c.infer(
                model,
                tensors,
                model_version=version,
                outputs=requested,
                parameters=parameters,
                request_id="req-1",
                client_timeout=60,
            )
        except InferenceServerException as e:
            return _error(e)
        response = result.get_response()
        return {
            "model_name": response.model_name,
            "model_version": response.model_version,
            "id": response.id,
            "raw": len(response.raw_output_contents),
            "outputs": {o.name: (o.datatype, list(o.shape), result.as_numpy(o.name)) for o in response.outputs},
        }


def call(address: str, method: str, *args, **kw) -> dict:
    """One tritonclient call answered as JSON (`get_model_config`, `get_inference_statistics`,
    `get_model_repository_index`, ...), or {"error": (code, text)}."""
    import tritonclient.grpc as tc
    from tritonclient.utils import InferenceServerException

    with tc.InferenceServerClient(address) as c:
        try:
            return getattr(c, method)(*args, as_json=True, **kw)
        except InferenceServerException as e:
            return _error(e)


def descriptors() -> dict:
    """Every message of tritonclient's copy of Triton's protos: {full name: {field: [number, type,
    repeated, message type, enum type]}}, and every enum: {full name: {value name: number}}."""
    from tritonclient.grpc import model_config_pb2, service_pb2

    return describe([service_pb2.DESCRIPTOR, model_config_pb2.DESCRIPTOR])


def describe(files) -> dict:
    """The messages and enums of protobuf file descriptors, as plain values (see descriptors)."""
    messages: dict = {}
    enums: dict = {}

    def walk(d) -> None:
        messages[d.full_name] = {
            f.name: [
                f.number,
                f.type,
                f.is_repeated,
                f.message_type.full_name if f.message_type else None,
                f.enum_type.full_name if f.enum_type else None,
            ]
            for f in d.fields
        }
        for e in d.enum_types:
            enums[e.full_name] = {v.name: v.number for v in e.values}
        for n in d.nested_types:
            walk(n)

    for f in files:
        for d in f.message_types_by_name.values():
            walk(d)
        for e in f.enum_types_by_name.values():
            enums[e.full_name] = {v.name: v.number for v in e.values}
    return {"messages": messages, "enums": enums}
