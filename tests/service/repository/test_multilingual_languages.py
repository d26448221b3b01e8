"""A multilingual model's languages as a real gRPC server shows them: the NOT_FOUND for a pair it
does not serve lists its languages (sorted, with their number, cut at a few hundred bytes), not
the first of its 9,900 pairs; GetModelInfo shows no default pair for it (a request must name its
languages) and lists its languages in their own fields. The model: tests/service/conftest.py's
`padded_repository`, an M2M100 import with the tokenizer's 100 languages."""

from __future__ import annotations

import urllib.request

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.client import pb
from tests.conftest import RunningServer
from tests.service.imported import M2M100_PADDED
from tests.support import free_port

TEXT = "Ein Hund rennt durch den Schnee."
REF = f"{M2M100_PADDED}:1"


@pytest.fixture(scope="module")
def server(padded_repository):
    from service.settings import Settings

    s = RunningServer(
        Settings(
            address="127.0.0.1:0",
            model_repository=padded_repository,
            models=M2M100_PADDED,
            precision="fp32",
            metrics_port=free_port(),
            metrics_address="127.0.0.1",
            decode_workers=1,
            engine_process=False,
            max_output_tokens=16,
        )
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def kserve(server):
    with grpc.insecure_channel(server.address) as ch:
        yield kpb_grpc.GRPCInferenceServiceStub(ch)


@pytest.fixture(scope="module")
def languages(hf_m2m100_padded_dir) -> list[str]:
    """The model's languages as transformers' tokenizer has them, in its order."""
    from transformers import M2M100Tokenizer

    codes = list(M2M100Tokenizer.from_pretrained(str(hf_m2m100_padded_dir)).lang_code_to_id)
    assert len(codes) == 100
    return codes


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def listed(message: str, after: str) -> list[str]:
    """The languages a message lists after `after`, up to the closing parenthesis; the list must
    end with "…" (cut)."""
    tail = message.split(after, 1)[1].split(")", 1)[0]
    codes = tail.split(", ")
    assert codes[-1] == "…", message
    return codes[:-1]


def check_languages(message: str, after: str, languages: list[str]) -> None:
    codes = listed(message, after)
    assert codes == sorted(languages)[: len(codes)] and 20 < len(codes) < 100
    assert len(", ".join(codes).encode()) <= 400 and len(message.encode()) < 700


def test_a_pair_the_model_lacks_lists_its_languages(client, kserve, languages):
    # The model named: which side it lacks, and its languages (not "af->am, af->ar, ...").
    code, message = status_of(
        lambda: client.translate([TEXT], model=M2M100_PADDED, source_language="de", target_language="xx")
    )
    assert code == grpc.StatusCode.NOT_FOUND
    head = (
        f"source_language/target_language: model {REF} does not translate de->xx: xx is not one of its target languages"
    )
    assert message.startswith(f"{head} (it serves 100 languages to 100: ")
    check_languages(message, "100 languages to 100: ", languages)
    assert "->" not in message.removeprefix(head)
    code, message = status_of(
        lambda: client.translate([TEXT], model=M2M100_PADDED, source_language="xx", target_language="de")
    )
    assert code == grpc.StatusCode.NOT_FOUND and "xx is not one of its source languages" in message
    # No model named: what every served model serves.
    code, message = status_of(lambda: client.translate([TEXT], source_language="de", target_language="xx"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith(
        f"source_language/target_language: no served model translates de->xx (served: {REF}: 100 languages to 100: "
    )
    check_languages(message, "100 languages to 100: ", languages)
    # TranslateStream, a TranslateMany item and KServe: the same, naming their own fields.
    code, message = status_of(lambda: list(client.translate_stream(TEXT, source_language="de", target_language="xx")))
    assert code == grpc.StatusCode.NOT_FOUND and "(served: " in message
    check_languages(message, "100 languages to 100: ", languages)
    item = pb.TranslateManyRequest(
        id="x", request=pb.TranslateRequest(texts=[TEXT], source_language="de", target_language="xx")
    )
    (answer,) = client.translate_many([item])
    assert answer.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answer.error.message.startswith(
        "request.source_language/request.target_language: no served model translates de->xx"
    )
    check_languages(answer.error.message, "100 languages to 100: ", languages)
    req = kpb.ModelInferRequest(model_name=M2M100_PADDED)
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(TEXT.encode())
    req.parameters["source_language"].string_param = "de"
    req.parameters["target_language"].string_param = "xx"
    code, message = status_of(lambda: kserve.ModelInfer(req, timeout=60))
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith(
        f"parameters.source_language/parameters.target_language: model {REF} does not translate de->xx"
    )
    check_languages(message, "100 languages to 100: ", languages)


def test_model_info_shows_no_default_pair(server, client, kserve, languages):
    info = client.model_info(M2M100_PADDED)
    assert (info.source_language, info.target_language) == ("", "")
    (served,) = info.models
    assert (served.source_language, served.target_language) == ("", "")
    assert list(served.source_languages) == languages == list(served.target_languages)
    assert served.language_pair_count == 100 * 99 and len(served.language_pairs) == 100
    # Consistent with it: a request without languages is refused, naming the field, listing them.
    code, message = status_of(lambda: client.translate([TEXT], model=M2M100_PADDED))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("source_language: ")
    check_languages(message, "needs the source language (", languages)
    code, message = status_of(lambda: client.translate([TEXT], model=M2M100_PADDED, source_language="de"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("target_language: ")
    check_languages(message, "name the target language (", languages)
    req = kpb.ModelInferRequest(model_name=M2M100_PADDED)
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(TEXT.encode())
    req.parameters["source_language"].string_param = "de"
    code, message = status_of(lambda: kserve.ModelInfer(req, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("parameters.target_language: ")
    # Nor does the model info metric.
    body = urllib.request.urlopen(f"http://127.0.0.1:{server.server.metrics_port}/metrics", timeout=10).read()
    infos = [
        s.labels
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
        if s.name == "mtserve_model_info" and s.labels["model"] == M2M100_PADDED
    ]
    assert [(i["source_language"], i["target_language"]) for i in infos] == [("", "")]
    # Every language the info lists is served, in either role.
    ok = client.translate([TEXT], model=M2M100_PADDED, source_language=languages[-1], target_language=languages[0])
    assert len(ok) == 1


def test_a_version_recording_other_unmapped_ids_is_not_loaded(client, kserve, padded_repository):
    """The import may record the ids without a vocabulary entry in the manifest: a record that
    disagrees with the tokenizer (a vocabulary swapped after the import) keeps the version from
    loading, FAILED_PRECONDITION with the reason; one that agrees loads and serves."""
    import shutil

    from contract.manifest import load_manifest, write_manifest

    root = padded_repository / M2M100_PADDED
    manifest = load_manifest(root / "1" / "onnx")
    size = manifest.dims.vocab_size
    made_up = list(range(size - 8, size))
    assert manifest.sentencepiece is not None
    try:
        for version, recorded in (("2", made_up[:-1]), ("3", made_up)):
            shutil.copytree(root / "1", root / version, symlinks=True)
            sp = manifest.sentencepiece.model_copy(update={"unmapped_ids": recorded})
            write_manifest(root / version / "onnx", manifest.model_copy(update={"sentencepiece": sp}))
        load = kpb.RepositoryModelLoadRequest(
            model_name=M2M100_PADDED, parameters={"version": kpb.ModelRepositoryParameter(string_param="2")}
        )
        code, message = status_of(lambda: kserve.RepositoryModelLoad(load, timeout=300))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "wrong tokenizer" in message and f"unrecorded: {made_up[-1]}" in message
        load.parameters["version"].string_param = "3"
        kserve.RepositoryModelLoad(load, timeout=300)
        r = client.translate_response([TEXT], model=f"{M2M100_PADDED}:3", source_language="de", target_language="en")
        assert r.model == f"{M2M100_PADDED}:3"
        kserve.RepositoryModelUnload(
            kpb.RepositoryModelUnloadRequest(
                model_name=M2M100_PADDED, parameters={"version": kpb.ModelRepositoryParameter(string_param="3")}
            ),
            timeout=120,
        )
    finally:
        for version in ("2", "3"):
            shutil.rmtree(root / version, ignore_errors=True)


def test_the_list_of_what_models_serve_is_cut():
    """Many multilingual models: the NOT_FOUND's list stops before LISTED_MESSAGE_BYTES, saying
    how many models there are; one-pair models show their pairs."""
    from types import SimpleNamespace

    from contract.manifest import LanguageSpec
    from service.engine.languages import ModelLanguages
    from service.repository.registry import LISTED_MESSAGE_BYTES, _served_languages

    codes = [f"x{i:02d}" for i in range(60)]
    tokens = {c: i for i, c in enumerate(codes)}
    many = ModelLanguages(LanguageSpec(source=codes, target=codes, source_tokens=tokens, target_tokens=tokens))
    one = ModelLanguages(LanguageSpec(source=["de"], target=["en"]))
    models = [SimpleNamespace(ref="de-en:1", engine=SimpleNamespace(languages=one))]
    models += [SimpleNamespace(ref=f"m{i}:1", engine=SimpleNamespace(languages=many)) for i in range(5)]
    text = _served_languages(models)
    assert text.startswith("de->en (de-en:1); m0:1: 60 languages to 60: x00, x01, ")
    assert text.endswith("; … (6 models in all)") and len(text.encode()) <= LISTED_MESSAGE_BYTES + 30
    assert _served_languages(models[:1]) == "de->en (de-en:1)"
