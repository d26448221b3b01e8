"""A block's inline markup put back around its translation (`project`), as Bergamot's HTML mode
does it: each target word inherits the tags of the source token that its first subword aligns
to, and a tag never lands inside a word.

Words are the target's whitespace-separated runs (a do-not-translate span with spaces in it is one
word). Each tag then covers one contiguous run of target words: top down, the children of each tag
(in the target order of the words they want) get disjoint runs inside their parent's, chosen by
dynamic programming to keep as many words as possible under the tag their alignment asks for. A
tag that no word wants stays, empty, where the words around its source position went; void
elements, comments and the like go before the first target word aligned to the source word they
preceded. Every tag, marker and protected span of the block is written exactly once, well nested.
"""

from __future__ import annotations

import bisect
import itertools
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from service.engine.markup.alignment import Alignment
from service.engine.markup.arrangement import DIRECT, FREE, Arrangement
from service.engine.markup.model import Block, Tag

ROOT = -1
_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_RUN = re.compile(r"\S+")  # \s is str.isspace's whitespace


@dataclass(frozen=True)
class _Zero:
    """Something without words in the output: a marker, an empty tag, an unplaced protected span."""

    at: int
    order: int
    markup: str = ""
    tag: int | None = None


class _Projection:
    def __init__(self, block: Block, target: str, alignment: Alignment, protected: Sequence[tuple[int, int] | None]):
        self.block, self.target, self.alignment = block, target, alignment
        self.escapes = str.maketrans({**_ESCAPES, **dict(block.spellings)})
        self.placed = {i: span for i, span in enumerate(protected) if span is not None}
        cuts = {start for (start, _), first in zip(alignment.target, alignment.word_starts) if first}
        self.units = _units(target, list(self.placed.values()), cuts)
        self.depth = [self.tag_depth(i) for i in range(len(block.tags))]
        self.children: dict[int, list[int]] = {ROOT: []}
        for i, tag in enumerate(block.tags):
            self.children.setdefault(i, [])
            self.children[ROOT if tag.parent is None else tag.parent].append(i)
        self.first_link = self.unit_links()
        # For each source token the first and the last unit aligned to it.
        self.first_unit: dict[int, int] = {}
        self.last_unit: dict[int, int] = {}
        for u, link in enumerate(self.first_link):
            self.first_unit.setdefault(link, u)
            self.last_unit[link] = u
        self.anchors: dict[int, int] = {}
        self.by_end = sorted(range(len(alignment.source)), key=lambda t: alignment.source[t][1])
        self.source_ends = [alignment.source[t][1] for t in self.by_end]
        # The source tokens by start, and the last unit aligned to any of the first i of them.
        by_start = sorted(range(len(alignment.source)), key=lambda t: alignment.source[t][0])
        self.source_starts = [alignment.source[t][0] for t in by_start]
        self.last_before = list(itertools.accumulate((self.last_unit.get(t, -1) for t in by_start), max, initial=-1))
        self.wants = [self.unit_wants(u) for u in range(len(self.units))]
        self.interval: dict[int, tuple[int, int]] = {ROOT: (0, len(self.units))}
        self.zero: dict[int, list[_Zero]] = {}

    # -- what each target word wants -------------------------------------------------------
    def tag_depth(self, index: int) -> int:
        depth, parent = 0, self.block.tags[index].parent
        while parent is not None:
            depth, parent = depth + 1, self.block.tags[parent].parent
        return depth

    def unit_links(self) -> list[int]:
        """Each unit's first target token's link (-1: no token overlaps it, or no link)."""
        tokens = sorted(zip(self.alignment.target, self.alignment.links))
        links, first = [], 0
        for start, end in self.units:
            while first < len(tokens) and tokens[first][0][1] <= start:
                first += 1
            hit = first < len(tokens) and tokens[first][0][0] < end and tokens[first][0][1] > start
            links.append(tokens[first][1] if hit else -1)
        return links

    def deepest(self, offset: int) -> int:
        best, depth = ROOT, -1
        for i, tag in enumerate(self.block.tags):
            if tag.start <= offset < tag.end and self.depth[i] > depth:
                best, depth = i, self.depth[i]
        return best

    def unit_wants(self, u: int) -> int | None:
        """The tag (ROOT: none) that unit u's words belong in; None: no alignment says."""
        start = self.units[u][0]
        for i, (p_start, _) in self.placed.items():
            if p_start == start:
                parent = self.block.protected[i].parent
                return ROOT if parent is None else parent
        link = self.first_link[u]
        if link < 0:
            return None
        s_start, s_end = self.alignment.source[link]
        text = self.block.text
        while s_start < s_end - 1 and text[s_start : s_start + 1].isspace():
            s_start += 1
        return self.deepest(s_start)

    def anchor(self, offset: int) -> int:
        """Where something that stood before source offset `offset` goes: before the first target
        word aligned to the first source token at or after it (else after the last word aligned
        to one before it)."""
        if offset not in self.anchors:
            self.anchors[offset] = self.find_anchor(offset)
        return self.anchors[offset]

    def find_anchor(self, offset: int) -> int:
        # The source tokens from the one that holds `offset` (or the first after it) on.
        first = bisect.bisect_right(self.source_ends, offset)
        for t in self.by_end[first:]:
            if t in self.first_unit:
                return self.first_unit[t]
        last = self.last_before[bisect.bisect_left(self.source_starts, offset)]
        if last >= 0:
            return last + 1
        size = max(len(self.block.text), 1)
        return round(offset / size * len(self.units))

    # -- placing the tags --------------------------------------------------------------------
    def child_of(self, node: int, wanted: int | None) -> int | None:
        """The child of `node` on the way to `wanted`; DIRECT for `node` itself; None outside."""
        if wanted is None:
            return None
        if wanted == node:
            return DIRECT
        while wanted != ROOT:
            parent = self.block.tags[wanted].parent
            parent = ROOT if parent is None else parent
            if parent == node:
                return wanted
            wanted = parent
        return None

    def place(self, node: int) -> None:
        lo, hi = self.interval[node]
        children = self.children[node]
        if not children:
            return
        wanted = {u: self.child_of(node, self.wants[u]) for u in range(lo, hi)}
        positions: dict[int | None, list[int]] = {}
        for u, child in wanted.items():
            positions.setdefault(child, []).append(u)
        tags = self.block.tags

        def key(child: int) -> tuple[int, float, int]:
            tag = tags[child]
            mine = positions.get(child)
            at = _median(mine) if mine else float(self.clamp(self.anchor(tag.start), lo, hi))
            return (0 if tag.opened_before else 2 if tag.open_after else 1, at, tag.order)

        ordered = sorted(children, key=key)
        rank = {child: j for j, child in enumerate(ordered)}
        labels = [_label(wanted[u], rank) for u in range(lo, hi)]
        anchors = [self.clamp(self.anchor(tags[c].start), lo, hi) for c in ordered]
        first_fixed = tags[ordered[0]].opened_before
        last_fixed = tags[ordered[-1]].open_after
        spans = Arrangement(labels, anchors, lo, hi, first_fixed, last_fixed).spans()
        for child, span in zip(ordered, spans):
            self.interval[child] = span
            self.place(child)

    @staticmethod
    def clamp(at: int, lo: int, hi: int) -> int:
        return min(max(at, lo), hi)

    def zero_width(self) -> None:
        block = self.block
        for i, tag in enumerate(block.tags):
            start, end = self.interval[i]
            if start == end:
                self.add_zero(ROOT if tag.parent is None else tag.parent, _Zero(start, tag.order, tag=i))
        for marker in block.markers:
            self.add_zero(marker.parent, _Zero(self.anchor(marker.at), marker.order, marker.markup))
        for i, protected in enumerate(block.protected):
            if i not in self.placed:
                self.add_zero(protected.parent, _Zero(self.anchor(protected.start), protected.order, protected.markup))

    def add_zero(self, parent: int | None, item: _Zero) -> None:
        node = ROOT if parent is None else parent
        lo, hi = self.interval[node]
        self.zero.setdefault(node, []).append(_Zero(self.clamp(item.at, lo, hi), item.order, item.markup, item.tag))

    # -- writing -----------------------------------------------------------------------------
    def escape(self, text: str) -> str:
        return text.translate(self.escapes)

    def word(self, u: int) -> str:
        start, end = self.units[u]
        if not self.placed:
            return self.target[start:end].translate(self.escapes)
        out, at = [], start
        for i, (p_start, p_end) in sorted(self.placed.items(), key=lambda item: item[1]):
            if start <= p_start < end:
                out += [self.escape(self.target[at:p_start]), self.block.protected[i].markup]
                at = p_end
        out.append(self.escape(self.target[at:end]))
        return "".join(out)

    def emit(self, node: int) -> str:
        """The node's markup: its start tag, then in unit order each position's zero-width items,
        each child's markup and the words (the target's text between them escaped in one piece),
        then its end tag."""
        tag: Tag | None = None if node == ROOT else self.block.tags[node]
        lo, hi = self.interval[node]
        units, target = self.units, self.target
        starts = {
            self.interval[c][0]: c for c in self.children.get(node, []) if self.interval[c][0] < self.interval[c][1]
        }
        zero: dict[int, list[_Zero]] = {}
        for item in sorted(self.zero.get(node, []), key=lambda z: z.order):
            zero.setdefault(self.outside(item.at, starts), []).append(item)
        protected = {u for u in range(lo, hi) if self.holds_placed(u)} if self.placed else set()
        out = [tag.start_tag if tag else ""]
        text = -1  # where the target's text not yet written starts (-1: none)
        u = lo
        while True:
            items = zero.get(u)
            stop = u >= hi
            if text >= 0 and (items or stop or u in starts or u in protected):
                out.append(self.escape(target[text : units[u][0] if not stop else units[hi - 1][1]]))
                text = -1
            if items:
                out += [self.emit(z.tag) if z.tag is not None else z.markup for z in items]
            if stop:
                break
            if u in starts:
                out.append(self.emit(starts[u]))
                u = self.interval[starts[u]][1]
                text = units[u - 1][1] if u < hi else -1  # the text between the child and what follows
            elif u in protected:
                out.append(self.word(u))
                u += 1
                text = units[u - 1][1] if u < hi else -1
            else:
                if text < 0:
                    text = units[u][0]
                u += 1
        out.append(tag.end_tag if tag else "")
        return "".join(out)

    def holds_placed(self, u: int) -> bool:
        """Whether unit u holds a placed protected span (written by `word`, its markup and all)."""
        start, end = self.units[u]
        return any(start <= p_start < end for p_start, _ in self.placed.values())

    def outside(self, at: int, starts: dict[int, int]) -> int:
        """A boundary inside one of the children's runs moved to the nearer end of that run."""
        for child in starts.values():
            start, end = self.interval[child]
            if start < at < end:
                return start if at - start <= end - at else end
        return at

    def render(self) -> str:
        self.place(ROOT)
        self.zero_width()
        body = self.emit(ROOT)
        if not self.units:
            return self.escape(self.target) + body
        head = self.escape(self.target[: self.units[0][0]])
        tail = self.escape(self.target[self.units[-1][1] :])
        return head + body + tail


