"""Marked-up text as blocks of plain text with inline tags over them (`parse`).

The tokens (service/engine/markup/tokens.py) are read in order with a stack of open elements.
Each start or end tag of a block element ends the current run of inline content; a run with
words becomes a Block. Inline start and end tags within a run become its Tags, void elements,
comments and invisible elements its Markers, do-not-translate elements inside it its Protected
spans. Everything outside the blocks is never touched, so render copies it as sent.

Repair (HTML only, the default there): an end tag closes the elements opened after its start
tag; an inline element a block end (or the end of the text) leaves open is closed there, its
end tag supplied; an end tag that matches no open element (or whose element lies outside the
enclosing block) is dropped; at the end of the text, open elements get their end tags but where
HTML lets them stay open (and a block's comes before an inline element's that would stand inside
it). Strict: each of these, and every HTML5 parse error html5lib reports, raises MarkupError with
the position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from service.engine.markup.model import Block, Document, Edit, Kind, Marker, MarkupError, Protected, Tag
from service.engine.markup.rules import (
    MAX_DEPTH,
    OPTIONAL_END,
    Element,
    closed_by,
    html_element,
    xml_element,
    xml_inline,
)
from service.engine.markup.tokens import END, START, TEXT, Token, html_tokens, xml_tokens

WHITESPACE = " \t\n\r\f"
# Blocks whose end tag may be left out at the end of the text.
_MAY_STAY_OPEN = OPTIONAL_END | {"html", "head", "body"}


class _Item(NamedTuple):
    """One piece of a run: `what` is text, open, close, marker, protected or drop."""

    what: str
    start: int
    end: int
    markup: str = ""
    data: str = ""
    element: Element | None = None


@dataclass
class _TagDraft:
    element: Element
    start_tag: str
    start: int
    parent: int | None
    order: int
    end_tag: str = ""
    end: int = -1


_TO_SPACE = str.maketrans(dict.fromkeys(WHITESPACE, " "))


@dataclass
class _Text:
    """A block's plain text as it is built: whitespace runs as one space, none at the ends."""

    parts: list[str] = field(default_factory=list)
    size: int = 0
    pending: bool = False  # a space is owed before the next word
    spaced: bool = True  # the text so far ends with a space (or is empty)

    def add(self, data: str) -> None:
        first, *rest = data.translate(_TO_SPACE).split(" ")
        if first:
            self.word(first)
        if rest:  # whitespace after `first`: the words after it, one space apart
            self.pending = not self.spaced
            words = " ".join(filter(None, rest))
            if words:
                self.word(words)
                self.pending = not rest[-1]  # whitespace at the end: a space is owed

    def word(self, text: str) -> None:
        self.space()
        self.parts.append(text)
        self.size += len(text)
        self.spaced = False

    def space(self) -> int:
        """Writes a pending space; the offset where what comes next starts."""
        if self.pending:
            self.parts.append(" ")
            self.size += 1
            self.pending, self.spaced = False, True
        return self.size

    def done(self) -> str:
        return "".join(self.parts).rstrip(" ")


def _collapse(data: str) -> str:
    text = _Text()
    text.add(data)
    return text.done()


