"""Several models from one model repository (Triton's layout, NAME/VERSION/), over a real gRPC
server on loopback with real ONNX Runtime sessions: routing by name and version on mtserve.v1
and KServe v2 (the default model, the default version, NOT_FOUND and INVALID_ARGUMENT naming the
field), GetModelInfo's list of served versions, per-model metrics, KServe's repository extension
(RepositoryIndex, RepositoryModelLoad/Unload with their parameters, repository_control, bearer
tokens, tritonclient's own calls), a load and an unload under load with no request failing,
the model lifecycle (the default model never moves to another one, Health follows what is loaded,
a load cut short by its deadline completes and gives its memory back on unload), start-up errors
of the repository settings, and the command-line client's --model.

The repository is the tiny test model three times: tiny-a versions 1 and 2 and tiny-b version 1
are links to the same model directory, so they translate alike and differ only in where a
request is routed, which TranslateResponse.model, EncodeResponse.model and the metrics' labels
report."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.client import pb
from service.errors import ModelLoadError
from service.repository import loader as loader_module
from service.settings import Settings

TEXT = "Ein Hund rennt durch den Schnee."
TOKEN = "repository-token-0123456789abcdef"
BEARER = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture(scope="module")
def repository(tmp_path_factory, tiny_onnx_dir) -> Path:
    """tiny-a/1, tiny-a/2 and tiny-b/1, each a link to the tiny model directory; and entries that
    Triton's layout ignores (a file, a non-numeric version, a version 0, a hidden directory)."""
    repo = tmp_path_factory.mktemp("repository")
    model_dir = tiny_onnx_dir.parent
    for name, version in (("tiny-a", "1"), ("tiny-a", "2"), ("tiny-b", "1")):
        (repo / name).mkdir(exist_ok=True)
        (repo / name / version).symlink_to(model_dir, target_is_directory=True)
    (repo / "tiny-a" / "config.pbtxt").write_text("# not read\n")
    (repo / "tiny-a" / "latest").symlink_to(model_dir, target_is_directory=True)
    (repo / "tiny-a" / "0").symlink_to(model_dir, target_is_directory=True)
    (repo / ".hidden" / "1").mkdir(parents=True)
    return repo


def serve(make_server, repository: Path, **settings):
    return make_server(model_dir=None, onnx_dir=None, model_repository=repository, **settings)


@pytest.fixture(scope="module")
def server(make_server, repository):
    """tiny-a version 1 and tiny-b (its latest, 1), as MTSERVE_MODELS="tiny-a:1,tiny-b" loads them."""
    return serve(make_server, repository, models="tiny-a:1,tiny-b", max_texts_per_request=4)


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=30) as c:
        yield c


@pytest.fixture(scope="module")
def kserve(server):
    with grpc.insecure_channel(server.address) as ch:
        yield kpb_grpc.GRPCInferenceServiceStub(ch)


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def infer_request(model: str, version: str = "", texts=(TEXT,)) -> kpb.ModelInferRequest:
    req = kpb.ModelInferRequest(model_name=model, model_version=version)
    tensor = req.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    return req


def load_request(name: str, version=None, default=None, **params) -> kpb.RepositoryModelLoadRequest:
    req = kpb.RepositoryModelLoadRequest(model_name=name)
    if isinstance(version, int):
        req.parameters["version"].int64_param = version
    elif version is not None:
        req.parameters["version"].string_param = version
    if isinstance(default, bool):
        req.parameters["default"].bool_param = default
    elif default is not None:
        req.parameters["default"].string_param = default
    for key, value in params.items():
        req.parameters[key].string_param = value
    return req


def unload_request(name: str, version=None, default=None) -> kpb.RepositoryModelUnloadRequest:
    loaded = load_request(name, version, default)
    return kpb.RepositoryModelUnloadRequest(model_name=name, parameters=loaded.parameters)


def index_of(stub, **kw) -> dict[tuple[str, str], tuple[str, str]]:
    rows = stub.RepositoryIndex(kpb.RepositoryIndexRequest(**kw), timeout=30).models
    return {(m.name, m.version): (m.state, m.reason) for m in rows}


def series(srv, sample: str) -> dict[tuple[str, str], float]:
    """A metric's samples named `sample`, summed by (model, version)."""
    out: dict[tuple[str, str], float] = {}
    for family in srv.server.metrics.registry.collect():
        for s in family.samples:
            if s.name == sample and "model" in s.labels:
                key = (s.labels["model"], s.labels["version"])
                out[key] = out.get(key, 0.0) + s.value
    return out


def eventually(check, timeout: float = 30.0):
    """`check()` once it is truthy (polled), or its last value."""
    end = time.monotonic() + timeout
    while not (value := check()) and time.monotonic() < end:
        time.sleep(0.02)
    return value


# ----------------------------------------------------------------------------- routing


