"""Marked-up text as a flat list of tokens, each with its span in the source: start tags, end tags,
text (entities decoded), comments and the rest (doctype, processing instructions, XML
declaration). HTML is read by html5lib (the WHATWG HTML5 tokenizer and tree construction, which
also switches the tokenizer for `<script>`, `<style>`, `<textarea>`, `<title>`), XML by expat.

The spans of the tokens tile the source: every character belongs to exactly one token (text that
html5lib drops, such as an unfinished tag at the end, to none). A strict parse raises MarkupError
at the first HTML5 parse error (or XML well-formedness error) with its position.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple
from xml.parsers import expat

from html5lib import _inputstream, _tokenizer, html5parser
from html5lib.constants import E, tokenTypes

from service.engine.markup.model import MarkupError

START, END, TEXT, COMMENT, OTHER = "start", "end", "text", "comment", "other"

# Parse errors that say nothing about the markup's structure: a whole page without a doctype.
_HARMLESS = frozenset(
    {"expected-doctype-but-got-start-tag", "expected-doctype-but-got-chars", "expected-doctype-but-got-eof"}
)
_HTML_TYPES = {
    tokenTypes["StartTag"]: START,
    tokenTypes["EndTag"]: END,
    tokenTypes["Characters"]: TEXT,
    tokenTypes["SpaceCharacters"]: TEXT,
    tokenTypes["Comment"]: COMMENT,
    tokenTypes["Doctype"]: OTHER,
}
_PARSE_ERROR = tokenTypes["ParseError"]
# The element a fragment (XML without declaration or doctype) is parsed inside.
_WRAPPER = "mtserve-fragment"


class Token(NamedTuple):
    """A token and its span `[start, end)` of the source (a named tuple: a sentence's dozen are
    made on every request)."""

    kind: str
    start: int
    end: int
    name: str = ""
    attributes: tuple[tuple[str, str], ...] = ()
    data: str = ""  # text: decoded
    empty: bool = False  # XML `<x/>`: no end token follows


class _Stream(_inputstream.HTMLUnicodeInputStream):
    """The whole text as one chunk, so that the position is an offset into it."""

    _defaultChunkSize = 1 << 62

    def __init__(self, source: str):
        super().__init__(source)
        self.base = 0

    def readChunk(self, chunkSize: int | None = None) -> bool:
        self.base += self.chunkSize
        return bool(super().readChunk(chunkSize))

    def offset(self) -> int:
        return int(self.base + self.chunkOffset)


class _Tokenizer(_tokenizer.HTMLTokenizer):
    """html5lib's tokenizer, recording each token it hands to the tree construction with its span
    (from the end of the previous token to the position after it) and the token being processed."""

    def __init__(self, stream: str, parser: Any = None):
        # HTMLTokenizer.__init__'s state, on our stream (its own would read the text a second time).
        self.stream = _Stream(stream)
        self.parser = parser
        self.escapeFlag = False
        self.lastFourChars: list[str] = []
        self.state = self.dataState
        self.escape = False
        self.currentToken = None
        self.record: list[dict[str, Any]] = []
        self.current = 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.tokenQueue: deque[dict[str, Any]] = deque()
        last = 0
        while self.state():
            while self.stream.errors:
                self.current = self.stream.offset()
                yield {"type": _PARSE_ERROR, "data": self.stream.errors.pop(0)}
            while self.tokenQueue:
                token = self.tokenQueue.popleft()
                now = self.stream.offset()
                if token["type"] == _PARSE_ERROR:
                    self.current = now
                else:
                    token["span"] = (last, now)
                    self.current, last = last, now
                    self.record.append(token)
                yield token
        self.current = self.stream.offset()


class _Parser(html5parser.HTMLParser):
    """html5lib's parser on the recording tokenizer; a parse error raises MarkupError when strict
    and is otherwise repaired as html5lib repairs it (its tree is not used). One per thread, made
    once (`_parser`): making one builds every insertion mode's phase, about as much work as
    parsing a sentence."""

    tokenizer: _Tokenizer

    def __init__(self) -> None:
        super().__init__(strict=False)
        self.source = ""
        self.raise_errors = False

    def release(self) -> None:
        """Drop what the last parse left (its text, tokens and tree), so an idle thread holds none."""
        self.tokenizer = _IDLE
        self.source = ""
        self.tree.reset()

    def _parse(
        self, stream: str, innerHTML: bool = False, container: str = "div", scripting: bool = False, **kwargs: Any
    ) -> None:
        self.innerHTMLMode = innerHTML
        self.container = container
        self.scripting = scripting
        self.tokenizer = _Tokenizer(stream, parser=self)
        self.reset()
        self.mainLoop()

    def parseError(self, errorcode: str = "XXX-undefined-error", datavars: Any = None) -> None:
        if errorcode in _HARMLESS or not self.raise_errors:
            return
        reason = E.get(errorcode, errorcode) % (datavars or {})
        raise MarkupError(reason, self.source, self.tokenizer.current)


# HTML5's whitespace, which the tokenizer reads as space characters before the first token.
_HTML_SPACE = " \t\n\f\r"


def _is_document(text: str) -> bool:
    """Whether the text is a whole page (its first token a doctype or `<html>`), not a fragment.
    A text whose first character after whitespace is not `<`, or is `<` before anything but `!`,
    `?`, `/` or an "h" (a comment, a doctype, an end tag or `<html>` may start there; everything
    else is text or another start tag), is a fragment without running the tokenizer."""
    head = text.lstrip(_HTML_SPACE)[:2]
    if len(head) < 2 or head[0] != "<" or head[1] not in "!?/hH":
        return False
    for token in _tokenizer.HTMLTokenizer(text):
        kind = token["type"]
        if kind in (tokenTypes["SpaceCharacters"], tokenTypes["Comment"], _PARSE_ERROR):
            continue
        return bool(kind == tokenTypes["Doctype"] or (kind == tokenTypes["StartTag"] and token["name"] == "html"))
    return False


# The start tags whose elements switch html5lib's tokenizer to another state (RCDATA, raw text,
# script data, plain text: the tree construction does it) or into foreign content (where CDATA
# sections are read and tokens are adjusted). A text with none of them (and a `<` before any
# other name) is tokenized alike with and without the tree construction, whose tree is not used:
# repaired (not strict), its tokens are the tokenizer's alone, about a third of the work.
_SWITCHING = re.compile(
    r"<(?:script|style|title|textarea|xmp|iframe|noembed|noframes|noscript|plaintext|svg|math)", re.IGNORECASE
)
_IDLE = _Tokenizer("")  # a parser's between parses: it reads nothing
_local = threading.local()


def _parser() -> _Parser:
    """This thread's parser."""
    parser: _Parser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _Parser()
    return parser


