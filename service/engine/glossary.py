"""A request's glossary terms and do-not-translate phrases, from its options to the terms its
sentences force (service.decoding.terms) and back to `TranslationResult.applied_terms`.

The terms of a request are, in this order, the named glossary's (`options.glossary_id`, one a
model version ships as `glossaries/ID.tsv`: `load_glossaries`), its `do_not_translate` phrases and
its `glossary` entries. They are matched on each segment's words as the model sees them
(service.engine.terms: case-insensitively, in any of an entry's forms; of overlapping matches the
one of most words wins); where terms have the same source words, the later one in that order
wins (a request's entry over the named glossary's, a later line of a glossary over an earlier
one). A caller's matches (`markup`: the translate="no" spans of HTML and XML, code-point spans of
the text as sent) come first: a term that overlaps one is dropped.

Each match becomes a `SourceTerm` of the row it is in: the source tokens it covers (of a sentence
cut into parts for length, the part's; a match across a cut is not forced) and the target's
tokens (`encode_target`; for a do-not-translate phrase, the matched text itself); a row with
terms is decoded in two passes, the first of which finds where each term goes
(service.engine.placement). A match is reported in `applied_terms` either way, with where its target landed in the translation's text,
or -1, -1 where it did not (across a cut, a target the target vocabulary cannot spell, a sentence
that reached its length limit first). Sentences without a match get no terms and decode exactly
as without a glossary.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from contract.glossary import GLOSSARY_DIR, GLOSSARY_SUFFIX
from service.decoding.results import Finished
from service.decoding.terms import MAX_TERMS, SourceTerm
from service.engine import documents
from service.engine.requests import AppliedTerm, TranslateOptions, TranslationResult
from service.engine.terms import Match, Term, TermError, TermIndex, check_term, read_tsv
from service.engine.text import normalize_with_offsets
from service.engine.work import NO_CHECK, Checkpoint
from service.errors import InvalidArgument, ModelLoadError, NotFound, quote
from service.metrics import ModelMetrics
from service.runtime.tokenizer import TextTokenizer

GLOSSARY, DO_NOT_TRANSLATE, MARKUP = "glossary", "do_not_translate", "markup"  # origins besides a glossary's id
_ID = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class NamedGlossary:
    """A glossary a model version ships: its terms in file order, and their index."""

    id: str
    terms: tuple[Term, ...]
    index: TermIndex


def load_glossaries(version_dir: Path) -> dict[str, NamedGlossary]:
    """The glossaries of a model version (`version_dir/glossaries/ID.tsv`, by id); ModelLoadError
    naming the file, and the line, at fault."""
    folder = version_dir / GLOSSARY_DIR
    if not folder.is_dir():
        return {}
    found: dict[str, NamedGlossary] = {}
    for path in sorted(p for p in folder.iterdir() if p.suffix == GLOSSARY_SUFFIX and p.is_file()):
        if not _ID.fullmatch(path.stem):
            raise ModelLoadError(f"{path}: a glossary's id (its file name) is 1 to 128 of A-Z a-z 0-9 . _ -")
        data = path.read_bytes()
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise ModelLoadError(f"{path}:{line}: not UTF-8 text") from None
        try:
            terms = tuple(read_tsv(text, str(path)))
        except TermError as e:
            raise ModelLoadError(str(e)) from None
        found[path.stem] = NamedGlossary(path.stem, terms, TermIndex(reversed(terms)))
    return found


@dataclass(frozen=True)
class RequestTerms:
    """What a request matches: its index (None: markup only), each term's origin (by identity;
    the others are `default_origin`'s, the named glossary's) and the caller's matches per text."""

    index: TermIndex | None
    origins: dict[int, str]
    default_origin: str
    markup: Sequence[Sequence[Match]] | None

    def origin(self, term: Term) -> str:
        return self.origins.get(id(term), self.default_origin)


def request_terms(
    opts: TranslateOptions,
    glossaries: Mapping[str, NamedGlossary],
    max_terms: int,
    model: str,
    field_prefix: str = "",
    markup: Sequence[Sequence[Match]] | None = None,
    texts: int = 1,
) -> RequestTerms | None:
    """The terms of a request (None: it has none), its options checked: INVALID_ARGUMENT naming
    the entry past `max_terms` (max_glossary_terms) or the field of a term over the limits of
    service.engine.terms; NOT_FOUND for a glossary_id `model` does not ship."""
    if markup is not None and len(markup) != texts:
        raise ValueError(f"terms: {len(markup)} values for {texts} texts")
    fp = f"{field_prefix}options."
    entries, phrases = opts.glossary, opts.do_not_translate
    if len(entries) > max_terms:
        raise InvalidArgument(f"{fp}glossary", f"{len(entries)} entries exceed max_glossary_terms ({max_terms})")
    if len(entries) + len(phrases) > max_terms:
        raise InvalidArgument(
            f"{fp}do_not_translate",
            f"{len(phrases)} phrases and {len(entries)} glossary entries exceed max_glossary_terms ({max_terms})",
        )
    named = _named(opts.glossary_id, glossaries, model, fp)
    own: list[Term] = []
    origins: dict[int, str] = {}
    for i, phrase in enumerate(phrases):
        where = f"{fp}do_not_translate[{i}]"
        _check(phrase, "", (), where, where)
        own.append(Term(phrase, ""))
        origins[id(own[-1])] = DO_NOT_TRANSLATE
    for i, e in enumerate(entries):
        where = f"{fp}glossary[{i}]"
        _check(e.source, e.target, e.forms, where)
        if not e.target.strip():
            raise InvalidArgument(f"{where}.target", "is empty (a phrase kept as it is goes in do_not_translate)")
        own.append(Term(e.source, e.target, tuple(e.forms)))
        origins[id(own[-1])] = GLOSSARY
    default = named.id if named is not None else GLOSSARY
    if own:  # the later term wins where two have the same words: the index prefers the first given
        index: TermIndex | None = TermIndex(reversed([*(named.terms if named is not None else ()), *own]))
    else:
        index = named.index if named is not None else None
    if index is None and not any(markup or ()):
        return None
    return RequestTerms(index, origins, default, markup)