@pytest.mark.parametrize(
    "model, answered",
    [
        ("", "tiny-a:1"),
        ("tiny-a", "tiny-a:1"),
        ("tiny-a:1", "tiny-a:1"),
        ("tiny-b", "tiny-b:1"),
        ("tiny-b:1", "tiny-b:1"),
    ],
)
def test_requests_are_routed_by_name_and_version(client, model, answered):
    r = client.translate_response([TEXT, "Ein Kind lacht."], model=model, beam_size=1)
    assert r.model == answered and len(r.translations) == 2 and all(t.text for t in r.translations)
    # The same sentence alone, unary and streamed (one sentence, one batch shape: the same tokens).
    alone = client.translate([TEXT], model=model, beam_size=1)[0].text
    stream = list(client.translate_stream(TEXT, model=model, beam_size=1))
    assert "".join(m.chunk.text for m in stream[:-1]).strip() == stream[-1].final.text == alone
    encoded = client.stub.Encode(pb.EncodeRequest(texts=[TEXT], model=model), timeout=30)
    assert encoded.model == answered and len(encoded.encodings[0].pooled) > 8
    assert client.encode([TEXT], model=model)[0]["tokens"] == list(encoded.encodings[0].tokens)
    assert client.model_info(model).name == answered.split(":")[0]


def test_translate_many_mixes_models_in_one_stream(client):
    wanted = {
        "a": "tiny-a",
        "b": "tiny-b",
        "a1": "tiny-a:1",
        "default": "",
        "b2": "tiny-b:2",
        "x": "nope",
        "bad": "a:x",
    }
    requests = [
        pb.TranslateManyRequest(
            id=i, request=pb.TranslateRequest(texts=[TEXT], model=m, options=pb.TranslationOptions(beam_size=1))
        )
        for i, m in wanted.items()
    ]
    answers = {r.id: r for r in client.translate_many(requests)}
    assert set(answers) == set(wanted)
    assert {i: answers[i].response.model for i in ("a", "b", "a1", "default")} == {
        "a": "tiny-a:1",
        "b": "tiny-b:1",
        "a1": "tiny-a:1",
        "default": "tiny-a:1",
    }
    assert all(answers[i].response.translations[0].text for i in ("a", "b", "a1", "default"))
    assert {i: answers[i].error.code for i in ("b2", "x", "bad")} == {
        "b2": grpc.StatusCode.NOT_FOUND.value[0],
        "x": grpc.StatusCode.NOT_FOUND.value[0],
        "bad": grpc.StatusCode.INVALID_ARGUMENT.value[0],
    }
    assert answers["x"].error.message.startswith("request.model: unknown model 'nope' (served: tiny-a, tiny-b)")
    assert answers["b2"].error.message.startswith("request.model: model 'tiny-b' has no version '2' loaded")
    assert answers["bad"].error.message.startswith("request.model: ")
    # The client's helper passes the model to every item.
    assert client.translate_all([TEXT, "Ein Kind lacht."], model="tiny-b", beam_size=1)[1].text


@pytest.mark.parametrize(
    "model, code, message",
    [
        ("nope", grpc.StatusCode.NOT_FOUND, "model: unknown model 'nope' (served: tiny-a, tiny-b)"),
        ("nope:1", grpc.StatusCode.NOT_FOUND, "model: unknown model 'nope' (served: tiny-a, tiny-b)"),
        ("tiny-a:2", grpc.StatusCode.NOT_FOUND, "model: model 'tiny-a' has no version '2' loaded (loaded: 1)"),
        ("tiny-a-encoder", grpc.StatusCode.NOT_FOUND, "model: unknown model 'tiny-a-encoder'"),
        ("a:x", grpc.StatusCode.INVALID_ARGUMENT, "model: version 'x' of 'a:x' is not a positive integer"),
        ("tiny-a:0", grpc.StatusCode.INVALID_ARGUMENT, "model: version '0'"),
        (":1", grpc.StatusCode.INVALID_ARGUMENT, "model: ':1' has no model name"),
        ("tiny-a:", grpc.StatusCode.INVALID_ARGUMENT, "model: version '' of 'tiny-a:' is not a positive integer"),
        ("tiny-a:01", grpc.StatusCode.INVALID_ARGUMENT, "model: version '01' of 'tiny-a:01'"),
        ("tiny-a:\uff11", grpc.StatusCode.INVALID_ARGUMENT, "model: version '\uff11' of 'tiny-a:\uff11'"),
        ("tiny a", grpc.StatusCode.INVALID_ARGUMENT, "model: 'tiny a' is not a model name"),
        ("a" * 100_000, grpc.StatusCode.INVALID_ARGUMENT, "model: '" + "a" * 64 + "…' (100000 chars) is not a"),
    ],
    ids=lambda v: v[:24] if isinstance(v, str) else None,
)
def test_unknown_or_malformed_models_are_refused_naming_the_field(client, model, code, message):
    for call in (
        lambda: client.translate([TEXT], model=model, beam_size=1),
        lambda: list(client.translate_stream(TEXT, model=model, beam_size=1)),
        lambda: client.encode([TEXT], model=model),
        lambda: client.model_info(model),
    ):
        got, details = status_of(call)
        assert got == code and details.startswith(message), details
        assert len(details) <= 1024