def html_tokens(text: str, strict: bool) -> list[Token]:
    """The tokens of an HTML text, a page or (the usual case) a fragment parsed as a `<div>`'s
    content. Carriage returns are read as HTML5 reads them (CR LF and CR as LF); spans are into
    `text` as sent."""
    normal = text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text
    shift = _crlf_shift(text)
    if not strict and not _SWITCHING.search(normal):
        return _tokens(_tokenized(normal), shift)
    return _tokens(_parsed(text, normal, strict, shift), shift)


def _tokenized(normal: str) -> list[dict[str, Any]]:
    """The tokens html5lib's tokenizer alone records."""
    tokenizer = _Tokenizer(normal)
    for _ in tokenizer:
        pass
    return tokenizer.record


def _parsed(text: str, normal: str, strict: bool, shift: Callable[[int], int]) -> list[dict[str, Any]]:
    """The tokens the tokenizer records under html5lib's tree construction (a page's, or a
    fragment's in a `<div>`); strict: MarkupError at the first parse error."""
    parser = _parser()
    parser.source, parser.raise_errors = text, strict
    try:
        if _is_document(normal):
            parser.parse(normal)
        else:
            parser.parseFragment(normal, container="div")
        return parser.tokenizer.record
    except MarkupError as error:
        raise MarkupError(error.reason, text, shift(error.offset)) from None
    finally:
        parser.release()


def _tokens(record: list[dict[str, Any]], shift: Callable[[int], int]) -> list[Token]:
    """The tokenizer's recorded tokens as Tokens, their spans shifted back into the text as sent."""
    tokens: list[Token] = []
    for raw in record:
        kind = _HTML_TYPES.get(raw["type"])
        if kind is None:
            continue
        start, end = shift(raw["span"][0]), shift(raw["span"][1])
        data = raw.get("data")
        attributes = tuple(data.items()) if kind == START and data else ()
        name = str(raw.get("name") or "")
        tokens.append(Token(kind, start, end, name, attributes, data if isinstance(data, str) else ""))
    return tokens


def _crlf_shift(text: str) -> Callable[[int], int]:
    """Maps an offset into the text with each CR LF read as one LF back to an offset into `text`."""
    pairs: list[int] = []
    at = text.find("\r\n")
    while at >= 0:
        pairs.append(at - len(pairs))  # where its LF sits once the CRs before it are gone
        at = text.find("\r\n", at + 2)
    if not pairs:
        return lambda offset: offset
    return lambda offset: offset + bisect.bisect_left(pairs, offset)


