"""HTML and XML kept intact through translation.

`parse(text, kind)` cuts a marked-up text into blocks (segments: the content between block
elements' tags) of plain text with their inline tags; the engine translates each `Block.text`
(splitting it into sentences as usual; `Block.protected` are the do-not-translate spans it must
carry verbatim) and `project(block, translation, alignment)` puts the block's tags back around the
translated words; `render(document, projected)` writes the whole text, everything outside the
blocks as sent. docs/markup.md describes the behaviour.

Malformed markup: HTML is repaired by default (`parse(text, "html")`; `strict=True` raises
MarkupError instead), XML is always strict.
"""

from service.engine.markup.alignment import Alignment
from service.engine.markup.model import KINDS, Block, Document, Edit, Kind, Marker, MarkupError, Protected, Tag
from service.engine.markup.parse import parse
from service.engine.markup.project import locate, project
from service.engine.markup.render import render

__all__ = [
    "KINDS",
    "Alignment",
    "Block",
    "Document",
    "Edit",
    "Kind",
    "Marker",
    "MarkupError",
    "Protected",
    "Tag",
    "locate",
    "parse",
    "project",
    "render",
]
