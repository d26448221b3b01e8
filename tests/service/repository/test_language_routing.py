"""source_language "auto" over a real gRPC server on loopback serving de-en and fr-en (both into
English) and the tiny M2M100 (tests/service/conftest.py): each text (or segment) routed to the
model of its detected language, with the same translations as a request that names the language;
the refusals (below the threshold, no target language, a named model that does not read the
text's language) name their fields; Translate, TranslateStream and TranslateMany."""

from __future__ import annotations

import grpc
import pytest

from service.client import pb
from tests.service.imported import M2M100
from tests.support import kserve_infer

DE = ["Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.", "Zwei Kinder spielen am Strand."]
FR = [
    "Un homme avec un chapeau orange regardant quelque chose.",
    "Un homme en tenue claire photographie un groupe d'hommes portant des costumes sombres et des chapeaux.",
]


@pytest.fixture(scope="module")
def server(make_server, imported_repository):
    return make_server(
        model_dir=None,
        onnx_dir=None,
        model_repository=imported_repository,
        models=f"de-en,fr-en,{M2M100}",
        precision="int8",
        max_output_tokens=48,
    )


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


def request(texts, source="auto", target="en", model="", **options) -> pb.TranslateRequest:
    return pb.TranslateRequest(
        texts=texts,
        source_language=source,
        target_language=target,
        model=model,
        options=pb.TranslationOptions(beam_size=1, **options),
    )


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def detections(server, language: str) -> float:
    registry = server.server.metrics.registry
    return registry.get_sample_value("mtserve_language_detections_total", {"language": language}) or 0.0


def explicit(client, texts, source, model="") -> list[str]:
    r = client.stub.Translate(request(texts, source, model=model), timeout=60)
    return [t.text for t in r.translations]


def test_a_mixed_batch_is_routed_per_text(client, server):
    before = detections(server, "de"), detections(server, "fr")
    texts = [DE[0], FR[0], DE[1], FR[1]]
    r = client.stub.Translate(request(texts), timeout=60)
    got = [(t.detected_language, t.model) for t in r.translations]
    assert got == [("de", "de-en:1"), ("fr", "fr-en:1"), ("de", "de-en:1"), ("fr", "fr-en:1")]
    assert all(t.detected_confidence >= 0.9 for t in r.translations) and r.model == "de-en:1"
    de, fr = explicit(client, DE, "de"), explicit(client, FR, "fr")
    assert [t.text for t in r.translations] == [de[0], fr[0], de[1], fr[1]]
    assert (detections(server, "de"), detections(server, "fr")) == (before[0] + 2, before[1] + 2)


def test_segments_are_routed_per_sentence(client):
    text = f"{DE[0]} {FR[1]}\n{DE[1]}"
    r = client.stub.Translate(request([text], detect_per_segment=True), timeout=60)
    (t,) = r.translations
    assert [(text[s.start : s.end], s.detected_language) for s in t.segments] == [
        (DE[0], "de"),
        (FR[1], "fr"),
        (DE[1], "de"),
    ]
    assert all(s.detected_confidence >= 0.9 for s in t.segments)
    de, fr = explicit(client, DE, "de"), explicit(client, FR, "fr")
    assert t.text == f"{de[0]} {fr[1]}\n{de[1]}"  # the whitespace between segments kept
    assert [s.text for s in t.segments] == [de[0], fr[1], de[1]]
    # The model of its first run of segments; the language of most of its characters (the
    # French sentence is longer than the two German ones together).
    assert t.model == "de-en:1" and t.detected_language == "fr"
    # Detected as a whole, a text's segments carry no language of their own.
    whole = client.stub.Translate(request([f"{DE[0]} {DE[1]}"]), timeout=60).translations[0]
    assert whole.detected_language == "de" and len(whole.segments) == 2
    assert not any(s.detected_language for s in whole.segments)


