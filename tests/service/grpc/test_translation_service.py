"""HTML, glossaries and do-not-translate phrases through a real server on loopback, on both APIs
(mtserve.v1's Translate, TranslateStream and TranslateMany, and KServe's ModelInfer): the same
translations and applied terms everywhere, and every bad input refused with its field named in
each API's words, the server healthy after."""

from __future__ import annotations

import json
import re

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.client import pb
from tests.support import kserve_infer

PAGE = '<p>Ein <b>Hund</b> rennt durch den <a href="/schnee?x=1&amp;y=2">Schnee</a>.</p><p>Ein Kind lacht.<br>Zwei Männer sitzen.</p>'
TAG = re.compile(r"<[^>]*>")


@pytest.fixture(scope="module")
def server(make_server, shipped_repository):
    return make_server(
        model_dir=None, onnx_dir=None, model_repository=shipped_repository, models="de-en,fr-en", precision="int8"
    )


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


def refused(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def kserve_text(resp) -> list[str]:
    return [b.decode() for b in resp.outputs[0].contents.bytes_contents]


def test_html_is_the_same_on_every_api(server, client):
    (done,) = client.translate([PAGE], model="de-en", text_type="html", beam_size=1)
    assert sorted(TAG.findall(done.text)) == sorted(TAG.findall(PAGE))  # every tag and attribute, as sent
    assert done.text.count("<p>") == 2 and "<br>" in done.text
    stream = list(client.translate_stream(PAGE, model="de-en", text_type="html", beam_size=1))
    assert stream[-1].final.text == done.text
    assert "".join(m.chunk.text for m in stream if m.HasField("chunk")) == done.text
    many = list(
        client.translate_many(
            [
                pb.TranslateManyRequest(
                    id="a",
                    request=pb.TranslateRequest(
                        texts=[PAGE],
                        model="de-en",
                        options=pb.TranslationOptions(text_type=pb.TEXT_TYPE_HTML, beam_size=1),
                    ),
                )
            ]
        )
    )
    assert many[0].response.translations[0].text == done.text
    resp = kserve_infer(server.address, "de-en", [PAGE], text_type="html", beam_size=1)
    assert kserve_text(resp) == [done.text]


def test_glossary_and_do_not_translate_on_every_api(server, client):
    text = "Ein Hund rennt durch den Schnee. Zwei Männer von ACME Cloud sitzen auf einer Bank."
    glossary, dnt = {"Hund": "canine"}, ["ACME Cloud"]
    (plain,) = client.translate([text], model="de-en", beam_size=4)
    (done,) = client.translate([text], model="de-en", beam_size=4, glossary=glossary, do_not_translate=dnt)
    assert "canine" in done.text and "ACME Cloud" in done.text and "canine" not in plain.text
    terms = [(t.source, t.target, t.origin) for t in done.applied_terms]
    assert terms == [("Hund", "canine", "glossary"), ("ACME Cloud", "ACME Cloud", "do_not_translate")]
    for t in done.applied_terms:
        assert text[t.source_start : t.source_end] == t.source and done.text[t.start : t.end] == t.target
    resp = kserve_infer(
        server.address,
        "de-en",
        [text],
        beam_size=4,
        glossary=json.dumps(glossary),
        do_not_translate=json.dumps(dnt),
    )
    assert kserve_text(resp) == [done.text]
    applied = json.loads(resp.parameters["applied_terms"].string_param)
    assert [(t["source"], t["start"], t["end"]) for t in applied[0]] == [
        (t.source, t.start, t.end) for t in done.applied_terms
    ]
    final = list(client.translate_stream(text, model="de-en", beam_size=4, glossary=glossary, do_not_translate=dnt))[
        -1
    ].final
    assert final.text == done.text and len(final.applied_terms) == 2


def test_bad_inputs_name_their_fields_on_both_apis(server, client):
    cases = [
        # (v1 call, KServe parameters and texts, code, v1 field, KServe field)
        (
            dict(texts=["<a><b></a>"], text_type="xml"),
            dict(texts=["<a><b></a>"], text_type="xml"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "texts[0]: malformed markup at line 1",
            "inputs[0][0]",
        ),
        (
            dict(texts=["Ein Hund."], glossary={"x" * 300: "y"}),
            dict(texts=["Ein Hund."], glossary=json.dumps({"x" * 300: "y"})),
            grpc.StatusCode.INVALID_ARGUMENT,
            "options.glossary[0].source",
            "parameters.glossary[0].source",
        ),
        (
            dict(texts=["Ein Hund."], do_not_translate=["..."]),
            dict(texts=["Ein Hund."], do_not_translate=json.dumps(["..."])),
            grpc.StatusCode.INVALID_ARGUMENT,
            "options.do_not_translate[0]",
            "parameters.do_not_translate[0]",
        ),
        (
            dict(texts=["Ein Hund."], glossary_id="legal"),
            dict(texts=["Ein Hund."], glossary_id="legal"),
            grpc.StatusCode.NOT_FOUND,
            "options.glossary_id",
            "parameters.glossary_id",
        ),
    ]
    for v1, v2, code, field, v2_field in cases:
        texts = v1.pop("texts")
        got = refused(lambda texts=texts, v1=v1: client.translate(texts, model="de-en", **v1))
        assert got[0] == code and got[1].startswith(field), got
        texts = v2.pop("texts")
        got = refused(lambda texts=texts, v2=v2: kserve_infer(server.address, "de-en", texts, **v2))
        assert got[0] == code and got[1].startswith(v2_field), got
    got = refused(lambda: kserve_infer(server.address, "de-en", ["x"], text_type="pdf"))
    assert got[0] == grpc.StatusCode.INVALID_ARGUMENT and got[1].startswith("parameters.text_type"), got
    req = pb.TranslateRequest(texts=["Ein Hund."], model="de-en", options=pb.TranslationOptions(text_type=7))
    got = refused(lambda: client.stub.Translate(req, timeout=30))
    assert got[0] == grpc.StatusCode.INVALID_ARGUMENT and got[1].startswith("options.text_type"), got
    for text_type in (7, pb.TEXT_TYPE_HTML):  # the texts' count and bytes come before the text type, as for text
        req = pb.TranslateRequest(texts=[], model="de-en", options=pb.TranslationOptions(text_type=text_type))
        got = refused(lambda req=req: client.stub.Translate(req, timeout=30))
        assert got[0] == grpc.StatusCode.INVALID_ARGUMENT and got[1].startswith("texts: "), got
        stream = pb.TranslateStreamRequest(text="x" * 100_001, model="de-en", options=req.options)
        got = refused(lambda stream=stream: list(client.stub.TranslateStream(stream, timeout=30)))
        assert got[0] == grpc.StatusCode.INVALID_ARGUMENT and got[1].startswith("text: "), got
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    assert client.translate(["Ein Hund."], model="de-en")[0].text
