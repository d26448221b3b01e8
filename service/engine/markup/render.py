"""The translated document (`render`): the source as sent, each block's region replaced by its
projected translation and the repairs (`Document.edits`) applied; nothing else changes."""

from __future__ import annotations

from collections.abc import Sequence

from service.engine.markup.model import Document


def render(document: Document, blocks: Sequence[str]) -> str:
    """`blocks[i]` is `project(document.blocks[i], ...)`: the markup that replaces block i."""
    if len(blocks) != len(document.blocks):
        raise ValueError(f"{len(blocks)} translations for {len(document.blocks)} blocks")
    edits = [(b.region[0], b.region[1], text) for b, text in zip(document.blocks, blocks)]
    edits += [(e.start, e.end, e.text) for e in document.edits]
    edits.sort(key=lambda edit: (edit[0], edit[1]))
    out, at = [], 0
    for start, end, text in edits:
        out += [document.source[at:start], text]
        at = max(at, end)
    out.append(document.source[at:])
    return "".join(out)