class _Builder:
    def __init__(self, source: str, kind: Kind, strict: bool, tokens: list[Token]):
        self.source, self.kind, self.strict, self.tokens = source, kind, strict, tokens
        self.inline = xml_inline(tokens) if kind == "xml" else set()
        self.stack: list[Element] = []
        self.run: list[_Item] = []
        self.snapshot: list[Element] = []
        self.blocks: list[Block] = []
        self.edits: list[Edit] = []
        self.spellings: dict[str, str] = {}
        self.protect: int | None = None  # the stack depth of the open do-not-translate element
        self.protect_text: list[str] = []

    # -- the token loop --------------------------------------------------------------------
    def build(self) -> Document:
        for index, token in enumerate(self.tokens):
            if self.protect is not None:
                self.in_protected(index, token)
            elif token.kind == START:
                self.start(self.element(index, token))
            elif token.kind == END:
                self.end(token)
            elif token.kind == TEXT:
                self.add(_Item("text", token.start, token.end, data=token.data))
                self.spell(token)
            else:
                self.add(_Item("marker", token.start, token.end, self.source[token.start : token.end]))
        self.pop_to(0, None, len(self.source), end_of_text=True)
        self.boundary()
        spellings = tuple(self.spellings.items())
        blocks = tuple(Block(b.text, b.region, b.tags, b.markers, b.protected, spellings) for b in self.blocks)
        return Document(self.source, self.kind, blocks, tuple(self.edits))

    def element(self, index: int, token: Token) -> Element:
        return xml_element(index, token, self.inline) if self.kind == "xml" else html_element(index, token)

    def spell(self, token: Token) -> None:
        """Records how the source wrote a character as a reference (`&nbsp;`), but for a letter or digit."""
        written = self.source[token.start : token.end]
        plain = token.data.isascii() and token.data.isalnum()
        if len(token.data) == 1 and written.startswith("&") and not plain and token.data not in self.spellings:
            self.spellings[token.data] = written

    def add(self, item: _Item) -> None:
        self.run.append(item)

    def start(self, element: Element) -> None:
        token = element.token
        if len(self.stack) >= MAX_DEPTH:
            raise MarkupError(f"elements nested deeper than {MAX_DEPTH}", self.source, token.start)
        if self.kind == "html":
            self.close_implied(element.name, token.start)
        if element.void:
            if element.block:
                self.boundary()
            else:
                self.add(_Item("marker", token.start, token.end, self.source[token.start : token.end]))
            return
        if element.protected:
            if element.block:
                self.boundary()
            self.stack.append(element)
            self.protect, self.protect_text = len(self.stack) - 1, []
            return
        if not element.block:
            self.add(_Item("open", token.start, token.end, self.source[token.start : token.end], element=element))
        self.stack.append(element)
        if element.block:
            self.boundary()

    def implied(self, name: str) -> int | None:
        """HTML's implied end tags: the open element that a start tag `name` ends first (`<li>` an
        open `<li>`, `<div>` an open `<p>`, ...): the lowest of those names reachable from the top
        through inline elements and elements whose end tag HTML lets one leave out."""
        names = closed_by(name) if self.kind == "html" else frozenset()
        found = None
        for index in range(len(self.stack) - 1, -1, -1) if names else ():
            open_element = self.stack[index]
            if open_element.name in names:
                found = index
            elif open_element.block and open_element.name not in OPTIONAL_END:
                break
        return found

    def close_implied(self, name: str, at: int) -> None:
        found = self.implied(name)
        if found is not None:
            self.pop_to(found, None, at)

    def find(self, name: str) -> int | None:
        """The open element an end tag `name` closes: the nearest of that name, unless (for an
        inline element's end tag) a block element lies above it."""
        block_name = any(e.name == name and e.block for e in self.stack)
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index].name == name:
                return index
            if self.stack[index].block and not block_name:
                return None
        return None

    def end(self, token: Token) -> None:
        index = self.find(token.name)
        if index is None:
            if self.strict:
                raise MarkupError(f"end tag </{token.name}> closes no open element", self.source, token.start)
            self.add(_Item("drop", token.start, token.end))
            return
        self.pop_to(index, token, token.start)

    def pop_to(self, index: int, token: Token | None, at: int, end_of_text: bool = False) -> None:
        """Closes the open elements down to `stack[index]`: that one by `token` (None: implied),
        the ones above it implicitly, at `at`. An implicitly closed block gets its end tag
        (repairing) where an inline element's supplied end tag would otherwise stand inside it,
        and at the end of the text unless HTML lets one leave it out."""
        implied: list[Element] = []  # blocks closed here without an end tag
        while len(self.stack) > index:
            element = self.stack.pop()
            explicit = token if len(self.stack) == index else None
            if explicit is None and self.protect is None and not self.strict:
                if element.block and end_of_text and self.kind == "html" and element.name not in _MAY_STAY_OPEN:
                    self.closed(element, None, at)  # what it holds is written first
                    self.edits.append(Edit(at, at, f"</{element.name}>"))
                    continue
                if element.block:
                    implied.append(element)
                elif implied:
                    self.edits += [Edit(at, at, f"</{block.name}>") for block in implied]
                    implied = []
            self.closed(element, explicit, at)

    def closed(self, element: Element, token: Token | None, at: int) -> None:
        if self.protect is not None and len(self.stack) == self.protect:
            self.end_protected(element, token, at)
        elif self.protect is not None:
            return
        elif element.block:
            self.boundary()
        elif token is not None:
            self.add(_Item("close", token.start, token.end, self.source[token.start : token.end], element=element))
        else:
            self.unclosed(element)
            self.add(_Item("close", at, at, f"</{element.name}>", element=element))

    def unclosed(self, element: Element) -> None:
        """An inline element closed without its end tag: repaired, or malformed when strict."""
        if self.strict:
            raise MarkupError(f"<{element.name}> is not closed", self.source, element.token.start)

    # -- do-not-translate elements -----------------------------------------------------------
    def in_protected(self, index: int, token: Token) -> None:
        """Inside a do-not-translate element: only the stack is kept, to find where it ends."""
        assert self.protect is not None
        floor = self.protect
        if token.kind == TEXT:
            self.protect_text.append(token.data)
        elif token.kind == END:
            found = self.find(token.name)
            if found is not None and found > floor:
                del self.stack[found:]
            elif found == floor:
                self.pop_to(found, token, token.start)
            elif found is not None:  # closes an element around the protected one
                self.pop_to(floor, None, token.start)
                self.end(token)
        elif token.kind == START:
            element = self.element(index, token)
            found = self.implied(token.name)
            if found is not None and found <= floor:
                self.pop_to(found, None, token.start)
                self.start(element)
            elif not element.void:
                if len(self.stack) >= MAX_DEPTH:
                    raise MarkupError(f"elements nested deeper than {MAX_DEPTH}", self.source, token.start)
                self.stack.append(element)

    def end_protected(self, element: Element, token: Token | None, at: int) -> None:
        """The do-not-translate element ends: a block one stays as sent (between blocks), an inline
        one becomes a protected span of the run (a marker when it shows no words)."""
        self.protect = None
        if element.block:
            return
        start = element.token.start
        end = token.end if token is not None else at
        markup = self.source[start:end]
        if token is None:
            self.unclosed(element)
            markup += f"</{element.name}>"
        text = _collapse("".join(self.protect_text))
        if element.invisible or not text:
            self.add(_Item("marker", start, end, markup))
        else:
            self.add(_Item("protected", start, end, markup, data=text))

    # -- runs to blocks ----------------------------------------------------------------------
    def boundary(self) -> None:
        items, self.run = self.run, []
        block = _block(self.source, items, self.snapshot) if items else None
        if block is not None:
            self.blocks.append(block)
        else:
            for item in items:
                if item.what == "drop":
                    self.edits.append(Edit(item.start, item.end, ""))
                elif item.what == "close" and item.start == item.end:
                    self.edits.append(Edit(item.start, item.start, item.markup))
        innermost = max((i for i, e in enumerate(self.stack) if e.block), default=-1)
        self.snapshot = [e for e in self.stack[innermost + 1 :] if not e.protected]