def test_kserve_routes_by_model_name_and_version(kserve):
    for name, version, answered in (
        ("tiny-a", "", "1"),
        ("tiny-a", "1", "1"),
        ("tiny-b", "", "1"),
        ("tiny-b-encoder", "1", "1"),
    ):
        r = kserve.ModelInfer(infer_request(name, version), timeout=30)
        assert (r.model_name, r.model_version) == (name, answered)
        assert r.outputs[0].name == ("EMBEDDING" if name.endswith("-encoder") else "TRANSLATION")
    for name, version, code, message in (
        (
            "nope",
            "",
            grpc.StatusCode.NOT_FOUND,
            "model_name: unknown model 'nope' (served: tiny-a, tiny-a-encoder, tiny-b, tiny-b-encoder)",
        ),
        ("tiny-a", "2", grpc.StatusCode.NOT_FOUND, "model_version: model 'tiny-a' has no version '2' (served: 1)"),
        ("tiny-b-encoder", "x", grpc.StatusCode.INVALID_ARGUMENT, "model_version: 'x' is not a positive integer"),
    ):
        got, details = status_of(lambda n=name, v=version: kserve.ModelInfer(infer_request(n, v), timeout=30))
        assert got == code and details.startswith(message), details
    ready = {
        (name, version): kserve.ModelReady(kpb.ModelReadyRequest(name=name, version=version), timeout=30).ready
        for name, version in (("tiny-a", ""), ("tiny-a", "1"), ("tiny-a", "2"), ("tiny-b-encoder", ""), ("nope", ""))
    }
    assert ready == {
        ("tiny-a", ""): True,
        ("tiny-a", "1"): True,
        ("tiny-a", "2"): False,
        ("tiny-b-encoder", ""): True,
        ("nope", ""): False,
    }
    assert kserve.ModelMetadata(kpb.ModelMetadataRequest(name="tiny-a"), timeout=30).versions == ["1"]


