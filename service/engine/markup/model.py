"""What parsing a marked-up text gives: the document (its source and its blocks), each block's plain
text with the inline tags over it, and the error for malformed markup.

Offsets are Unicode code points (Python string indices), end exclusive: `Block.region` into the
source text, `Tag.start`/`Tag.end`, `Marker.at` and `Protected.start`/`end` into `Block.text`.
Markup (`Tag.start_tag`, `Marker.markup`, `Protected.markup`) is the source's text byte for byte,
except an end tag the repair supplied (`Tag.end_tag` of an element the source left open).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from service.engine.terms import Match, Term

Kind = Literal["html", "xml"]
KINDS: tuple[Kind, ...] = ("html", "xml")


class MarkupError(ValueError):
    """Malformed markup: `offset` into the text, `line` and `column` counted from 1, `reason` the
    parser's words. The engine reports it as INVALID_ARGUMENT naming the text and the position."""

    def __init__(self, reason: str, text: str, offset: int):
        offset = max(0, min(offset, len(text)))
        self.reason = reason
        self.offset = offset
        self.line = text.count("\n", 0, offset) + 1
        self.column = offset - (text.rfind("\n", 0, offset) + 1) + 1
        super().__init__(f"malformed markup at line {self.line}, column {self.column}: {reason}")


@dataclass(frozen=True)
class Tag:
    """An inline element within a block, covering `Block.text[start:end]`. `parent` is the index in
    `Block.tags` of the tag around it (None: none). An element opened before the block (in an earlier
    block or between blocks) has `start_tag == ""` and starts at 0; one that stays open after it has
    `end_tag == ""` and ends at the end: render emits only the tags that lie within the block."""

    name: str
    start_tag: str
    end_tag: str
    start: int
    end: int
    parent: int | None
    attributes: tuple[tuple[str, str], ...] = ()
    order: int = 0  # position among the block's items in source order

    @property
    def opened_before(self) -> bool:
        return self.start_tag == ""

    @property
    def open_after(self) -> bool:
        return self.end_tag == ""


@dataclass(frozen=True)
class Marker:
    """Markup without words that sits between words: a void element (`<img>`, `<wbr>`), a comment,
    `<script>`/`<style>`, an empty do-not-translate element. It travels with the word it preceded
    (the word starting at `at`), inside the tag `parent`."""

    markup: str
    at: int
    parent: int | None
    order: int = 0


@dataclass(frozen=True)
class Protected:
    """A do-not-translate element inside a sentence (`translate="no"`, `class="notranslate"`,
    `<code>`, ...): `Block.text[start:end] == text` is its words, which the translation must carry
    verbatim; `markup` (its source, tags included) replaces them in the output."""

    markup: str
    text: str
    start: int
    end: int
    parent: int | None
    order: int = 0


@dataclass(frozen=True)
class Block:
    """One segment of the document to translate: `text` is its plain text (tags taken out, entities
    decoded, whitespace runs as one space, no leading or trailing whitespace); `region` is the span
    of the source it replaces on render. `spellings` maps a character to the character reference
    the source wrote for it (`\\xa0` -> `&nbsp;`), so that a translation writes it the same way."""

    text: str
    region: tuple[int, int]
    tags: tuple[Tag, ...] = ()
    markers: tuple[Marker, ...] = ()
    protected: tuple[Protected, ...] = ()
    spellings: tuple[tuple[str, str], ...] = ()

    def do_not_translate(self) -> tuple[Match, ...]:
        """The protected spans as the engine's do-not-translate matches (service/engine/terms.py):
        each keeps its text verbatim at its span of `text`."""
        return tuple(Match(p.start, p.end, Term(p.text, ""), p.text) for p in self.protected)


@dataclass(frozen=True)
class Edit:
    """A repair outside every block: the source's `[start, end)` replaced by `text` (an end tag
    the source left out, inserted; a stray end tag, removed)."""

    start: int
    end: int
    text: str


@dataclass(frozen=True)
class Document:
    """A parsed text: `source` as sent, its `blocks` in order (disjoint regions), and the repairs
    (`edits`, empty for well-formed markup) that render applies around them."""

    source: str
    kind: Kind
    blocks: tuple[Block, ...]
    edits: tuple[Edit, ...] = ()
