"""Marked-up texts on the request path (TranslateOptions.text_type "html" or "xml"): each text is
parsed into blocks (service.engine.markup), the blocks of all the request's texts go through the
plain path together, in one call (split as options.split says, so they batch together), with the
decoder's alignment, and each block's inline markup is put back around its translation by that
alignment (Bergamot's way); the rest of the markup comes back as sent. docs/markup.md describes
the behaviour.

The alignment of a block: its source tokens' spans in `Block.text` come from the tokenizer's
offsets on each segment's normalised text, mapped back through the normalisation; its target
tokens' spans from decoding each row's tokens one more at a time; each target token's link is the
one-to-one link of `token_alignment.links` over its attention (a multilingual model's language token and </s>
left out).

A do-not-translate element inside a sentence (`Block.protected`) is a do-not-translate term of
origin "markup" (service.engine.glossary): the search forces its words verbatim where the model
translates them, and `project` writes the element's markup where they landed.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import numpy as np

from service.batching.jobs import Sentence
from service.decoding.results import Finished
from service.engine import documents
from service.engine.glossary import MARKUP, TermPlan
from service.engine.inference import Inference
from service.engine.languages import LanguagePair, ModelLanguages
from service.engine.markup import Alignment, Block, Document, Kind, MarkupError, parse, project, render
from service.engine.requests import TEXT, TEXT_TYPES, AppliedTerm, Segment, TranslateOptions, TranslationResult
from service.engine.terms import Match
from service.engine.text import normalize_text, normalize_with_offsets
from service.engine.token_alignment import links as links_of
from service.engine.token_alignment import source_span, target_spans
from service.engine.work import Checkpoint, TextWork
from service.errors import InvalidArgument, quote
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer

T = TypeVar("T")
Finish = Callable[[list[documents.Plan], list[list[int]], list[Finished], TermPlan | None], list[T]]
_INDEX = re.compile(r"texts\[(\d+)\]")


class MarkupEngine(Protocol):
    """What this module needs of service.engine.engine.Engine."""

    tokenizer: TextTokenizer
    work: TextWork
    metrics: ModelMetrics
    translation_model: str
    languages: ModelLanguages

    def check_texts(self, texts: list[str]) -> None: ...

    def check_sizes(
        self, texts: list[str], field: str = "texts", prefixes: list[str] | None = None, prefix_field: str = ""
    ) -> int: ...

    def count_texts(
        self, plans: list[documents.Plan], groups: Sequence[int] | None = None, text_type: str = TEXT
    ) -> None: ...

    def result(self, src: list[int], finished: Finished, opts: TranslateOptions) -> TranslationResult: ...

    def trace(self, model: str, sentences: list[Sentence] | None = None, texts: int = 0) -> None: ...

    async def translate_rows(
        self,
        texts: list[str],
        opts: TranslateOptions,
        timeout: float | None,
        pair: LanguagePair,
        field_prefix: str,
        inference: Inference,
        finish: Finish[T],
        groups: Sequence[int] | None = None,
        text_type: str = TEXT,
        terms: list[tuple[Match, ...]] | None = None,
    ) -> list[T]: ...

    def applied_terms(
        self,
        found: TermPlan | None,
        plans: list[documents.Plan],
        rows: list[TranslationResult],
        finished: list[Finished],
        results: list[TranslationResult],
        split: str,
    ) -> None: ...


def markup_kind(opts: TranslateOptions, field_prefix: str = "") -> Kind | None:
    """The markup `opts.text_type` names (None: plain text); INVALID_ARGUMENT for an unknown one."""
    if opts.text_type == TEXT:
        return None
    if opts.text_type == "html":
        return "html"
    if opts.text_type == "xml":
        return "xml"
    raise InvalidArgument(
        f"{field_prefix}options.text_type", f"{quote(opts.text_type)} is not one of {', '.join(TEXT_TYPES)}"
    )


def _check_options(opts: TranslateOptions, field_prefix: str, kind: Kind) -> None:
    """What a marked-up text cannot have: an n-best list and target prefixes (plain text, where
    the translation is markup)."""
    if opts.num_hypotheses > 1:
        raise InvalidArgument(f"{field_prefix}options.num_hypotheses", f"n-best lists are not given for {kind}")
    if opts.target_prefix or any(opts.target_prefixes):
        name = f"{field_prefix}target_prefix{'es' if opts.target_prefixes else ''}"
        raise InvalidArgument(name, f"target prefixes are not taken for {kind}")


@dataclass(frozen=True)
class _Piece:
    """A block's text to translate, stripped (`start`: where it begins in Block.text). `row` is
    its index among the texts of the plain call; None: kept as it is (no letter or digit to
    translate)."""

    start: int  # in Block.text
    text: str
    row: int | None


def _parts(block: Block, rows: list[str], terms: list[tuple[Match, ...]], aligned: list[bool]) -> list[_Piece]:
    """The block's piece (none for a block of whitespace); a piece to translate is appended to
    `rows`, its protected spans (as do-not-translate matches in the piece's text) to `terms`, and
    to `aligned` whether it has markup to place (tags, markers, protected spans: else its
    translation needs no alignment)."""
    body = block.text.strip()
    if not body:
        return []
    start = len(block.text) - len(block.text.lstrip())
    row = None
    if any(ch.isalnum() for ch in normalize_text(body)):
        row = len(rows)
        rows.append(body)
        aligned.append(bool(block.tags or block.markers or block.protected))
        terms.append(
            tuple(dataclasses.replace(m, start=m.start - start, end=m.end - start) for m in block.do_not_translate())
        )
    return [_Piece(start, body, row)]


@dataclass
class _Parsed:
    documents: list[Document]
    parts: list[list[list[_Piece]]]  # per text, per block
    rows: list[str]  # the plain call's texts
    terms: list[tuple[Match, ...]]  # per row: its translate="no" spans
    aligned: list[bool]  # per row: whether its block has markup to place by the alignment
    owners: list[int]  # the text each row comes from
    groups: list[int]  # rows per text


def _parse_all(texts: list[str], kind: Kind, names: list[str], point: Checkpoint) -> _Parsed:
    parsed = _Parsed([], [], [], [], [], [], [])
    for i, text in enumerate(texts):
        point.check()
        try:
            document = parse(text, kind)
        except MarkupError as e:
            raise InvalidArgument(names[i], str(e)) from None
        before = len(parsed.rows)
        parsed.documents.append(document)
        parsed.parts.append([_parts(b, parsed.rows, parsed.terms, parsed.aligned) for b in document.blocks])
        parsed.owners += [i] * (len(parsed.rows) - before)
        parsed.groups.append(len(parsed.rows) - before)
    return parsed


async def translate_markup(
    engine: MarkupEngine,
    texts: list[str],
    opts: TranslateOptions,
    timeout: float | None = None,
    pair: LanguagePair = LanguagePair(),
    field_prefix: str = "",
    field: str = "texts",
) -> list[TranslationResult]:
    """The translations of the marked-up `texts` (`opts.text_type` "html" or "xml"; `field` is
    "text" for TranslateStream's one text). Malformed XML, and markup nested past the limit, is
    INVALID_ARGUMENT naming the text with the line and column."""
    inference = Inference(engine.metrics, engine.translation_model)
    try:
        # The texts' count and bytes first, as for plain text, then the options.
        engine.check_texts(texts)
        size = engine.check_sizes(texts, field)
        kind = markup_kind(opts, field_prefix)
        if kind is None:
            raise ValueError("translate_markup is for html and xml")
        _check_options(opts, field_prefix, kind)
        lead = len(engine.languages.prefixes(pair, field_prefix).source)
        deadline = None if timeout is None else time.monotonic() + timeout
        names = [
            f"{field_prefix}{field}[{i}]" if field == "texts" else f"{field_prefix}{field}" for i in range(len(texts))
        ]
        parsed = await engine.work.run(lambda point: _parse_all(texts, kind, names, point), size, timeout)
        if not parsed.rows:  # markup alone: nothing for the model
            engine.trace(engine.translation_model, texts=len(texts))
            engine.count_texts([], parsed.groups, opts.text_type)
            results = [_finish_text(d, parts, {}) for d, parts in zip(parsed.documents, parsed.parts)]
            inference.compute_done()
            inference.succeeded(len(texts))
            return results
    except BaseException:
        inference.failed()
        raise
    plain = copy.copy(opts)  # the plain call's options (dataclasses.replace checks every field)
    plain.text_type, plain.return_alignment = TEXT, True

    def finish(
        plans: list[documents.Plan], src: list[list[int]], finished: list[Finished], found: TermPlan | None
    ) -> list[TranslationResult]:
        pieces = _translated_pieces(engine, opts, lead, plans, src, finished, found, parsed.aligned)
        return [_finish_text(d, parts, pieces) for d, parts in zip(parsed.documents, parsed.parts)]

    remaining = None if deadline is None else deadline - time.monotonic()
    try:
        return await engine.translate_rows(
            parsed.rows,
            plain,
            remaining,
            pair,
            field_prefix,
            inference,
            finish,
            parsed.groups,
            opts.text_type,
            terms=parsed.terms,
        )
    except InvalidArgument as e:
        raise _renamed(e, parsed.owners, names) from None


def _renamed(error: InvalidArgument, owners: list[int], names: list[str]) -> InvalidArgument:
    """An error of the plain call that names one of its texts (a block, or a piece of one) named
    after the request's text it comes from."""
    m = _INDEX.fullmatch(error.field)
    if m is None or int(m.group(1)) >= len(owners):
        return error
    problem = error.message[len(error.field) + 2 :]
    return InvalidArgument(names[owners[int(m.group(1))]], f"a block: {problem}")


@dataclass(frozen=True)
class _Translated:
    """A piece's translation: the plain path's result for it (documents.assemble) and its
    alignment (source spans in the piece's text, target spans in the result's text)."""

    result: TranslationResult
    alignment: Alignment


def _translated_pieces(
    engine: MarkupEngine,
    opts: TranslateOptions,
    lead: int,
    plans: list[documents.Plan],
    src: list[list[int]],
    finished: list[Finished],
    found: TermPlan | None,
    aligned: list[bool],
) -> dict[int, _Translated]:
    """Each translated piece's result (with where its terms landed: `applied_terms`) and
    alignment (for a piece without markup to place, none), by its row among the plain call's
    texts."""
    out: dict[int, _Translated] = {}
    rows = [engine.result(s, f, opts) for s, f in zip(src, finished)]
    at = 0
    for index, plan in enumerate(plans):
        results = rows[at : at + plan.row_count]
        if aligned[index]:
            matrices = [finished[r].alignment for r in range(at, at + plan.row_count)]
            out[index] = _piece_translation(engine.tokenizer, lead, plan, results, matrices, opts.split)
        else:
            out[index] = _Translated(documents.assemble(plan, results, opts.split), Alignment((), (), ()))
        at += plan.row_count
    engine.applied_terms(found, plans, rows, finished, [out[i].result for i in range(len(plans))], opts.split)
    return out


def _piece_translation(
    tokenizer: TextTokenizer,
    lead: int,
    plan: documents.Plan,
    results: list[TranslationResult],
    matrices: list[np.ndarray | None],
    split: str,
) -> _Translated:
    """The piece's translation as documents.assemble makes it (its segments' translations where the
    segments were; a segment of several rows, their texts joined by a space) and its alignment,
    joined from its rows'."""
    parts: list[tuple[int, int, Alignment]] = []
    size = at = r = 0  # the translation's length so far, the end of the last segment, the row
    for k, ((a, b), rows) in enumerate(zip(plan.spans, plan.rows)):
        size += a - at
        at = b
        segment = plan.text[a:b]
        clean, froms, tos = normalize_with_offsets(segment)
        spans = plan.offsets[k] if plan.offsets is not None else tokenizer.encode_with_offsets(clean)[1]
        token = 0
        for k, row in enumerate(rows):
            if k:
                size += 1  # the space between the parts of a sentence cut for length
            n = len(row) - lead - 1
            source = tuple(source_span(a, len(segment), froms, tos, s, e) for s, e in spans[token : token + n])
            token += n
            result = results[r]
            target, starts = target_spans(tokenizer, result.token_ids, result.text)
            links = links_of(matrices[r], len(target), lead, len(source))
            parts.append((0, size, Alignment(source, target, links, starts if any(starts) else ())))
            size += len(result.text)
            r += 1
    return _Translated(documents.assemble(plan, results, split), Alignment.join(parts))


def _block_translation(
    block: Block, parts: list[_Piece], pieces: dict[int, _Translated]
) -> tuple[str, Alignment, list[tuple[int, int] | None], list[TranslationResult]]:
    """The block's translation (its piece's, with the whitespace the block's text has at either
    end), its alignment, where each protected span landed (the do-not-translate term the search
    forced for it: None where it did not land), and the piece's results."""
    protected: list[tuple[int, int] | None] = [None] * len(block.protected)
    if not parts:
        return block.text, Alignment((), (), ()), protected, []
    (piece,) = parts
    head, tail = block.text[: piece.start], block.text[piece.start + len(piece.text) :]
    if piece.row is None:
        return block.text, Alignment((), (), ()), protected, []
    done = pieces[piece.row]
    landed = {
        (t.source_start + piece.start, t.source_end + piece.start): (t.start, t.end)
        for t in done.result.applied_terms
        if t.origin == MARKUP and t.start >= 0
    }
    for k, p in enumerate(block.protected):
        where = landed.get((p.start, p.end))
        if where is not None:
            protected[k] = (len(head) + where[0], len(head) + where[1])
    alignment = Alignment.join([(piece.start, len(head), done.alignment)])
    return head + done.result.text + tail, alignment, protected, [done.result]


def _combined(text: str, results: list[TranslationResult], segments: list[Segment] | None = None) -> TranslationResult:
    """A translation of `text` made of `results` (pieces'): their scores averaged as
    documents.assemble averages them, tokens concatenated, counts summed; one piece's alignment."""
    return TranslationResult(
        text=text,
        score=documents.mean_score(results) if results else None,
        tokens=[t for r in results for t in r.tokens],
        token_ids=[t for r in results for t in r.token_ids],
        input_tokens=sum(r.input_tokens for r in results),
        output_tokens=sum(r.output_tokens for r in results),
        alignment=results[0].alignment if len(results) == 1 else None,
        segments=segments or [],
    )


def _finish_text(document: Document, parts: list[list[_Piece]], pieces: dict[int, _Translated]) -> TranslationResult:
    """The text's translation: each block projected and the document rendered; a segment per
    block (its region, its projected markup); the terms applied in its blocks (`_located`)."""
    projected: list[str] = []
    segments: list[Segment] = []
    everything: list[TranslationResult] = []
    for block, block_parts in zip(document.blocks, parts):
        text, alignment, protected, results = _block_translation(block, block_parts, pieces)
        markup = project(block, text, alignment, protected)
        projected.append(markup)
        segments.append(Segment(block.region[0], block.region[1], _combined(markup, results)))
        everything += results
    out = _combined(render(document, projected), everything, segments)
    out.applied_terms = _located(document, out.text, everything)
    return out


def _located(document: Document, rendered: str, results: list[TranslationResult]) -> list[AppliedTerm]:
    """The blocks' applied terms with their spans in the marked-up text as sent and as returned:
    each found in turn, as written, after the one before; a term whose words a tag or a character
    reference interrupts is not found there (-1, -1)."""
    located: list[AppliedTerm] = []
    source_at = out_at = 0
    for result in results:
        for t in result.applied_terms:
            start = document.source.find(t.source, source_at)
            source = (start, start + len(t.source)) if start >= 0 else (-1, -1)
            if start >= 0:
                source_at = start + len(t.source)
            target = (-1, -1)
            if t.start >= 0:
                at = rendered.find(t.target, out_at)
                if at >= 0:
                    target = (at, at + len(t.target))
                    out_at = at + len(t.target)
            located.append(
                dataclasses.replace(t, source_start=source[0], source_end=source[1], start=target[0], end=target[1])
            )
    return located