def _median(ordered: list[int]) -> float:
    """statistics.median of a sorted list (the middle one, or the mean of the middle two)."""
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _label(child: int | None, rank: dict[int, int]) -> int:
    return FREE if child is None else DIRECT if child == DIRECT else rank[child]


def _units(target: str, protected: list[tuple[int, int]], cuts: set[int]) -> list[tuple[int, int]]:
    """The target's words: runs without whitespace, cut where a token begins a word (`cuts`), a
    protected span (spaces and all) within one."""
    units: list[tuple[int, int]] = []
    if not protected:
        ordered = sorted(cuts)
        for run in _RUN.finditer(target):
            i, end = run.span()
            k = bisect.bisect_right(ordered, i)
            while k < len(ordered) and ordered[k] < end:
                units += _split_punctuation(target, i, ordered[k], False)
                i = ordered[k]
                k += 1
            units += _split_punctuation(target, i, end, False)
        return units
    inside = [False] * len(target)
    for start, end in protected:
        for i in range(start, end):
            inside[i] = True
    i, size = 0, len(target)
    while i < size:
        if target[i].isspace() and not inside[i]:
            i += 1
            continue
        j = i + 1
        while j < size and (inside[j] or not (target[j].isspace() or j in cuts)):
            j += 1
        units += _split_punctuation(target, i, j, any(inside[i:j]))
        i = j
    return units