def _named(glossary_id: str, glossaries: Mapping[str, NamedGlossary], model: str, fp: str) -> NamedGlossary | None:
    if not glossary_id:
        return None
    if glossary_id not in glossaries:
        have = ", ".join(sorted(glossaries)) or "none"
        raise NotFound(f"{fp}glossary_id: {quote(glossary_id)} is not a glossary of {model} (its glossaries: {have})")
    return glossaries[glossary_id]


def _check(source: str, target: str, forms: Sequence[str], where: str, field: str | None = None) -> None:
    """check_term's TermError as INVALID_ARGUMENT naming the field (`field`, else the one it names)."""
    try:
        check_term(source, target, forms, where=where)
    except TermError as e:
        named, _, problem = str(e).partition(": ")
        raise InvalidArgument(field or named, problem) from None


@dataclass
class Found:
    """A match in a text: its source text and span in the text as sent, the target wanted, its
    origin, and the row and index among that row's terms it was forced as (-1: not forced)."""

    source: str
    target: str
    source_start: int
    source_end: int
    origin: str
    row: int = -1
    term: int = -1


@dataclass
class TermPlan:
    """A request's matches per text (in source order) and the terms of each of its rows."""

    texts: list[list[Found]]
    rows: list[tuple[SourceTerm, ...]] = field(default_factory=list)


def place(
    wanted: RequestTerms,
    plans: Sequence[documents.Plan],
    tokenizer: TextTokenizer,
    lead: int,
    unk_id: int,
    field: str = "texts",
    point: Checkpoint = NO_CHECK,
) -> TermPlan | None:
    """The matches of `wanted` in the planned texts, as the terms of their rows (`lead`: the
    tokens before each row's text, a multilingual model's language token); None when nothing
    matched. INVALID_ARGUMENT naming the text of a sentence with more than MAX_TERMS matches."""
    rows: list[list[SourceTerm]] = [[] for p in plans for seg in p.rows for _ in seg]
    texts: list[list[Found]] = []
    row = 0
    for i, plan in enumerate(plans):
        point.check()
        marks = tuple(wanted.markup[i]) if wanted.markup is not None else ()
        found = [
            Found(m.text, m.target, m.start, m.end, MARKUP)
            for m in marks
            if not any(a <= m.start and m.end <= b for a, b in plan.spans)  # across segments: not forced
        ]
        first = row
        for k, ((a, b), seg_rows) in enumerate(zip(plan.spans, plan.rows)):
            if k % documents.CHECK_EVERY == documents.CHECK_EVERY - 1:
                point.check()
            here = [m for m in marks if a <= m.start and m.end <= b]
            if wanted.index is not None or here:
                spans = plan.offsets[k] if plan.offsets is not None else None
                found += _segment(
                    plan.text, (a, b), seg_rows, row, rows, wanted, here, marks, tokenizer, lead, unk_id, spans
                )
            row += len(seg_rows)
        most = max((len(rows[r]) for r in range(first, row)), default=0)
        if most > MAX_TERMS:
            name = f"{field}[{i}]" if field == "texts" else field
            raise InvalidArgument(
                name, f"a sentence with {most} glossary or do-not-translate matches, at most {MAX_TERMS}"
            )
        texts.append(sorted(found, key=lambda f: (f.source_start, f.source_end)))
    if not any(texts):
        return None
    return TermPlan(texts, [tuple(r) for r in rows])