def _char_offsets(data: bytes, text: str) -> Callable[[int], int]:
    """Maps a byte offset into `data` (text as UTF-8, at a character boundary) to a character
    offset into `text`; fastest for increasing offsets, as expat reports them."""
    if len(data) == len(text):
        return lambda offset: offset
    last = [0, 0]  # the byte offset and the character offset of the previous call

    def chars(offset: int) -> int:
        byte, char = last if offset >= last[0] else (0, 0)
        char += len(data[byte:offset].decode("utf-8", errors="replace"))
        last[:] = [offset, char]
        return char

    return chars


class _Events:
    """expat's callbacks as (kind, byte offset, name, attributes, data) in source order."""

    def __init__(self, parser: Any):
        self.parser = parser
        self.items: list[tuple[str, int, str, tuple[tuple[str, str], ...], str]] = []
        self.cdata = False
        parser.ordered_attributes = True
        parser.StartElementHandler = self.start
        parser.EndElementHandler = lambda name: self.add(END, name)
        parser.CharacterDataHandler = self.text
        parser.CommentHandler = lambda data: self.add(COMMENT)
        parser.StartCdataSectionHandler = self.start_cdata
        parser.EndCdataSectionHandler = self.end_cdata
        parser.DefaultHandlerExpand = lambda data: self.add(OTHER)
        for name in (
            "ProcessingInstructionHandler",
            "XmlDeclHandler",
            "StartDoctypeDeclHandler",
            "EndDoctypeDeclHandler",
        ):
            setattr(parser, name, lambda *args: self.add(OTHER))

    def add(self, kind: str, name: str = "", attributes: tuple[tuple[str, str], ...] = (), data: str = "") -> None:
        self.items.append((kind, self.parser.CurrentByteIndex, name, attributes, data))

    def start(self, name: str, flat: list[str]) -> None:
        self.add(START, name, tuple(zip(flat[::2], flat[1::2])))

    def text(self, data: str) -> None:
        if self.cdata:  # the section's text joins the token that its `<![CDATA[` opened
            kind, at, name, attributes, before = self.items[-1]
            self.items[-1] = (kind, at, name, attributes, before + data)
        else:
            self.add(TEXT, data=data)

    def start_cdata(self) -> None:
        self.add(TEXT)
        self.cdata = True

    def end_cdata(self) -> None:
        self.cdata = False
        self.add(OTHER, name="]]>")


def _expat(data: bytes) -> tuple[list[tuple[str, int, str, tuple[tuple[str, str], ...], str]], int | None, str]:
    parser = expat.ParserCreate()
    events = _Events(parser)
    try:
        parser.Parse(data, True)
    except expat.ExpatError as error:
        return events.items, parser.ErrorByteIndex, expat.ErrorString(error.code)
    return events.items, None, ""


def xml_tokens(text: str) -> list[Token]:
    """The tokens of an XML text: a document (with its declaration, doctype, processing
    instructions) or, when that is not well-formed and the text has no declaration, a fragment
    (elements and text as inside an element). Malformed XML raises MarkupError."""
    data = text.encode()
    chars = _char_offsets(data, text)
    events, error_at, reason = _expat(data)
    skip = 0
    if error_at is not None and not text.startswith("<?xml"):
        head, tail = f"<{_WRAPPER}>".encode(), f"</{_WRAPPER}>".encode()
        wrapped, wrapped_at, wrapped_reason = _expat(head + data + tail)
        if wrapped_at is None or not text.lstrip().startswith("<!"):  # else a doctype: its error
            events, error_at, reason, skip = wrapped, wrapped_at, wrapped_reason, len(head)
            events = [e for e in events if not (e[0] in (START, END) and e[2] == _WRAPPER)]
            if error_at is not None:
                error_at = min(max(error_at - skip, 0), len(data))
    if error_at is not None:
        raise MarkupError(reason, text, chars(error_at))
    return _xml_spans(events, skip, len(data), chars)


def _xml_spans(
    events: list[tuple[str, int, str, tuple[tuple[str, str], ...], str]],
    skip: int,
    size: int,
    chars: Callable[[int], int],
) -> list[Token]:
    tokens: list[Token] = []
    ends = [at - skip for _, at, *_ in events[1:]] + [size]
    for (kind, at, name, attributes, data), end in zip(events, ends):
        start = at - skip
        if kind == OTHER and name == "]]>" and tokens and tokens[-1].kind == TEXT:
            last = tokens.pop()  # the CDATA section as one text token
            tokens.append(Token(TEXT, last.start, chars(end), data=last.data))
            continue
        if kind == END and end == start and tokens and tokens[-1].kind == START:
            last = tokens.pop()
            tokens.append(Token(START, last.start, last.end, last.name, last.attributes, empty=True))
            continue
        tokens.append(Token(kind, chars(start), chars(end), name, attributes, data))
    return tokens