@pytest.mark.parametrize("version", ["abc", "-1", "01", "\uff11", "1" + "0" * 18])
def test_kserve_malformed_versions_are_invalid_argument(kserve, version):
    """docs/repository.md: a version is a positive integer in ASCII digits, without a leading zero."""
    code, details = status_of(lambda: kserve.ModelInfer(infer_request("tiny-a", version), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith(f"model_version: {version!r}"), details


def test_repository_index_refuses_a_repository_name(kserve):
    code, details = status_of(
        lambda: kserve.RepositoryIndex(kpb.RepositoryIndexRequest(repository_name="x"), timeout=30)
    )
    assert code == grpc.StatusCode.NOT_FOUND and details.startswith("repository_name: this server has one"), details


def test_model_info_lists_every_served_version(client):
    info = client.model_info()
    assert (info.name, info.version) == ("tiny-a", "1")
    listed = [
        (m.name, m.version, m.source_language, m.target_language, m.default_version, m.default_model)
        for m in info.models
    ]
    assert listed == [("tiny-a", "1", "de", "en", True, True), ("tiny-b", "1", "de", "en", True, False)]
    b = client.model_info("tiny-b")
    assert (b.name, b.version, b.source_language, b.target_language) == ("tiny-b", "1", "de", "en")
    assert b.limits.max_texts_per_request == 4 and b.d_model == info.d_model
    assert list(b.models) == list(info.models)  # the list is the server's, whichever model is asked about


def test_metrics_are_per_model_and_version(server, client):
    def counts():
        return series(server, "mtserve_sentences_total"), series(server, "mtserve_decoder_step_duration_seconds_count")

    sentences, steps = counts()
    client.translate([TEXT, "Ein Kind lacht.", "Zwei Männer."], model="tiny-b", beam_size=1)
    client.translate([TEXT, "Ein Kind lacht."], model="tiny-a:1", beam_size=1)

    def moved():
        now, _ = counts()
        return {k: now.get(k, 0) - sentences.get(k, 0) for k in now if now.get(k, 0) != sentences.get(k, 0)}

    # A sentence is counted just after its answer goes out.
    eventually(lambda: moved() == {("tiny-b", "1"): 3, ("tiny-a", "1"): 2})
    assert moved() == {("tiny-b", "1"): 3, ("tiny-a", "1"): 2}
    _, steps_after = counts()
    for key in (("tiny-a", "1"), ("tiny-b", "1")):
        assert steps_after[key] > steps.get(key, 0)
    assert set(series(server, "mtserve_queue_depth")) == {("tiny-a", "1"), ("tiny-b", "1")}


def test_cli_translates_and_encodes_with_a_model(server, client):
    cli = [sys.executable, "-m", "mtserve"]
    out = subprocess.run(
        [*cli, "translate", "--model", "tiny-b", "--server", server.address, "--beam", "1", TEXT],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == client.translate([TEXT], model="tiny-b", beam_size=1)[0].text
    enc = subprocess.run(
        [*cli, "encode", "--model", "tiny-b:1", "--server", server.address, "Ein Hund."],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(enc.stdout)["tokens"]
    bad = subprocess.run(
        [*cli, "translate", "--model", "nope", "--server", server.address, TEXT], capture_output=True, text=True
    )
    assert bad.returncode != 0 and "NOT_FOUND: model: unknown model 'nope'" in bad.stderr


# ----------------------------------------------------------------------------- the repository extension


def test_repository_index_lists_loaded_and_unloaded_versions(kserve):
    index = index_of(kserve)
    ready, unloaded = ("READY", ""), ("UNAVAILABLE", "unloaded")
    assert index == {
        ("tiny-a", "1"): ready,
        ("tiny-a-encoder", "1"): ready,
        ("tiny-a", "2"): unloaded,
        ("tiny-a-encoder", "2"): unloaded,
        ("tiny-b", "1"): ready,
        ("tiny-b-encoder", "1"): ready,
    }
    assert set(index_of(kserve, ready=True)) == {
        ("tiny-a", "1"),
        ("tiny-a-encoder", "1"),
        ("tiny-b", "1"),
        ("tiny-b-encoder", "1"),
    }


def test_load_switch_default_and_unload(make_server, repository):
    srv = serve(make_server, repository, models="tiny-a:1,tiny-b")
    with grpc.insecure_channel(srv.address) as ch, srv.client(timeout=30) as c:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        k.RepositoryModelLoad(load_request("tiny-a", 2), timeout=120)
        assert index_of(k)[("tiny-a", "2")] == ("READY", "")
        assert c.translate_response([TEXT], model="tiny-a:2", beam_size=1).model == "tiny-a:2"
        assert c.translate_response([TEXT], model="tiny-a", beam_size=1).model == "tiny-a:1"  # still the default
        assert k.ModelInfer(infer_request("tiny-a", "2"), timeout=30).model_version == "2"
        assert k.ModelMetadata(kpb.ModelMetadataRequest(name="tiny-a"), timeout=30).versions == ["1", "2"]
        # Loading a loaded version again only makes it the default.
        k.RepositoryModelLoad(load_request("tiny-a", "2", default=True), timeout=120)
        assert c.translate_response([TEXT], model="tiny-a", beam_size=1).model == "tiny-a:2"
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-a:2"  # the default model's default version
        assert k.ModelInfer(infer_request("tiny-a"), timeout=30).model_version == "2"
        assert [(m.name, m.version, m.default_version) for m in c.model_info().models] == [
            ("tiny-a", "2", True),  # the default model's default version first
            ("tiny-a", "1", False),
            ("tiny-b", "1", True),
        ]
        assert set(series(srv, "mtserve_queue_depth")) == {("tiny-a", "1"), ("tiny-a", "2"), ("tiny-b", "1")}
        k.RepositoryModelUnload(unload_request("tiny-a", "1"), timeout=120)
        assert index_of(k)[("tiny-a", "1")] == ("UNAVAILABLE", "unloaded")
        code, details = status_of(lambda: c.translate([TEXT], model="tiny-a:1", beam_size=1))
        assert code == grpc.StatusCode.NOT_FOUND and "loaded: 2" in details
        # An unloaded version's series are gone (its gauges would otherwise keep their last values).
        assert set(series(srv, "mtserve_queue_depth")) == {("tiny-a", "2"), ("tiny-b", "1")}
        assert ("tiny-a", "1") not in series(srv, "mtserve_sentences_total")

        # Load without a version: the latest on disk; unload without one: every version of the name.
        k.RepositoryModelUnload(unload_request("tiny-b"), timeout=120)
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-a:2"
        code, details = status_of(lambda: c.translate([TEXT], model="tiny-b", beam_size=1))
        assert code == grpc.StatusCode.NOT_FOUND and details.startswith(
            "model: unknown model 'tiny-b' (served: tiny-a)"
        )
        k.RepositoryModelLoad(load_request("tiny-b"), timeout=120)
        assert c.translate_response([TEXT], model="tiny-b", beam_size=1).model == "tiny-b:1"

        for call, code, message in (
            (
                lambda: k.RepositoryModelLoad(load_request("nope"), timeout=30),
                grpc.StatusCode.NOT_FOUND,
                "model_name: 'nope' is not in the repository (found: tiny-a, tiny-b)",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request("tiny-a", 9), timeout=30),
                grpc.StatusCode.NOT_FOUND,
                "model_name: 'tiny-a' has no version '9' in the repository (found: 1, 2)",
            ),
            (
                lambda: k.RepositoryModelUnload(unload_request("nope"), timeout=30),
                grpc.StatusCode.NOT_FOUND,
                "model_name: unknown model 'nope'",
            ),
            (
                lambda: k.RepositoryModelUnload(unload_request("tiny-a", "1"), timeout=30),
                grpc.StatusCode.NOT_FOUND,
                "model_name: model 'tiny-a' has no version '1' loaded (loaded: 2)",
            ),
            (
                lambda: k.RepositoryModelLoad(
                    kpb.RepositoryModelLoadRequest(repository_name="other", model_name="tiny-a"), timeout=30
                ),
                grpc.StatusCode.NOT_FOUND,
                "repository_name:",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request(""), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                "model_name: a model name is required",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request("tiny-a", "x"), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                "parameters[\"version\"]: 'x' is not a positive integer",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request("tiny-a", 0), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                "parameters[\"version\"]: '0' is not a positive integer",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request("tiny-a", config="{}"), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                "parameters['config']: unknown or mistyped",
            ),
            (
                lambda: k.RepositoryModelLoad(load_request("tiny-a", default="yes"), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                "parameters['default']: unknown or mistyped",
            ),
            (
                lambda: k.RepositoryModelUnload(unload_request("tiny-a", default=True), timeout=30),
                grpc.StatusCode.INVALID_ARGUMENT,
                'parameters["default"]: applies to RepositoryModelLoad only',
            ),
        ):
            got, details = status_of(call)
            assert got == code and details.startswith(message), details
        # Nothing above changed what is served.
        assert index_of(k, ready=True).keys() == {
            ("tiny-a", "2"),
            ("tiny-a-encoder", "2"),
            ("tiny-b", "1"),
            ("tiny-b-encoder", "1"),
        }

        # tritonclient's own calls, unchanged: load_model, unload_model, get_model_repository_index.
        assert tritonclient_calls(
            srv.address,
            [
                ["unload_model", ["tiny-b"]],
                ["get_model_repository_index", []],
                ["load_model", ["tiny-b"]],
                ["is_model_ready", ["tiny-b"]],
            ],
        ) == [
            None,
            [
                {"name": "tiny-a", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                {"name": "tiny-a-encoder", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                {"name": "tiny-a", "version": "2", "state": "READY"},
                {"name": "tiny-a-encoder", "version": "2", "state": "READY"},
                {"name": "tiny-b", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
                {"name": "tiny-b-encoder", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"},
            ],
            None,
            True,
        ]
        assert c.translate_response([TEXT], model="tiny-b", beam_size=1).model == "tiny-b:1"


TRITONCLIENT = r"""
import json, sys
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

out = []
with tc.InferenceServerClient(sys.argv[1]) as c:
    for method, args in json.loads(sys.argv[2]):
        try:
            if method == "get_model_repository_index":
                result = c.get_model_repository_index(as_json=True).get("models", [])
            else:
                result = getattr(c, method)(*args)
        except InferenceServerException as e:
            result = {"error": [str(e.status()).rsplit(".", 1)[-1], e.message()]}
        out.append(result)
print(json.dumps(out))
"""


def tritonclient_calls(address: str, calls: list) -> list:
    """tritonclient's calls in a child process (it registers its own copy of the `inference`
    protos, which this process's generated code also defines: see kserve_calls.py); the results
    as JSON, errors as {"error": [code, message]}."""
    done = subprocess.run(
        [sys.executable, "-c", TRITONCLIENT, address, json.dumps(calls)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_repository_control_off_is_permission_denied(make_server, repository):
    """Also default_model: requests that name no model get it."""
    srv = serve(make_server, repository, models="tiny-a:1,tiny-b", default_model="tiny-b", repository_control=False)
    with grpc.insecure_channel(srv.address) as ch, srv.client(timeout=30) as c:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        for call in (
            lambda: k.RepositoryModelLoad(load_request("tiny-a", "2"), timeout=30),
            lambda: k.RepositoryModelUnload(unload_request("tiny-a", "1"), timeout=30),
        ):
            code, details = status_of(call)
            assert code == grpc.StatusCode.PERMISSION_DENIED and "repository_control" in details, details
        assert index_of(k, ready=True).keys() == {
            ("tiny-a", "1"),
            ("tiny-a-encoder", "1"),
            ("tiny-b", "1"),
            ("tiny-b-encoder", "1"),
        }
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-b:1"
        assert c.translate_response([TEXT], model="tiny-a", beam_size=1).model == "tiny-a:1"
        info = c.model_info()
        assert info.name == "tiny-b"
        assert [(m.name, m.default_model) for m in info.models] == [("tiny-b", True), ("tiny-a", False)]


def test_load_and_unload_need_the_bearer_token(make_server, repository):
    srv = serve(make_server, repository, models="tiny-b", auth_token=TOKEN)
    with grpc.insecure_channel(srv.address) as ch, srv.client(timeout=30, token=TOKEN) as c:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        for call in (
            lambda: k.RepositoryModelLoad(load_request("tiny-a"), timeout=30),
            lambda: k.RepositoryModelUnload(unload_request("tiny-b"), timeout=30),
            lambda: k.RepositoryIndex(kpb.RepositoryIndexRequest(), timeout=30),
        ):
            code, details = status_of(call)
            assert code == grpc.StatusCode.UNAUTHENTICATED and details.startswith("authorization: missing"), details
        code, _ = status_of(
            lambda: k.RepositoryModelLoad(
                load_request("tiny-a"), timeout=30, metadata=(("authorization", "Bearer wrong-token-0123456789abcdef"),)
            )
        )
        assert code == grpc.StatusCode.UNAUTHENTICATED
        code, _ = status_of(lambda: c.translate([TEXT], model="tiny-a", beam_size=1))
        assert code == grpc.StatusCode.NOT_FOUND  # nothing was loaded

        k.RepositoryModelLoad(load_request("tiny-a"), timeout=120, metadata=BEARER)  # the latest: 2
        assert c.translate_response([TEXT], model="tiny-a", beam_size=1).model == "tiny-a:2"
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-b:1"  # the default model stays
        k.RepositoryModelUnload(unload_request("tiny-a"), timeout=120, metadata=BEARER)
        code, _ = status_of(lambda: c.translate([TEXT], model="tiny-a", beam_size=1))
        assert code == grpc.StatusCode.NOT_FOUND
        rows = k.RepositoryIndex(kpb.RepositoryIndexRequest(ready=True), timeout=30, metadata=BEARER).models
        assert {(m.name, m.version) for m in rows} == {("tiny-b", "1"), ("tiny-b-encoder", "1")}


# ----------------------------------------------------------------------------- under load


def test_load_and_unload_under_load_fail_no_request(make_server, repository):
    """16 threads translate with "tiny-a" (its default version) and 3 with "tiny-b" while tiny-a
    version 2 is loaded as the default and version 1 unloaded. tiny-a:1's decoder steps are held
    (a gate) from before the load until the unload has begun, so requests are in flight on
    version 1 across the unload: they finish there, and nothing fails."""
    srv = serve(make_server, repository, models="tiny-a:1,tiny-b", grace_period_s=60)
    gate = threading.Event()
    gate.set()

    def held(rows: int) -> None:
        gate.wait(60)
        time.sleep(0.002)  # requests that last a few steps' time: many in flight at once

    srv.intercept_steps(held)  # the default model's backend: tiny-a:1 only
    stop = threading.Event()
    answers: list[tuple[str, float, float, str]] = []  # (model asked, start, end, who answered or the error)

    def traffic(model: str, c) -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                who = c.translate_response([TEXT], model=model, beam_size=1).model
            except grpc.RpcError as e:
                who = f"{e.code().name}: {e.details()}"
            answers.append((model, t0, time.monotonic(), who))

    def answered(who: str, after: float = 0.0) -> int:
        return sum(1 for _, _, end, w in answers if w == who and end > after)

    a1 = srv.server.models.resolve("tiny-a:1")
    with (
        srv.client(timeout=120) as c,
        grpc.insecure_channel(srv.address) as ch,
        ThreadPoolExecutor(20) as pool,
    ):
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        threads = [pool.submit(traffic, "tiny-a", c) for _ in range(16)]
        threads += [pool.submit(traffic, "tiny-b", c) for _ in range(3)]
        try:
            assert eventually(lambda: answered("tiny-a:1") >= 16 and answered("tiny-b:1") >= 3, 60)
            gate.clear()
            assert eventually(lambda: a1.leases >= 4, 30)  # requests held on version 1
            k.RepositoryModelLoad(load_request("tiny-a", 2, default=True), timeout=120)
            loaded = time.monotonic()
            unloading_since = time.monotonic()
            unload = pool.submit(k.RepositoryModelUnload, unload_request("tiny-a", "1"), timeout=120)
            assert eventually(lambda: index_of(k).get(("tiny-a", "1")) == ("UNLOADING", ""), 30)
            assert not unload.done()  # waiting for the requests that hold version 1
            held_requests = a1.leases
            assert held_requests >= 4
            # Meanwhile tiny-a answers with version 2, and version 1 takes no new request.
            assert c.translate_response([TEXT], model="tiny-a", beam_size=1).model == "tiny-a:2"
            code, details = status_of(lambda: c.translate([TEXT], model="tiny-a:1", beam_size=1))
            assert code == grpc.StatusCode.NOT_FOUND and "loaded: 2" in details
            gate.set()
            unload.result(timeout=120)
            unloaded = time.monotonic()
            assert eventually(lambda: answered("tiny-a:2", unloaded) >= 16 and answered("tiny-b:1", unloaded) >= 3, 60)
        finally:
            gate.set()
            stop.set()
        for t in threads:
            t.result(timeout=120)

    failed = [a for a in answers if not a[3].startswith(("tiny-a:", "tiny-b:"))]
    assert not failed and len(answers) > 60
    assert {who for model, _, _, who in answers if model == "tiny-b"} == {"tiny-b:1"}
    assert {who for model, _, _, who in answers if model == "tiny-a"} == {"tiny-a:1", "tiny-a:2"}
    # Started after the load had switched the default: version 2.
    assert {who for model, t0, _, who in answers if model == "tiny-a" and t0 > loaded} == {"tiny-a:2"}
    # Requests in flight on version 1 when its unload began finished there, after it began.
    finished_on_1 = [a for a in answers if a[3] == "tiny-a:1" and a[1] < unloading_since < a[2]]
    assert len(finished_on_1) >= held_requests
    assert {(e.name, e.version): e.state for e in srv.server.models.index()} == {
        ("tiny-a", "1"): "UNAVAILABLE",
        ("tiny-a", "2"): "READY",
        ("tiny-b", "1"): "READY",
    }
    assert set(series(srv, "mtserve_queue_depth")) == {("tiny-a", "2"), ("tiny-b", "1")}


def test_a_broken_version_and_an_abandoned_unload(make_server, tmp_path, tiny_onnx_dir):
    """A version that cannot be loaded is refused with the reason, and the server keeps serving;
    an unload whose caller stops waiting (its deadline) still finishes once the requests holding
    the version are answered: the backend stops and the version's metric series go."""
    repo = tmp_path / "repository"
    (repo / "tiny-b").mkdir(parents=True)
    (repo / "tiny-b" / "1").symlink_to(tiny_onnx_dir.parent, target_is_directory=True)
    (repo / "broken" / "1").mkdir(parents=True)  # no export in it
    srv = serve(make_server, repo, models="tiny-b:1", grace_period_s=60)
    with grpc.insecure_channel(srv.address) as ch, srv.client(timeout=60) as c, ThreadPoolExecutor(1) as pool:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        code, details = status_of(lambda: k.RepositoryModelLoad(load_request("broken"), timeout=120))
        assert code == grpc.StatusCode.FAILED_PRECONDITION, details
        assert details.startswith("model_name: broken:1 cannot be loaded: no exported model at "), details
        assert index_of(k)[("broken", "1")] == ("UNAVAILABLE", "unloaded")
        assert set(series(srv, "mtserve_queue_depth")) == {("tiny-b", "1")}  # none left by the failed load
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-b:1"

        gate = threading.Event()
        srv.intercept_steps(lambda rows: gate.wait(60))
        b1 = srv.server.models.resolve("tiny-b:1")
        held = pool.submit(c.translate_response, [TEXT], model="tiny-b", beam_size=1)
        try:
            assert eventually(lambda: b1.leases == 1, 30)
            code, _ = status_of(lambda: k.RepositoryModelUnload(unload_request("tiny-b", "1"), timeout=1.0))
            assert code == grpc.StatusCode.DEADLINE_EXCEEDED
            assert index_of(k)[("tiny-b", "1")] == ("UNLOADING", "")
        finally:
            gate.set()
        assert held.result(timeout=60).model == "tiny-b:1"
        assert eventually(lambda: index_of(k)[("tiny-b", "1")] == ("UNAVAILABLE", "unloaded"), 30)
        assert eventually(lambda: not series(srv, "mtserve_queue_depth"), 30), series(srv, "mtserve_queue_depth")
        code, details = status_of(lambda: c.translate([TEXT], beam_size=1))
        assert code == grpc.StatusCode.UNAVAILABLE and "default model 'tiny-b'" in details, details
        assert "served: none" in details, details

    # At start, a version that cannot be loaded fails the start, and what was loaded before it stops.
    workers = decode_workers()
    with pytest.raises(ModelLoadError) as e:
        start(repo, models="tiny-b,broken")
    assert f"no exported model at {repo / 'broken' / '1'}" in str(e.value)
    assert decode_workers() == workers


# ----------------------------------------------------------------------------- start-up errors


def decode_workers() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("decode-worker"))


def start(repository: Path, **settings) -> None:
    """Server.start with these settings, as `mtserve serve` runs it (expected to fail before it
    listens)."""
    from service.server import Server

    st = Settings(
        address="127.0.0.1:0",
        model_repository=repository,
        metrics_port=0,
        decode_workers=1,
        precision="fp32",
        **settings,
    )
    asyncio.run(Server(st).start())


def test_settings_that_name_what_is_not_there_fail_the_start(repository, tmp_path):
    for settings, message in (
        ({"models": "tiny-a,nope"}, "models: 'nope' is not in the repository (found: tiny-a, tiny-b)"),
        ({"models": "tiny-a:7"}, "models: 'tiny-a' has no version '7' (found: 1, 2)"),
        ({"models": "tiny-a:x"}, "models: version 'x' of 'tiny-a:x' is not a positive integer"),
        ({"models": "tiny-b", "default_model": "tiny-a"}, "default_model: unknown model 'tiny-a' (served: tiny-b)"),
    ):
        with pytest.raises(ModelLoadError) as e:
            start(repository, **settings)
        assert str(e.value).startswith(message), e.value
    empty = tmp_path / "empty"
    (empty / "no-versions").mkdir(parents=True)
    with pytest.raises(ModelLoadError, match="model_repository: no model in .*empty"):
        start(empty)
    with pytest.raises(ModelLoadError, match="model_repository: .*missing is not a directory"):
        start(tmp_path / "missing")


# ----------------------------------------------------------------------------- the model lifecycle


def default_gauge(srv) -> dict[str, float]:
    """mtserve_default_model by model: 1 for the default model, 0 for one that was it."""
    return {
        s.labels["model"]: s.value
        for family in srv.server.metrics.registry.collect()
        for s in family.samples
        if s.name == "mtserve_default_model"
    }


def test_the_default_model_never_moves_to_another(make_server, repository):
    """Unloading the default model under traffic: requests that name no model get UNAVAILABLE
    naming it, never another model's answer; loading it back restores it; `default: true` moves
    the default, which the log and the mtserve_default_model gauge show."""
    srv = serve(make_server, repository, models="tiny-a:1,tiny-b")
    unavailable = "model: the default model 'tiny-a' is not loaded"
    with grpc.insecure_channel(srv.address) as ch, srv.client(timeout=30) as c:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        assert default_gauge(srv) == {"tiny-a": 1.0}
        answers: list[str] = []
        stop = threading.Event()

        def traffic() -> None:
            with srv.client(timeout=30) as own:
                while not stop.is_set():
                    try:
                        answers.append(own.translate_response([TEXT], beam_size=1, max_output_tokens=4).model)
                    except grpc.RpcError as e:
                        answers.append(f"{e.code().name} {e.details()}")

        with ThreadPoolExecutor(4) as pool:
            for _ in range(4):
                pool.submit(traffic)
            eventually(lambda: len(answers) >= 8)
            k.RepositoryModelUnload(unload_request("tiny-a"), timeout=120)
            seen = len(answers)
            eventually(lambda: len(answers) >= seen + 8)
            stop.set()
        assert set(answers) <= {
            "tiny-a:1",
            f"UNAVAILABLE {unavailable}; name a model (served: tiny-b) or load the default again",
        }, set(answers)
        assert answers[-1].startswith("UNAVAILABLE")

        for call in (
            lambda: c.translate([TEXT], beam_size=1),
            lambda: list(c.translate_stream(TEXT, beam_size=1)),
            lambda: c.encode([TEXT]),
            lambda: c.model_info(),
        ):
            code, details = status_of(call)
            assert code == grpc.StatusCode.UNAVAILABLE and details.startswith(unavailable), details
        (item,) = c.translate_many([pb.TranslateManyRequest(id="1", request=pb.TranslateRequest(texts=[TEXT]))])
        assert item.error.message.startswith("request.model: the default model 'tiny-a' is not loaded"), item
        assert c.translate_response([TEXT], model="tiny-b", beam_size=1).model == "tiny-b:1"
        assert [(m.name, m.default_model) for m in c.model_info("tiny-b").models] == [("tiny-b", False)]

        k.RepositoryModelLoad(load_request("tiny-a", 2), timeout=120)  # the default again, at version 2
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-a:2"
        assert default_gauge(srv) == {"tiny-a": 1.0}

        k.RepositoryModelLoad(load_request("tiny-b", default=True), timeout=120)
        assert c.translate_response([TEXT], beam_size=1).model == "tiny-b:1"
        assert [(m.name, m.default_model) for m in c.model_info().models] == [("tiny-b", True), ("tiny-a", False)]
        assert default_gauge(srv) == {"tiny-a": 0.0, "tiny-b": 1.0}


def health_of(ch: grpc.Channel) -> tuple[int, int, bool]:
    """grpc.health.v1 for the server and for mtserve.v1, and KServe ServerReady."""
    health = health_pb2_grpc.HealthStub(ch)
    server, service = (
        health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10).status
        for name in ("", "mtserve.v1.TranslationService")
    )
    ready = kpb_grpc.GRPCInferenceServiceStub(ch).ServerReady(kpb.ServerReadyRequest(), timeout=10).ready
    return server, service, ready


def test_health_follows_what_can_be_served(make_server, repository):
    """With no model loaded, Health is NOT_SERVING and ServerReady false (Triton's readiness);
    SERVING again once a model is loaded."""
    srv = serve(make_server, repository, models="tiny-b")
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING
    with grpc.insecure_channel(srv.address) as ch:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        assert health_of(ch) == (serving, serving, True)
        k.RepositoryModelUnload(unload_request("tiny-b"), timeout=120)
        assert health_of(ch) == (not_serving, not_serving, False)
        assert index_of(k, ready=True) == {}
        k.RepositoryModelLoad(load_request("tiny-a"), timeout=120)
        assert health_of(ch) == (serving, serving, True)


def rss_bytes() -> int:
    """This process's resident memory (the server runs in it), from /proc/self/status."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_a_load_cut_short_by_its_deadline_completes_or_gives_its_memory_back(make_server, repository, monkeypatch):
    """RepositoryModelLoad ten times under a 50 ms deadline: the load goes on once, is served
    (READY in the index), and after its unload the process's memory is back within 10% of where it
    began. The sessions' load is made to take 0.3 s (the tiny model loads within 50 ms). One load
    and unload come first, so that what a first load keeps for good (ONNX Runtime's thread pools,
    the tokenizer's caches) is counted in where it began."""
    srv = serve(make_server, repository, models="tiny-b")
    load_in_process = loader_module._load_in_process

    def slow_load(*args):
        time.sleep(0.3)
        return load_in_process(*args)

    with grpc.insecure_channel(srv.address) as ch:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        k.RepositoryModelLoad(load_request("tiny-a", 1), timeout=120)
        k.RepositoryModelUnload(unload_request("tiny-a"), timeout=120)
        before = rss_bytes()
        monkeypatch.setattr(loader_module, "_load_in_process", slow_load)
        codes = []
        for _ in range(10):
            try:
                k.RepositoryModelLoad(load_request("tiny-a", 1), timeout=0.05)
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as e:
                codes.append(e.code())
        assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED}, codes
        assert grpc.StatusCode.DEADLINE_EXCEEDED in codes
        assert eventually(lambda: index_of(k).get(("tiny-a", "1"), ("", ""))[0] == "READY"), index_of(k)
        k.RepositoryModelUnload(unload_request("tiny-a"), timeout=120)
        after = rss_bytes()
        assert after <= before * 1.10, (before / 2**20, after / 2**20)
        assert index_of(k, ready=True).keys() == {("tiny-b", "1"), ("tiny-b-encoder", "1")}