def _split_punctuation(target: str, start: int, end: int, protected: bool) -> list[tuple[int, int]]:
    """A run's leading and trailing punctuation as units of their own ("dog." is "dog" and "."),
    so that a tag can close before a full stop; a run with a protected span stays whole."""
    if protected:
        return [(start, end)]
    core_start, core_end = start, end
    while core_start < core_end and unicodedata.category(target[core_start]).startswith("P"):
        core_start += 1
    while core_end > core_start and unicodedata.category(target[core_end - 1]).startswith("P"):
        core_end -= 1
    if core_start == core_end:
        return [(start, end)]
    spans = [(start, core_start), (core_start, core_end), (core_end, end)]
    return [(a, b) for a, b in spans if a < b]


def project(
    block: Block, target: str, alignment: Alignment, protected: Sequence[tuple[int, int] | None] | None = None
) -> str:
    """The block's translation `target` with the block's inline markup put back (see the module's
    docstring), as render takes it. `protected[i]` is where `block.protected[i]` sits in the target
    (its text verbatim), None where it is missing; when not given, each is looked for in the target.
    A protected span not found is kept, as a marker, where its alignment puts it."""
    if protected is None:
        protected = locate(block, target, alignment)
    if len(protected) != len(block.protected):
        raise ValueError(f"{len(protected)} target spans for {len(block.protected)} protected spans")
    return _Projection(block, target, alignment, protected).render()


def locate(block: Block, target: str, alignment: Alignment) -> list[tuple[int, int] | None]:
    """Where each protected span's text occurs in the target: the occurrence whose first token
    aligns inside the span in the source, else the first one not taken."""
    taken: list[tuple[int, int]] = []
    found: list[tuple[int, int] | None] = []
    for protected in block.protected:
        spans = []
        at = target.find(protected.text)
        while at >= 0 and protected.text:
            span = (at, at + len(protected.text))
            if not any(s < span[1] and span[0] < e for s, e in taken):
                spans.append(span)
            at = target.find(protected.text, at + 1)
        chosen = next((s for s in spans if _aligned_inside(s, protected.start, protected.end, alignment)), None)
        chosen = chosen or (spans[0] if spans else None)
        if chosen is not None:
            taken.append(chosen)
        found.append(chosen)
    return found


def _aligned_inside(span: tuple[int, int], start: int, end: int, alignment: Alignment) -> bool:
    for (t_start, t_end), link in zip(alignment.target, alignment.links):
        if t_start < span[1] and t_end > span[0]:
            return link >= 0 and start <= alignment.source[link][0] < end
    return False
