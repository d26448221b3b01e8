"""Texts as documents through a real server, on both APIs: a text is split into sentences (or
lines), each a row of its own, and put back together around its whitespace, with `segments`;
the `split` modes, an over-long sentence cut into parts, the max_text_bytes refusal,
TranslateStream sentence by sentence, GetModelInfo's limits."""

from __future__ import annotations

import argparse

import grpc
import pytest

from service.api.inference import grpc_service_pb2 as kpb
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import cli
from tests.support import kserve_infer

SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!", "Dr. Müller liest z. B. ein Buch."]
DOCUMENT = f"  {SENTENCES[0]} {SENTENCES[1]}\n\n{SENTENCES[2]}\n"
LIMIT, MAX_BYTES = 60, 3000


@pytest.fixture(scope="module")
def server(make_server):
    return make_server(decode_workers=1, max_input_tokens=LIMIT, max_text_bytes=MAX_BYTES)


def _alone(client, texts: list[str]) -> list[str]:
    return [t.text for t in client.translate(texts, beam_size=2, split="none")]


def test_a_text_is_translated_sentence_by_sentence_and_put_back_together(client):
    (doc,) = client.translate([DOCUMENT], beam_size=2, return_scores=True, return_tokens=True)
    alone = _alone(client, SENTENCES)
    assert [DOCUMENT[s.start : s.end] for s in doc.segments] == SENTENCES
    assert [s.text for s in doc.segments] == alone
    assert doc.text == f"  {alone[0]} {alone[1]}\n\n{alone[2]}\n"
    assert list(doc.token_ids) == [t for s in doc.segments for t in s.token_ids]
    assert all(s.score < 0 and s.tokens for s in doc.segments)
    assert doc.input_tokens == sum(s.input_tokens for s in doc.segments)


def test_split_modes_newlines_and_none(client):
    (lines,) = client.translate([DOCUMENT], beam_size=2, split="newlines")
    first_line, second_line = DOCUMENT.strip().split("\n\n")
    assert [DOCUMENT[s.start : s.end] for s in lines.segments] == [first_line, second_line]
    assert lines.text == f"  {_alone(client, [first_line])[0]}\n\n{_alone(client, [second_line])[0]}\n"
    (whole,) = client.translate([DOCUMENT], beam_size=2, split="none")
    assert [(s.start, s.end) for s in whole.segments] == [(2, len(DOCUMENT) - 1)]
    assert whole.text == whole.segments[0].text  # today's answer: the translation alone
    (one,) = client.translate([SENTENCES[0]], beam_size=2)  # a sentence alone: as before
    assert one.text == _alone(client, [SENTENCES[0]])[0] and len(one.segments) == 1


def test_an_unknown_split_value_names_the_field(client):
    req = pb.TranslateRequest(texts=["Ein Hund."], options=pb.TranslationOptions(split=7))
    with pytest.raises(grpc.RpcError) as e:
        client.stub.Translate(req, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("options.split:"), e.value.details()


def test_an_over_long_sentence_is_cut_into_parts_not_refused(client):
    long = "Ein Mann " + "und eine Frau und ein Kind und ein Hund " * 8 + "laufen."
    (doc,) = client.translate([long], beam_size=1)
    assert len(doc.segments) == 1 and doc.segments[0].input_tokens > LIMIT  # two rows or more
    assert doc.text == doc.segments[0].text
    with pytest.raises(grpc.RpcError) as e:
        client.translate(["Kurz.", long], split="none")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("texts[1]:") and f"max_input_tokens ({LIMIT})" in e.value.details()


def test_max_text_bytes_is_the_only_length_limit(client):
    many = " ".join(SENTENCES * 32)  # 96 sentences, 2,847 bytes: fills batches, never refused
    assert len(many.encode()) <= MAX_BYTES
    (doc,) = client.translate([many], beam_size=1)
    assert len(doc.segments) == 96
    with pytest.raises(grpc.RpcError) as e:
        client.translate(["Kurz.", "ä" * (MAX_BYTES // 2 + 1)])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == f"texts[1]: text exceeds max_text_bytes ({MAX_BYTES}): {MAX_BYTES + 2} bytes"


def test_translate_stream_goes_sentence_by_sentence_in_order(client):
    msgs = list(client.translate_stream(DOCUMENT, beam_size=1))
    chunks = [m.chunk.text for m in msgs[:-1]]
    final = msgs[-1].final
    assert "".join(chunks) == final.text
    (unary,) = client.translate([DOCUMENT], beam_size=1)
    assert final.text == unary.text and len(final.segments) == 3
    assert chunks[0] == "  " and "\n\n" in chunks and chunks[-1] == "\n"
    # each sentence's chunks come before the next one's whitespace
    at = [final.text.index(s.text) for s in final.segments]
    assert at == sorted(at)


def _infer(server, texts: list[str], **params) -> kpb.ModelInferResponse:
    return kserve_infer(server.address, server.server.engine.translation_model, texts, **params)


def test_kserve_takes_the_split_parameter(server, client):
    for split in ("sentences", "newlines", "none"):
        got = [b.decode() for b in _infer(server, [DOCUMENT], split=split).outputs[0].contents.bytes_contents]
        want = client.translate([DOCUMENT], split=split)[0].text
        assert got == [want], split
    with pytest.raises(grpc.RpcError) as e:
        _infer(server, [DOCUMENT], split="paragraphs")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("parameters.split:"), e.value.details()


def test_model_info_gives_max_text_bytes_and_what_split_means(client):
    limits = client.model_info().limits
    assert limits.max_text_bytes == MAX_BYTES
    assert limits.max_request_bytes == 1_048_576  # MTSERVE_MAX_REQUEST_BYTES's default
    assert "SPLIT_SENTENCES" in limits.zero_means["options.split"]


def test_the_cli_translates_a_document_keeping_its_paragraphs(server, client, tmp_path):
    src, out = tmp_path / "doc.de.txt", tmp_path / "doc.en.txt"
    src.write_text(DOCUMENT, encoding="utf-8")
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    cli.run(p.parse_args(["--server", server.address, "--beam", "2", "--document", str(src), "--output", str(out)]))
    assert out.read_text(encoding="utf-8") == client.translate([DOCUMENT], beam_size=2)[0].text
    cli.run(p.parse_args(["--server", server.address, "--document", str(src), "--split", "none", "--output", str(out)]))
    assert out.read_text(encoding="utf-8") == client.translate([DOCUMENT], split="none")[0].text


def test_metrics_count_texts_segments_and_split_rows(server, client):
    engine = server.server.engine
    labels = {"model": engine.name, "version": engine.version}

    def value(name: str) -> float:
        return server.server.metrics.registry.get_sample_value(name, labels) or 0.0

    before = [value(n) for n in ("mtserve_texts_total", "mtserve_split_rows_total", "mtserve_text_segments_sum")]
    client.translate([DOCUMENT, SENTENCES[0]], beam_size=1)
    after = [value(n) for n in ("mtserve_texts_total", "mtserve_split_rows_total", "mtserve_text_segments_sum")]
    assert [a - b for a, b in zip(after, before)] == [2, 2, 4]  # 3 + 1 segments: 2 rows more than texts