def test_below_the_threshold_the_text_is_refused_with_its_candidates(client, server):
    before = detections(server, "undecided")
    code, message = status_of(lambda: client.stub.Translate(request([DE[0], "12 345 !!"]), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith('source_language: texts[1]: "auto": no language reached the detection threshold 0.9')
    assert "(best: de 0.1" in message and "name the source language" in message
    assert detections(server, "undecided") == before + 1
    code, message = status_of(lambda: client.stub.Translate(request(["Ja. 12."], detect_per_segment=True), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("source_language: texts[0]: ")


def test_auto_needs_a_target_language(client):
    code, message = status_of(lambda: client.stub.Translate(request(DE, target=""), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith('target_language: "auto" needs the target')


def test_a_named_model_must_read_the_detected_language(client):
    code, message = status_of(lambda: client.stub.Translate(request([FR[0], DE[0]], model="fr-en"), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith('source_language: "auto" detected de (')
    assert "in texts[1], which model fr-en:1 does not read (it reads fr)" in message
    r = client.stub.Translate(request(DE, model="de-en", target=""), timeout=60)
    assert [(t.detected_language, t.model) for t in r.translations] == [("de", "de-en:1")] * 2
    # A multilingual model reads several: the detected one is its source language.
    r = client.stub.Translate(request(DE, model=M2M100), timeout=60)
    assert [(t.detected_language, t.model) for t in r.translations] == [("de", f"{M2M100}:1")] * 2
    assert [t.text for t in r.translations] == explicit(client, DE, "de", model=M2M100)
    code, message = status_of(lambda: client.stub.Translate(request(FR[:1], model=M2M100), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and f"which model {M2M100}:1 does not read" in message


def test_translate_many_routes_each_item(client):
    items = [
        pb.TranslateManyRequest(id="mixed", request=request([FR[0], DE[0]])),
        pb.TranslateManyRequest(id="digits", request=request(["123"])),
        pb.TranslateManyRequest(id="wrong-model", request=request(DE[:1], model="fr-en")),
    ]
    answers = {a.id: a for a in client.translate_many(items)}
    mixed = answers["mixed"].response
    assert [(t.detected_language, t.model) for t in mixed.translations] == [("fr", "fr-en:1"), ("de", "de-en:1")]
    assert mixed.model == "fr-en:1"
    assert [t.text for t in mixed.translations] == [
        explicit(client, FR[:1], "fr")[0],
        explicit(client, DE[:1], "de")[0],
    ]
    for name in ("digits", "wrong-model"):
        assert answers[name].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert answers[name].error.message.startswith("request.source_language: ")
    assert answers["digits"].error.message.startswith('request.source_language: texts[0]: "auto": no language')


def test_translate_stream_routes_the_text(client):
    events = list(client.translate_stream(FR[1], source_language="auto", target_language="en", beam_size=1))
    final = events[-1].final
    assert final.detected_language == "fr" and final.model == "fr-en:1" and final.detected_confidence >= 0.9
    assert "".join(e.chunk.text for e in events[:-1]) == final.text == explicit(client, FR[1:], "fr")[0]
    code, message = status_of(lambda: list(client.translate_stream("12", source_language="auto", target_language="en")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith('source_language: text: "auto": ')
    stream = pb.TranslateStreamRequest(
        text=FR[0], source_language="auto", target_language="en", options=pb.TranslationOptions(detect_per_segment=True)
    )
    code, message = status_of(lambda: list(client.stub.TranslateStream(stream, timeout=60)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("options.detect_per_segment: ")


def test_the_server_is_healthy_after_the_refusals_and_shows_the_threshold(client):
    assert client.health() == "SERVING"
    r = client.stub.Translate(request(DE[:1], source="de"), timeout=60)
    assert r.translations[0].model == "de-en:1" and not r.translations[0].detected_language
    assert client.model_info().limits.detection_threshold == pytest.approx(0.9)


def test_kserve_auto_detects_within_the_named_model(server, client):
    import json

    # A multilingual model: the detected language becomes each text's source token.
    resp = kserve_infer(server.address, M2M100, DE, source_language="auto", target_language="en", beam_size=1)
    detected = json.loads(resp.parameters["detected_languages"].string_param)
    assert [d[0] for d in detected] == ["de", "de"] and all(d[1] >= 0.9 for d in detected)
    named = client.translate(DE, model=M2M100, source_language="de", target_language="en", beam_size=1)
    assert [b.decode() for b in resp.outputs[0].contents.bytes_contents] == [t.text for t in named]
    # A one-pair model that reads the detected language.
    resp = kserve_infer(server.address, "fr-en", FR[:1], source_language="auto", beam_size=1)
    assert json.loads(resp.parameters["detected_languages"].string_param)[0][0] == "fr"
    (plain,) = client.translate(FR[:1], model="fr-en", beam_size=1)
    assert resp.outputs[0].contents.bytes_contents[0].decode() == plain.text
    # A one-pair model that does not read the detected language: its field, in KServe's words.
    code, details = status_of(lambda: kserve_infer(server.address, "fr-en", [DE[1]], source_language="auto"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("parameters.source_language"), details
    assert "fr-en" in details
