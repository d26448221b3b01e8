"""A Translate request whose texts are past max_request_bytes is cut before it is parsed
(service.grpc.oversize): the texts after the one past the bound become empty, everything else
stays as it was, and what the scan cannot read is left whole to the parser."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf.message import DecodeError

from service.api.mtserve.v1 import translation_pb2 as pb
from service.grpc.oversize import MAX_FIELDS, cut_texts

BOUND = 1000


def _cut(msg: pb.TranslateRequest) -> pb.TranslateRequest:
    return pb.TranslateRequest.FromString(cut_texts(msg.SerializeToString(), BOUND))


def test_texts_after_the_one_past_the_bound_become_empty_and_the_rest_is_kept():
    msg = pb.TranslateRequest(
        texts=["a" * 400, "ü" * 200, "b" * 300, "c" * 500, "d" * 600],  # 400, 800, 1100: past at texts[2]
        options=pb.TranslationOptions(beam_size=3, return_scores=True),
        model="de-en:1",
        source_language="de",
        target_language="en",
        target_prefixes=["The", "A"],
    )
    cut = _cut(msg)
    assert list(cut.texts) == ["a" * 400, "ü" * 200, "b" * 300, "", ""]
    expected = pb.TranslateRequest()
    expected.CopyFrom(msg)
    del expected.texts[:]
    expected.texts.extend(cut.texts)
    assert cut == expected


def test_fields_in_any_order_and_unknown_fields_are_kept():
    texts = pb.TranslateRequest(texts=["x" * 600, "y" * 600, "z" * 10]).SerializeToString()
    model = pb.TranslateRequest(model="m").SerializeToString()
    unknown = bytes([15 << 3 | 0, 7]) + bytes([13 << 3 | 5]) + b"\0\0\0\0" + bytes([14 << 3 | 1]) + b"\0" * 8
    raw = model + texts + unknown + model
    cut = cut_texts(raw, BOUND)
    assert cut.startswith(model) and cut.endswith(unknown + model)
    msg = pb.TranslateRequest.FromString(cut)
    assert list(msg.texts) == ["x" * 600, "y" * 600, ""] and msg.model == "m"


@pytest.mark.parametrize(
    "texts",
    [
        ["a" * 500, "b" * 500],  # exactly at the bound: within it
        ["a" * 10] * 3,
    ],
)
def test_texts_within_the_bound_leave_the_message_as_it_is(texts):
    raw = pb.TranslateRequest(texts=texts, model="m" * 2000).SerializeToString()
    assert cut_texts(raw, BOUND) is raw


def test_a_text_past_the_bound_whose_later_texts_are_not_utf8_is_cut_before_the_parser_sees_them():
    raw = pb.TranslateRequest(texts=["a" * 1200]).SerializeToString() + bytes([1 << 3 | 2, 2, 0xFF, 0xFE])
    with pytest.raises(DecodeError):
        pb.TranslateRequest.FromString(raw)
    assert list(pb.TranslateRequest.FromString(cut_texts(raw, BOUND)).texts) == ["a" * 1200, ""]


@pytest.mark.parametrize(
    "tail",
    [
        bytes([1 << 3 | 2, 0x80]),  # a length that never ends
        bytes([1 << 3 | 2, 50]) + b"short",  # a length past the end
        bytes([1 << 3 | 0, 1]),  # texts as a varint
        bytes([3 << 3 | 3]),  # a group
        bytes([0 << 3 | 2, 0]),  # field number 0
        bytes([2 << 3 | 1]) + b"\0",  # a fixed64 cut short
    ],
)
def test_what_the_scan_cannot_read_is_left_whole_to_the_parser(tail):
    raw = pb.TranslateRequest(texts=["a" * 1200]).SerializeToString() + tail
    assert cut_texts(raw, BOUND) is raw


def test_a_message_of_more_fields_than_the_scan_reads_is_left_whole():
    raw = pb.TranslateRequest(texts=["a" * 1200] + [""] * MAX_FIELDS).SerializeToString()
    assert cut_texts(raw, BOUND) is raw
    raw = pb.TranslateRequest(texts=["a" * 1200] + [""] * (MAX_FIELDS - 1)).SerializeToString()
    assert len(pb.TranslateRequest.FromString(cut_texts(raw, BOUND)).texts) == MAX_FIELDS


# -- through a server: the same answers, in the same order of checks, as the whole request got --

TRANSLATE = "/mtserve.v1.TranslationService/Translate"


@pytest.fixture(scope="module")
def small_server(make_server):
    return make_server(max_request_bytes=BOUND, max_text_bytes=600, max_texts_per_request=8)


def _answer(server, raw: bytes) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(server.address) as ch:
        try:
            ch.unary_unary(TRANSLATE)(raw, timeout=30)
            return grpc.StatusCode.OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details()


@pytest.mark.parametrize(
    ("texts", "expected"),
    [
        (["a" * 500] * 5, "texts[2]: texts up to here hold 1500 bytes, over max_request_bytes (1000)"),
        (["a" * 500, "b" * 700] + ["c" * 500] * 3, "texts[1]: text exceeds max_text_bytes (600): 700 bytes"),
        (["a" * 500] * 9, "texts: 9 texts exceed max_texts_per_request (8)"),
    ],
)
def test_a_request_past_the_bound_is_refused_as_before(small_server, texts, expected):
    code, details = _answer(small_server, pb.TranslateRequest(texts=texts).SerializeToString())
    assert (code, details) == (grpc.StatusCode.INVALID_ARGUMENT, expected)


def _both(server, raw: bytes) -> tuple[tuple[grpc.StatusCode, str], tuple[grpc.StatusCode, str]]:
    """The answer to `raw` cut, and parsed whole."""
    cut = server.server.rpcs.cut
    try:
        server.server.rpcs.cut = None
        whole = _answer(server, raw)
    finally:
        server.server.rpcs.cut = cut
    return _answer(server, raw), whole


@pytest.mark.parametrize(
    "fields",
    [
        {"texts": ["a" * 500] * 5},
        {"texts": ["a" * 500] * 5, "options": pb.TranslationOptions(beam_size=99)},
        {"texts": ["a" * 500] * 5, "model": "no-such-model"},
        {"texts": ["a" * 500] * 5, "source_language": "xx", "target_language": "yy"},
        {"texts": ["a" * 500, "b" * 700] + ["c" * 500] * 3},
        {"texts": ["a" * 500] * 9},
        {"texts": ["a" * 500] * 2 + [""] + ["a" * 500], "target_prefixes": ["The"] * 4},
        {"texts": ["a" * 400, "a" * 400], "target_prefixes": ["T" * 300] * 2},  # the prefixes past the bound
    ],
)
def test_the_answer_is_the_one_the_whole_request_gets(small_server, fields):
    cut, whole = _both(small_server, pb.TranslateRequest(**fields).SerializeToString())
    assert whole[0] != grpc.StatusCode.OK and cut == whole


def test_invalid_utf8_after_the_text_past_the_bound_is_refused_for_the_size(small_server):
    raw = pb.TranslateRequest(texts=["a" * 600, "b" * 500]).SerializeToString() + bytes([1 << 3 | 2, 2, 0xFF, 0xFE])
    code, details = _answer(small_server, raw)
    assert (code, details) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "texts[1]: texts up to here hold 1100 bytes, over max_request_bytes (1000)",
    )
    code, details = _answer(small_server, bytes([1 << 3 | 2, 2, 0xFF, 0xFE]) + raw)  # before it: malformed
    assert code == grpc.StatusCode.INVALID_ARGUMENT and details.startswith("request: not a valid protobuf message")
