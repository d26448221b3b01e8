"""A Translate request whose texts are past `max_request_bytes` cut down before it is parsed.

Such a request is refused (INVALID_ARGUMENT, `texts[i]: texts up to here hold ... bytes, over
max_request_bytes`) at the first text that takes it past the bound, and nothing reads the texts
after that one. Parsing them anyway cost the event loop most of its time under a flood of 4 MB
requests: the protobuf parser copying and checking each string, then a Python str made of each,
all holding the GIL that the decode workers need between their steps. The wire format gives each
text's size without parsing it: `cut_texts` keeps the message's other fields and its texts up to
and including that one as they are, and puts an empty text in place of each later one (so the
request still counts as many texts). The handler then refuses it exactly as before, in the same
order of checks (options, model, number of texts, each text's own bound, then the request's), with
the same message; the only thing the texts past the bound no longer get is the parser's check of
their UTF-8 (a request that is past the bound and also holds invalid UTF-8 there is refused for
its size instead of as a malformed message).

A message that is not a plain sequence of well-formed fields, or holds more than MAX_FIELDS of
them, is left to the parser whole (which refuses what is malformed)."""

from __future__ import annotations

# The fields scanned at most: beyond that, the message is parsed as it is (the scan is a Python loop).
MAX_FIELDS = 1024
_TEXTS = 1  # TranslateRequest.texts: field 1, length-delimited
_EMPTY_TEXT = bytes([_TEXTS << 3 | 2, 0])


def _varint(raw: bytes, at: int, end: int) -> tuple[int, int]:
    """The varint at `raw[at:]` and the offset after it; ValueError if it runs past `end` or 10 bytes."""
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError("varint")
        b = raw[at]
        at += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, at
        shift += 7


def _field(raw: bytes, at: int, end: int) -> tuple[int, int, int]:
    """The field at `raw[at:]`: its number, its wire type (2 for a string) with its payload's
    size (-1 otherwise), and the offset after it; ValueError where the scan does not go (a group,
    field number 0, an unknown wire type, past `end`)."""
    tag, at = _varint(raw, at, end)
    number, wire, size = tag >> 3, tag & 7, -1
    if number == 0:
        raise ValueError("field number 0")
    if wire == 2:
        size, at = _varint(raw, at, end)
        at += size
    elif wire == 0:
        _, at = _varint(raw, at, end)
    elif wire in (1, 5):
        at += 8 if wire == 1 else 4
    else:
        raise ValueError("wire type")
    if at > end:
        raise ValueError("truncated")
    return number, size, at


def cut_texts(raw: bytes, max_request_bytes: int) -> bytes:
    """`raw` (a serialised TranslateRequest) with every text after the one whose bytes take the
    texts past `max_request_bytes` made empty; `raw` itself when they stay within it, or when the
    message is not one the scan reads (left to the parser)."""
    if len(raw) <= max_request_bytes:
        return raw
    end, at, fields, total = len(raw), 0, 0, 0
    keep_to = -1  # the offset after the text past the bound: everything before it is kept as it is
    tail: list[bytes] = []  # after it: the other fields as they are, an empty text for each text
    try:
        while at < end:
            fields += 1
            if fields > MAX_FIELDS:
                return raw
            start = at
            number, size, at = _field(raw, at, end)
            if number != _TEXTS:
                if keep_to >= 0:
                    tail.append(raw[start:at])
            elif size < 0:  # texts with another wire type: malformed, the parser's to refuse
                return raw
            elif keep_to >= 0:
                tail.append(_EMPTY_TEXT)
            else:
                total += size
                if total > max_request_bytes:
                    keep_to = at
    except ValueError:
        return raw
    if keep_to < 0:
        return raw
    return b"".join([memoryview(raw)[:keep_to], *tail])