def _segment(
    text: str,
    span: tuple[int, int],
    seg_rows: list[list[int]],
    first_row: int,
    rows: list[list[SourceTerm]],
    wanted: RequestTerms,
    here: list[Match],
    marks: Sequence[Match],
    tokenizer: TextTokenizer,
    lead: int,
    unk_id: int,
    token_spans: list[tuple[int, int]] | None = None,
) -> list[Found]:
    """The matches of one segment (`span` of `text`), each made a term of its row in `rows` where
    it can be forced; `token_spans`: its tokens' spans in its normalised text, where the plan
    kept them."""
    a, b = span
    clean, starts, ends = normalize_with_offsets(text[a:b])
    wanted_here: list[tuple[Found, int, int]] = []  # with its span of `clean`
    for m in here:
        f = Found(m.text, m.target, m.start, m.end, MARKUP)
        wanted_here.append((f, bisect_left(starts, m.start - a), bisect_right(ends, m.end - a)))
    if wanted.index is not None:
        for m in wanted.index.find(clean):
            start, end = a + starts[m.start], a + ends[m.end - 1]
            if any(start < x.end and x.start < end for x in marks):
                continue  # the caller's span wins
            f = Found(text[start:end], m.target, start, end, wanted.origin(m.term))
            wanted_here.append((f, m.start, m.end))
    if not wanted_here:
        return []
    parts = [r[lead:-1] for r in seg_rows]
    spans = token_spans if token_spans is not None else _spans_again(clean, parts, tokenizer)
    if spans is None:  # not the rows' tokens (a tokenizer out of step): none forced
        return [f for f, _, _ in wanted_here]
    token_starts, token_ends = [s for s, _ in spans], [e for _, e in spans]
    offsets = [0]
    for p in parts:
        offsets.append(offsets[-1] + len(p))
    for f, cs, ce in wanted_here:
        first, past = bisect_right(token_ends, cs), bisect_left(token_starts, ce)  # the tokens it covers
        if past <= first:
            continue
        k = bisect_right(offsets, first) - 1
        if past > offsets[k + 1]:
            continue  # across a cut between the parts of an over-long sentence
        target = tuple(tokenizer.encode_target(f.target))
        if not target or unk_id in target:
            continue  # nothing the target vocabulary can spell
        r = first_row + k
        rows[r].append(SourceTerm(first - offsets[k] + lead, past - offsets[k] + lead, target))
        f.row, f.term = r, len(rows[r]) - 1
    return [f for f, _, _ in wanted_here]


def _spans_again(clean: str, parts: list[list[int]], tokenizer: TextTokenizer) -> list[tuple[int, int]] | None:
    """The spans in `clean` (a segment's normalised text) of its rows' tokens (`parts`), from
    tokenising it again; None where that gives other tokens than the rows'."""
    ids, spans = tokenizer.encode_with_offsets(clean)
    return spans if [t for p in parts for t in p] == ids else None


def applied(
    found: TermPlan,
    plans: Sequence[documents.Plan],
    rows: Sequence[TranslationResult],
    finished: Sequence[Finished],
    results: Sequence[TranslationResult],
    tokenizer: TextTokenizer,
    split: str,
) -> None:
    """Each text's `applied_terms`: its matches and where their targets landed in its result's
    text (the rows' translations put together by documents.assemble)."""
    r = 0
    for plan, matches, result in zip(plans, found.texts, results):
        at = documents.starts(plan.text, plan.spans, [s.translation.text for s in result.segments], split)
        row_at: dict[int, int] = {}
        for seg_start, seg_rows in zip(at, plan.rows):
            pos = seg_start
            for _ in seg_rows:  # a sentence's parts are joined by a space (documents._merge)
                row_at[r] = pos
                pos += len(rows[r].text) + 1
                r += 1
        terms = []
        for f in matches:
            where = _landed(f, rows, finished, tokenizer)
            if where is None:
                start, end, target = -1, -1, f.target
            else:
                start, end, target = row_at[f.row] + where[0], row_at[f.row] + where[1], where[2]
            terms.append(AppliedTerm(f.source, target, f.source_start, f.source_end, start, end, f.origin))
        result.applied_terms = terms


def _landed(
    f: Found, rows: Sequence[TranslationResult], finished: Sequence[Finished], tokenizer: TextTokenizer
) -> tuple[int, int, str] | None:
    """Where a forced match's target stands in its row's text (start, end, the text there), None
    where it did not land. The decoded text of its tokens, looked for in the row's decoded text
    nearest to the length of the text decoded before them."""
    if f.row < 0:
        return None
    hit = next(((s, e) for j, s, e in finished[f.row].terms if j == f.term), None)
    if hit is None:
        return None
    ids = rows[f.row].token_ids
    whole = tokenizer.decode(ids)
    body = tokenizer.decode(ids[hit[0] : hit[1]])
    core = body.strip()
    if not core:
        return None
    guess = len(tokenizer.decode(ids[: hit[0]])) + len(body) - len(body.lstrip())
    hits = [m.start() for m in re.finditer(re.escape(core), whole)]
    if not hits:
        return None
    at = min(hits, key=lambda h: abs(h - guess)) - (len(whole) - len(whole.lstrip()))
    return at, at + len(core), core


def count(results: Sequence[TranslationResult], metrics: ModelMetrics) -> None:
    """The landed terms in mtserve_glossary_terms_applied_total, by origin."""
    for result in results:
        for t in result.applied_terms:
            if t.start >= 0:
                metrics.glossary_terms_applied.labels(t.origin).inc()