def _region(source: str, items: list[_Item]) -> tuple[int, int]:
    """The span of the source a block replaces: its items, less whitespace at either end."""
    starts, ends = [], []
    for item in items:
        start, end = item.start, item.end
        if item.what == "text":
            written = source[start:end]
            start += len(written) - len(written.lstrip(WHITESPACE))
            end -= len(written) - len(written.rstrip(WHITESPACE))
        if start < end:
            starts.append(start)
            ends.append(end)
    return min(starts), max(ends)


def _block(source: str, items: list[_Item], snapshot: list[Element]) -> Block | None:
    """The run's block, or None for a run without words to translate (none, or only protected)."""
    if not any(item.what == "text" and item.data.strip(WHITESPACE) for item in items):
        return None
    named = {item.element.id for item in items if item.element is not None}
    drafts: dict[int, _TagDraft] = {}
    local: list[Element] = []

    def parent() -> int | None:
        return next((e.id for e in reversed(local) if e.id in drafts), None)

    for element in snapshot:
        if element.id in named:
            drafts[element.id] = _TagDraft(element, "", 0, parent(), -1)
        local.append(element)
    text = _Text()
    markers: list[tuple[str, int, int | None, int]] = []
    protected: list[tuple[str, str, int, int | None, int]] = []
    for order, item in enumerate(items):
        if item.what == "text":
            text.add(item.data)
        elif item.what == "open" and item.element is not None:
            drafts[item.element.id] = _TagDraft(item.element, item.markup, text.space(), parent(), order)
            local.append(item.element)
        elif item.what == "close" and item.element is not None:
            draft = drafts[item.element.id]
            draft.end, draft.end_tag = text.size, item.markup
            local.pop() if local[-1] is item.element else local.remove(item.element)
        elif item.what == "marker":
            markers.append((item.markup, text.space(), parent(), order))
        elif item.what == "protected":
            at = text.space()
            text.add(item.data)
            protected.append((item.markup, item.data, at, parent(), order))
    plain = text.done()
    size = len(plain)
    index = {key: i for i, key in enumerate(drafts)}
    tags = tuple(
        Tag(
            d.element.name,
            d.start_tag,
            d.end_tag,
            min(d.start, size),
            size if d.end < 0 else min(d.end, size),
            None if d.parent is None else index[d.parent],
            d.element.token.attributes if d.start_tag else (),
            d.order,
        )
        for d in drafts.values()
    )
    return Block(
        plain,
        _region(source, items),
        tags,
        tuple(Marker(m, min(at, size), None if p is None else index[p], o) for m, at, p, o in markers),
        tuple(Protected(m, t, at, at + len(t), None if p is None else index[p], o) for m, t, at, p, o in protected),
    )


def parse(text: str, kind: Kind = "html", strict: bool | None = None) -> Document:
    """Parses a marked-up text into blocks to translate (see the module's docstring).

    `kind` is "html" (a fragment, the usual case, or a whole page) or "xml". `strict` defaults to
    False for HTML (malformed markup is repaired as the rules above say) and must be True (or
    None) for XML, which is always strict. Malformed markup in strict mode raises MarkupError."""
    if kind == "xml":
        if strict is False:
            raise ValueError("XML is always parsed strictly")
        tokens = xml_tokens(text)
        return _Builder(text, kind, True, tokens).build()
    if kind != "html":
        raise ValueError(f"markup kind must be 'html' or 'xml', not {kind!r}")
    strict = bool(strict)
    return _Builder(text, kind, strict, html_tokens(text, strict)).build()
