"""The Open Inference Protocol (KServe v2) endpoint, with tritonclient as the client: readiness,
metadata, inference on both models (batched, with parameters), the same engine, limits, metrics
and status codes as mtserve.v1, and INVALID_ARGUMENT naming the field for every malformed
request; Triton's ModelConfig, ModelStatistics (numbers checked after known traffic) and
RepositoryIndex, and the Triton protos field for field against tritonclient's own copy. tritonclient runs in a child process (see kserve_calls.py); requests that tritonclient
cannot build (contents instead of raw data, corrupt raw bytes) use the generated stubs here."""

from __future__ import annotations

import multiprocessing
import struct
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from service.api.inference import grpc_service_pb2 as pb
from service.api.inference import grpc_service_pb2_grpc as pb_grpc
from service.api.inference import model_config_pb2 as mc
from service.engine.requests import GlossaryEntry
from service.errors import InvalidArgument
from service.kserve.codec import (
    deserialize_bytes,
    glossary_entries,
    phrases,
    serialize_bytes,
    served_version,
    v2_argument_error,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the child process imports kserve_calls by name
import kserve_calls  # imports no tritonclient here

SENTENCES = ["Ein Hund rennt durch den Schnee.", "Zwei Männer sitzen auf einer Bank.", "Ein Kind lacht."]


@pytest.fixture(scope="module")
def triton():
    """Runs kserve_calls functions in a child process: triton(fn, *args, **kw)."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield lambda fn, *a, **kw: pool.submit(fn, *a, **kw).result(timeout=120)


@pytest.fixture(scope="module")
def server(make_server):
    return make_server(max_texts_per_request=4)


@pytest.fixture(scope="module")
def names(server):
    name = server.server.engine.manifest.name
    return name, f"{name}-encoder"


def text_input(*texts: str, **kw) -> list[dict]:
    return [{"name": "TEXT", "datatype": "BYTES", "data": [t.encode() for t in texts], **kw}]


def counter(metric, **labels) -> float:
    return sum(
        s.value
        for s in metric.collect()[0].samples
        if s.name.endswith("_total") and all(s.labels.get(k) == v for k, v in labels.items())
    )


# ----------------------------------------------------------------------------- health and metadata


def test_liveness_readiness_and_metadata(server, triton, names):
    translator, encoder = names
    manifest = server.server.engine.manifest
    version = served_version(manifest)
    d_model = manifest.dims.d_model
    s = triton(kserve_calls.state, server.address, [translator, encoder, "no-such-model"], manifest.version)
    assert s["live"] is True and s["ready"] is True
    assert s["server"]["name"] == "mtserve"
    assert {"parameters", "model_configuration", "statistics"} <= set(s["server"]["extensions"])
    assert s["model_ready"] == {translator: True, encoder: True, "no-such-model": False}
    assert not any(s["model_ready_wrong_version"].values())
    # Versions are the repository's numbers: the export's own version string names none of them.
    assert not any(s["model_ready_other_version"].values())

    meta = s["metadata"][translator]
    assert meta["name"] == translator and meta["versions"] == [version]
    # The batch axis, then ModelConfig's dims (Triton's rule; perf_analyzer shapes its requests by it).
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert meta["outputs"] == [{"name": "TRANSLATION", "datatype": "BYTES", "shape": ["-1", "1"]}]
    meta = s["metadata"][encoder]
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": ["-1", "1"]}]
    assert meta["outputs"] == [{"name": "EMBEDDING", "datatype": "FP32", "shape": ["-1", str(d_model)]}]
    code, details = s["metadata"]["no-such-model"]["error"]
    assert code == "NOT_FOUND" and details.startswith("name:") and translator in details


def test_reflection_lists_the_inference_service(server):
    with grpc.insecure_channel(server.address) as ch:
        db = ProtoReflectionDescriptorDatabase(ch)
        assert "inference.GRPCInferenceService" in set(db.get_services())
        assert db.FindFileContainingSymbol("inference.GRPCInferenceService").package == "inference"


# ----------------------------------------------------------------------------- inference


def test_translate_batch_matches_the_v1_api(server, triton, names):
    translator, _ = names
    with server.client(timeout=60) as c:
        expected = [t.text for t in c.translate(SENTENCES, beam_size=1)]
        beam2 = [t.text for t in c.translate(SENTENCES, beam_size=2)]
        capped = c.translate(SENTENCES[:1], beam_size=1, max_output_tokens=3)[0]
        short = c.translate(SENTENCES[:1], beam_size=3, length_penalty=0.0)[0]
    r = triton(kserve_calls.infer, server.address, translator, text_input(*SENTENCES), parameters={"beam_size": 1})
    assert r["model_name"] == translator and r["model_version"] == served_version(server.server.engine.manifest)
    assert r["id"] == "req-1" and r["raw"] == 1  # tritonclient sent raw data: raw data came back
    datatype, shape, data = r["outputs"]["TRANSLATION"]
    assert datatype == "BYTES" and shape == [3] and data.shape == (3,)
    assert [b.decode() for b in data] == expected

    r = triton(
        kserve_calls.infer,
        server.address,
        translator,
        text_input(*SENTENCES),
        outputs=["TRANSLATION"],
        parameters={"beam_size": 2},
    )
    assert [b.decode() for b in r["outputs"]["TRANSLATION"][2]] == beam2

    r = triton(
        kserve_calls.infer,
        server.address,
        translator,
        text_input(SENTENCES[0]),
        parameters={"beam_size": 1, "max_output_tokens": 3},
    )
    assert r["outputs"]["TRANSLATION"][2][0].decode() == capped.text
    assert capped.output_tokens <= 3

    r = triton(
        kserve_calls.infer,
        server.address,
        translator,
        text_input(SENTENCES[0]),
        parameters={"beam_size": 3, "length_penalty": 0.0},
    )
    assert r["outputs"]["TRANSLATION"][2][0].decode() == short.text


def test_encoder_returns_the_pooled_embedding(server, triton, names):
    _, encoder = names
    d_model = server.server.engine.manifest.dims.d_model
    with server.client(timeout=60) as c:
        expected = np.stack([e["pooled"] for e in c.encode(SENTENCES[:2])])
    r = triton(kserve_calls.infer, server.address, encoder, text_input(*SENTENCES[:2]))
    datatype, shape, data = r["outputs"]["EMBEDDING"]
    assert datatype == "FP32" and shape == [2, d_model] and data.dtype == np.float32
    np.testing.assert_allclose(data, expected, atol=1e-5)


def infer_stub(server, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
    with grpc.insecure_channel(server.address) as ch:
        return pb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(request, timeout=60)


def stub_code(server, request) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        infer_stub(server, request)
    return e.value.code(), e.value.details()


def test_contents_in_contents_out(server, names):
    translator, encoder = names
    d_model = server.server.engine.manifest.dims.d_model
    with server.client(timeout=60) as c:
        expected = [t.text for t in c.translate(SENTENCES[:2], beam_size=1)]
    req = pb.ModelInferRequest(model_name=translator, parameters={"beam_size": pb.InferParameter(int64_param=1)})
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [s.encode() for s in SENTENCES[:2]]
    )
    resp = infer_stub(server, req)
    assert not resp.raw_output_contents
    (out,) = resp.outputs
    assert out.name == "TRANSLATION" and list(out.shape) == [2]
    assert [b.decode() for b in out.contents.bytes_contents] == expected

    req = pb.ModelInferRequest(model_name=encoder)
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(SENTENCES[0].encode())
    (out,) = infer_stub(server, req).outputs
    assert out.datatype == "FP32" and list(out.shape) == [1, d_model] and len(out.contents.fp32_contents) == d_model


def test_requests_share_the_scheduler_and_are_counted(server, triton, names):
    translator, _ = names
    m = server.server.metrics
    ok_before = counter(m.requests, method="ModelInfer", code="OK")
    bad_before = counter(m.requests, method="ModelInfer", code="INVALID_ARGUMENT")
    sentences_before = counter(m.sentences, outcome="ok")
    triton(kserve_calls.infer, server.address, translator, text_input(*SENTENCES), parameters={"beam_size": 1})
    triton(kserve_calls.infer, server.address, translator, text_input(""))
    assert counter(m.requests, method="ModelInfer", code="OK") == ok_before + 1
    assert counter(m.requests, method="ModelInfer", code="INVALID_ARGUMENT") == bad_before + 1
    assert counter(m.sentences, outcome="ok") == sentences_before + len(SENTENCES)


def test_not_ready_and_unavailable_while_draining(make_server, triton, names):
    translator, _ = names
    srv = make_server()
    # The first two steps of Server.drain(): NOT_SERVING, then refuse new work.
    srv.call(srv.server._set_health(health_pb2.HealthCheckResponse.NOT_SERVING))
    srv.server.scheduler.stop_accepting()
    s = triton(kserve_calls.state, srv.address, [translator])
    assert s["live"] is True and s["ready"] is False and s["model_ready"] == {translator: False}
    r = triton(kserve_calls.infer, srv.address, translator, text_input(SENTENCES[0]))
    assert r["error"][0] == "UNAVAILABLE"


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "case, kwargs, code, field",
    [
        ("unknown model", dict(model="no-such-model"), "NOT_FOUND", "model_name"),
        ("unknown version", dict(version="9"), "NOT_FOUND", "model_version"),
        ("malformed version", dict(version="no-such-version"), "INVALID_ARGUMENT", "model_version"),
        ("negative version", dict(version="-1"), "INVALID_ARGUMENT", "model_version"),
        ("version with a leading zero", dict(version="01"), "INVALID_ARGUMENT", "model_version"),
        ("fullwidth version", dict(version="\uff11"), "INVALID_ARGUMENT", "model_version"),
        (
            "input name",
            dict(inputs=[{"name": "SOURCE", "datatype": "BYTES", "data": [b"Hallo"]}]),
            "INVALID_ARGUMENT",
            "inputs[0].name",
        ),
        ("two inputs", dict(inputs=text_input("Hallo") * 2), "INVALID_ARGUMENT", "inputs"),
        (
            "datatype",
            dict(inputs=[{"name": "TEXT", "datatype": "FP32", "data": [1.0]}]),
            "INVALID_ARGUMENT",
            "inputs[0].datatype",
        ),
        (
            "rank",
            dict(inputs=[{"name": "TEXT", "datatype": "BYTES", "data": [[b"Hallo", b"Welt"]]}]),
            "INVALID_ARGUMENT",
            "inputs[0].shape",
        ),
        ("shape vs data", dict(inputs=text_input("Hallo", "Welt"), reshape=[3]), "INVALID_ARGUMENT", "inputs[0].shape"),
        ("output name", dict(outputs=["EMBEDDING"]), "INVALID_ARGUMENT", "outputs[0].name"),
        ("unknown parameter", dict(parameters={"beam": 2}), "INVALID_ARGUMENT", "parameters.beam"),
        ("parameter type", dict(parameters={"beam_size": "2"}), "INVALID_ARGUMENT", "parameters.beam_size"),
        ("beam range", dict(parameters={"beam_size": 99}), "INVALID_ARGUMENT", "parameters.beam_size"),
        (
            "output cap",
            dict(parameters={"max_output_tokens": 10**6}),
            "INVALID_ARGUMENT",
            "parameters.max_output_tokens",
        ),
        ("empty text", dict(inputs=text_input("Hallo", " ")), "INVALID_ARGUMENT", "inputs[0][1]"),
        ("too many texts", dict(inputs=text_input(*["Hallo"] * 5)), "INVALID_ARGUMENT", "inputs[0]"),
        (  # split "none": one row, refused past max_input_tokens (split into sentences, it is translated)
            "too long",
            dict(inputs=text_input("Hund " * 300), parameters={"split": "none"}),
            "INVALID_ARGUMENT",
            "inputs[0][0]",
        ),
    ],
)
def test_invalid_requests_name_the_field(server, triton, names, case, kwargs, code, field):
    translator, _ = names
    kwargs = {"model": translator, "inputs": text_input("Hallo"), **kwargs}
    r = triton(kserve_calls.infer, server.address, kwargs.pop("model"), kwargs.pop("inputs"), **kwargs)
    assert r["error"][0] == code, r
    assert r["error"][1].startswith(field + ":"), r


def test_encoder_takes_no_translation_parameters(server, triton, names):
    _, encoder = names
    r = triton(kserve_calls.infer, server.address, encoder, text_input("Hallo"), parameters={"beam_size": 2})
    assert r["error"][0] == "INVALID_ARGUMENT" and r["error"][1].startswith("parameters.beam_size:")


def test_malformed_raw_and_contents(server, names):
    translator, _ = names

    def request(raw: bytes | None = None, contents: list[bytes] | None = None, shape=(1,)):
        req = pb.ModelInferRequest(model_name=translator)
        t = req.inputs.add(name="TEXT", datatype="BYTES", shape=list(shape))
        if contents is not None:
            t.contents.bytes_contents.extend(contents)
        if raw is not None:
            req.raw_input_contents.append(raw)
        return req

    ok = struct.pack("<I", 5) + b"Hallo"
    code, details = stub_code(server, request(raw=ok[:-2]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("raw_input_contents[0]:")
    code, details = stub_code(server, request(raw=ok + b"\x01"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("raw_input_contents[0]:")
    code, details = stub_code(server, request(raw=ok, contents=[b"Hallo"]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs[0].contents:")
    bad_utf8 = request(contents=[b"Hallo \xff"])
    code, details = stub_code(server, bad_utf8)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs[0][0]:")
    wrong_contents = request()
    wrong_contents.inputs[0].contents.fp32_contents.append(1.0)
    code, details = stub_code(server, wrong_contents)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("inputs[0].contents:")
    extra_raw = request(raw=ok)
    extra_raw.raw_input_contents.append(ok)
    code, details = stub_code(server, extra_raw)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("raw_input_contents:")
    # and the good raw request works, answering raw
    resp = infer_stub(server, request(raw=ok))
    assert len(resp.raw_output_contents) == 1 and not resp.outputs[0].HasField("contents")
    (n,) = struct.unpack_from("<I", resp.raw_output_contents[0])
    assert n == len(resp.raw_output_contents[0]) - 4 > 0


# ----------------------------------------------------------------------------- the codec alone


def test_bytes_codec_round_trip_and_its_errors():
    items = [b"Hallo", b"", "Grüße".encode(), b"\x00\xff"]
    raw = serialize_bytes(items)
    assert raw[:9] == struct.pack("<I", 5) + b"Hallo"
    assert deserialize_bytes(raw, "f") == items
    assert deserialize_bytes(b"", "f") == []
    with pytest.raises(InvalidArgument, match=r"^f: truncated BYTES data: 2 bytes left .* \(element 1\)$"):
        deserialize_bytes(serialize_bytes([b"a"]) + b"\x01\x00", "f")
    with pytest.raises(InvalidArgument, match=r"^f: BYTES element 0 says 5 bytes but only 3 remain$"):
        deserialize_bytes(struct.pack("<I", 5) + b"abc", "f")


def test_engine_fields_are_renamed_to_v2_fields():
    def renamed(field: str, problem: str = "bad") -> str:
        return v2_argument_error(InvalidArgument(field, problem), 0).message

    assert renamed("texts", "at least one text is required") == "inputs[0]: TEXT: at least one text is required"
    assert renamed("texts[2]", "text is empty") == "inputs[0][2]: TEXT: text is empty"
    assert renamed("options.beam_size") == "parameters.beam_size: bad"
    assert renamed("id") == "id: bad"


def test_served_version_is_a_number_for_triton_tools():
    class M:
        version = "1ce36e49c1ac"

    assert served_version(M()) == "1"  # a hash: perf_analyzer parses versions with std::stoll
    M.version = "7"
    assert served_version(M()) == "7"
    M.version = "0"
    assert served_version(M()) == "1"


def test_column_shaped_text_input(server, names):
    """ModelConfig describes each text as dims [1]: [N, 1] is accepted and answered [N, 1]."""
    translator, _ = names
    req = pb.ModelInferRequest(model_name=translator, parameters={"beam_size": pb.InferParameter(int64_param=1)})
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[2, 1]).contents.bytes_contents.extend(
        [s.encode() for s in SENTENCES[:2]]
    )
    (out,) = infer_stub(server, req).outputs
    assert list(out.shape) == [2, 1] and len(out.contents.bytes_contents) == 2


# ----------------------------------------------------------------------------- Triton extensions


def test_triton_protos_match_tritonclients_copy_field_for_field(triton):
    """Every message and enum of protos/inference (Triton's, or the part of them mtserve uses)
    has the name, field numbers, types and enum values of tritonclient's own generated code, so
    Triton's tools parse mtserve's answers."""
    theirs = triton(kserve_calls.descriptors)
    ours = kserve_calls.describe([pb.DESCRIPTOR, mc.DESCRIPTOR])
    assert len(ours["messages"]) >= 50
    for name, fields in ours["messages"].items():
        assert name in theirs["messages"], name
        for field, spec in fields.items():
            assert theirs["messages"][name].get(field) == spec, (name, field)
    for name, values in ours["enums"].items():
        assert name in theirs["enums"], name
        assert values.items() <= theirs["enums"][name].items(), name
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert {"ModelConfig", "ModelStatistics", "RepositoryIndex"} <= set(service.methods_by_name)


def test_model_config(server, triton, names):
    translator, encoder = names
    manifest, st = server.server.engine.manifest, server.server.settings
    config = triton(kserve_calls.call, server.address, "get_model_config", translator)["config"]
    assert config["name"] == translator and config["platform"] == "onnxruntime_onnx"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == st.max_texts_per_request == 4
    assert config["input"] == [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": ["1"], "reshape": {}}]
    assert config["output"] == [{"name": "TRANSLATION", "data_type": "TYPE_STRING", "dims": ["1"], "reshape": {}}]
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == str(round(st.max_queue_delay_ms * 1000)) == "2000"
    assert batching["default_queue_policy"]["max_queue_size"] == st.max_queue_size
    assert config["instance_group"] == [{"name": f"{translator}_0", "kind": "KIND_CPU", "count": st.decode_workers}]
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["model_version"] == manifest.version
    assert params["continuous_batching"] == "true" and params["max_batch_sentences"] == str(st.max_batch_sentences)
    assert params["default_beam_size"] == str(st.default_beam_size)

    config = triton(kserve_calls.call, server.address, "get_model_config", encoder)["config"]
    assert config["output"] == [{"name": "EMBEDDING", "data_type": "TYPE_FP32", "dims": [str(manifest.dims.d_model)]}]
    assert "default_beam_size" not in config["parameters"]

    code, details = triton(kserve_calls.call, server.address, "get_model_config", "no-such-model")["error"]
    assert code == "NOT_FOUND" and details.startswith("name:")
    code, details = triton(kserve_calls.call, server.address, "get_model_config", translator, "2")["error"]
    assert code == "NOT_FOUND" and details.startswith("version:")


def stats_by_model(triton, address: str, *args) -> dict:
    out = triton(kserve_calls.call, address, "get_inference_statistics", *args)
    return {s["name"]: s for s in out["model_stats"]}


def count(stat: dict, key: str) -> int:
    return int(stat["inference_stats"][key].get("count", 0))


def ns(stat: dict, key: str) -> int:
    return int(stat["inference_stats"][key].get("ns", 0))


def test_statistics_after_known_traffic(make_server, triton, names):
    """ModelStatistics counts every API's requests per model, from the same Prometheus metrics a
    scrape reads; the phases of each request add up to its duration."""
    translator, encoder = names
    srv = make_server(max_texts_per_request=4)
    version = served_version(srv.server.engine.manifest)
    before = stats_by_model(triton, srv.address)
    assert set(before) == {translator, encoder} and {s["version"] for s in before.values()} == {version}

    t0 = time.time()
    r = triton(kserve_calls.infer, srv.address, translator, text_input(*SENTENCES), parameters={"beam_size": 1})
    assert r["outputs"]["TRANSLATION"][1] == [3]
    with srv.client(timeout=60) as c:
        c.translate(SENTENCES[:2], beam_size=1)
        assert list(c.translate_stream(SENTENCES[0], beam_size=1))[-1].final.text
        c.encode(SENTENCES[:2])
        with pytest.raises(grpc.RpcError):
            c.translate(["Ein Hund.", "\u200b\ufeff"])  # nothing to translate: a failed request
    r = triton(kserve_calls.infer, srv.address, encoder, text_input(SENTENCES[1]))
    assert r["outputs"]["EMBEDDING"][1][0] == 1
    after = stats_by_model(triton, srv.address)

    def delta(model, key, f=count):
        return f(after[model], key) - f(before[model], key)

    # de-en: a ModelInfer of 3 texts, a Translate of 2, a TranslateStream of 1; one failure
    assert delta(translator, "success") == 3 and delta(translator, "fail") == 1
    assert int(after[translator]["inference_count"]) - int(before[translator].get("inference_count", 0)) == 6
    for phase in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert delta(translator, phase) == 3, phase
    assert delta(translator, "compute_infer", ns) > 0 and delta(translator, "fail", ns) > 0
    phases = sum(delta(translator, p, ns) for p in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert abs(phases - delta(translator, "success", ns)) <= 1000 * 3  # rounding: under 1 us each
    assert int(after[translator]["execution_count"]) > int(before[translator].get("execution_count", 0))
    assert t0 * 1000 - 1000 <= int(after[translator]["last_inference"]) <= time.time() * 1000 + 1000
    # de-en-encoder: an Encode of 2 texts and a ModelInfer of 1
    assert delta(encoder, "success") == 2 and delta(encoder, "fail") == 0
    assert int(after[encoder]["inference_count"]) - int(before[encoder].get("inference_count", 0)) == 3

    # The same numbers as the Prometheus metrics (one measurement, read two ways).
    m = srv.server.metrics
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in m.registry.collect() for s in fam.samples}
    labels = (("model", translator),)
    key = ("mtserve_inference_request_duration_seconds_count", (*labels, ("outcome", "success"), ("version", version)))
    assert samples[key] == count(after[translator], "success")
    key = ("mtserve_inference_phase_duration_seconds_sum", (*labels, ("phase", "queue"), ("version", version)))
    assert round(samples[key] * 1e9) == ns(after[translator], "queue")

    # One model, by name and version; unknown ones are NOT_FOUND.
    one = stats_by_model(triton, srv.address, translator, version)
    assert list(one) == [translator] and count(one[translator], "success") == count(after[translator], "success")
    assert list(stats_by_model(triton, srv.address, encoder, version)) == [encoder]
    code, details = triton(kserve_calls.call, srv.address, "get_inference_statistics", "no-such-model")["error"]
    assert code == "NOT_FOUND" and details.startswith("name:")
    code, details = triton(kserve_calls.call, srv.address, "get_inference_statistics", "", "9")["error"]
    assert code == "NOT_FOUND" and details.startswith("version:")


def test_repository_index(server, triton, names):
    version = served_version(server.server.engine.manifest)
    index = triton(kserve_calls.call, server.address, "get_model_repository_index")
    assert sorted((m["name"], m["version"], m["state"]) for m in index["models"]) == sorted(
        (n, version, "READY") for n in names
    )


def test_parameters_are_quoted_at_64_characters_and_encode_names_its_own_fields(server, names):
    """A 1 MB `split` parameter is quoted as the others are (64 characters and its length; it was
    ~1,000), and the encoder model's NOT_FOUND for a language names parameters.source_language
    only (it takes no target_language)."""
    translator, encoder = names
    req = pb.ModelInferRequest(model_name=translator)
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hallo")
    req.parameters["split"].string_param = "x" * 1_000_000
    code, details = stub_code(server, req)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("parameters.split: 'xxxx"), details
    assert "(1000000 chars)" in details and len(details) < 200, details
    req = pb.ModelInferRequest(model_name=encoder)
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"Hallo")
    req.parameters["source_language"].string_param = "fr"
    code, details = stub_code(server, req)
    assert code == grpc.StatusCode.NOT_FOUND and details.startswith("parameters.source_language: "), details
    assert "target_language" not in details


def test_glossary_and_phrase_parameters_parse_or_name_the_entry():
    assert glossary_entries('{"Hund": "canine"}', "parameters.glossary") == [GlossaryEntry("Hund", "canine")]
    assert glossary_entries(
        '[{"source": "Hund", "target": "canine", "forms": ["Hunde", "Hundes"]}]', "parameters.glossary"
    ) == [GlossaryEntry("Hund", "canine", ("Hunde", "Hundes"))]
    assert phrases('["ACME Cloud", "Bank"]', "parameters.do_not_translate") == ["ACME Cloud", "Bank"]
    for bad, field in [
        ("{", "parameters.glossary"),
        ('"Hund"', "parameters.glossary"),
        ('[{"source": "Hund"}]', "parameters.glossary[0]"),
        ('[{"source": "a", "target": "b"}, {"source": 1, "target": "b"}]', "parameters.glossary[1]"),
        ('[{"source": "a", "target": "b", "forms": "x"}]', "parameters.glossary[0]"),
        ('[{"source": "a", "target": "b", "extra": 1}]', "parameters.glossary[0]"),
    ]:
        with pytest.raises(InvalidArgument) as e:
            glossary_entries(bad, "parameters.glossary")
        assert e.value.field == field, bad
    for bad in ["[1]", '{"a": "b"}', "nope"]:
        with pytest.raises(InvalidArgument) as e:
            phrases(bad, "parameters.do_not_translate")
        assert e.value.field == "parameters.do_not_translate"
