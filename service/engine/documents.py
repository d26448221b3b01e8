"""Texts as documents: a text is split into segments (sentences, or lines), each segment becomes
rows for the batcher, and the translations of its rows are put back where the segments were.

Spans are offsets in Unicode code points (Python string indices) into the text as sent, end
exclusive: `text[start:end]` is the segment's source. Everything between segments (paragraph
breaks, line breaks, the spaces between sentences, leading and trailing whitespace) is copied to
the translation unchanged.

Sentences are found by sentence-splitter (the Moses splitter's rules and non-breaking prefix
lists, in the package: nothing is downloaded), chosen by `python -m benchmarks.splitter`
(docs/documents.md), with a few more prefixes (EXTRA_PREFIXES), a few fewer (REMOVED_PREFIXES), one
rule for German closing quotes and one for sentences without final punctuation (_OPENERS). A
language it has no list for gets the English rules. A sentence still too long for the
model is cut into parts at a token boundary (`split_ids`), whose translations are joined by a space.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from pathlib import Path

from service.engine.requests import Segment, TranslationResult
from service.engine.splitter import MosesSplitter, read_prefixes
from service.engine.text import normalize_text
from service.engine.work import NO_CHECK, Checkpoint
from service.errors import InvalidArgument
from service.runtime.tokenizer import TextTokenizer

SPLIT_SENTENCES, SPLIT_NEWLINES, SPLIT_NONE = "sentences", "newlines", "none"
SPLIT_MODES = (SPLIT_SENTENCES, SPLIT_NEWLINES, SPLIT_NONE)

# Abbreviations the package's lists lack, found by the cases of tests/service/engine/data.
# "#NUMERIC_ONLY#": no break only before a number (Moses's marker).
EXTRA_PREFIXES = {
    "de": ["Hauptstr", "Str", "Bahnhofstr", "Schulstr", "Bd", "Bde", "Hrsg", "Art #NUMERIC_ONLY#"],
    "fr": ["Mme", "Mmes", "Mlle", "Mlles", "MM", "Pr", "Ste"],
    "en": ["p #NUMERIC_ONLY#", "pp #NUMERIC_ONLY#"],
}
# Entries of the package's lists that are also common sentence-final words: "Bart" (a baronet in
# English; the beard in German), "Gen" (the gene). "Art" (the kind, or Artikel before a number)
# stays unbroken only before a number.
REMOVED_PREFIXES = {"de": {"Bart", "Gen", "Art"}}
# Words that start a sentence and are not capitalised inside one but in names and titles
# ("Die Zeit"): articles, numerals two to twelve that are not also nouns ("Acht", "Elf"), personal
# pronouns but the polite "Sie"/"Ihr", "A" aside (the letter: "Vitamin A"). One of them after a
# word without final punctuation, or after a period the splitter kept (an ordinal, an
# abbreviation), starts a new sentence: "... in einer Stadt Der Mann ...", "Nummer 10. Ein Mann".
_OPENERS = {
    "de": "Der Die Das Ein Eine Zwei Drei Vier Fünf Sechs Sieben Neun Zehn Zwölf Er Es Ich Wir",
    "en": "The An Two Three Four Five Six Seven Eight Nine Ten He She They We",
    "fr": "Le La Les Un Une Deux Trois Quatre Cinq Six Sept Huit Neuf Dix Il Elle Ils Elles Nous",
}
# Where nouns are lower case, a sentence's opener is followed by a lower-case word ("The man"),
# a name's by a capital ("The Beatles", "La Perla"): there an opener before a capital stays.
_LOWER_CASE_NOUNS = {"en", "fr"}
# Words no sentence ends in, after which an opener is not split off ("eine Zwei in Mathe", "à La
# Rochelle"): the articles, and in French the prepositions too (French strands none).
_NEVER_LAST = {
    lang: set(words.split())
    for lang, words in {
        "de": "der die das den dem des ein eine einer einem einen eines",
        "en": "the a an",
        "fr": "le la les un une des du de à au aux en dans par pour sur sous avec sans chez vers entre",
    }.items()
}
_OPENER_AT = {
    lang: re.compile(rf"(?<=[^\W_]|\.)\s+(?=(?:{'|'.join(words.split())})\s+([^\W\d_]))")
    for lang, words in _OPENERS.items()
}
# ISO 639-2/3 and NLLB (deu_Latn) codes of the languages sentence-splitter has lists for.
_THREE_LETTER = {
    "cat": "ca", "ces": "cs", "cze": "cs", "dan": "da", "deu": "de", "ger": "de", "ell": "el", "gre": "el",
    "eng": "en", "spa": "es", "fin": "fi", "fra": "fr", "fre": "fr", "hun": "hu", "isl": "is", "ice": "is",
    "ita": "it", "lit": "lt", "lav": "lv", "lvs": "lv", "nld": "nl", "dut": "nl", "nor": "no", "nob": "no",
    "pol": "pl", "por": "pt", "ron": "ro", "rum": "ro", "rus": "ru", "slk": "sk", "slo": "sk", "slv": "sl",
    "swe": "sv", "tur": "tr",
}  # fmt: skip
# „Kommst du mit?“ Sie nickte.  German closing quotes (U+201C) are opening ones to Unicode.
_GERMAN_QUOTE_END = re.compile(r"(?<=[.?!…]“)\s+(?=[„\"«»]?[A-ZÄÖÜ])")
_LINE = re.compile(r"[^\n]+")


def splitter_language(code: str) -> str:
    """The splitter's language for a language code ("de", "de-DE", "deu", "deu_Latn", "__de__"):
    the two-letter code when sentence-splitter has a list for it, else "en" (English rules)."""
    base = re.split(r"[-_]", code.strip("_").lower(), maxsplit=1)[0]
    base = _THREE_LETTER.get(base, base)
    return base if base in _supported() else "en"


@functools.cache
def _supported() -> frozenset[str]:
    import sentence_splitter

    return frozenset(p.stem for p in (Path(sentence_splitter.__file__).parent / "non_breaking_prefixes").glob("*.txt"))


@functools.cache
def _splitter(lang: str) -> MosesSplitter:
    """The splitter of `lang` (a splitter_language): the package's prefixes and EXTRA_PREFIXES."""
    import sentence_splitter

    listed = Path(sentence_splitter.__file__).parent / "non_breaking_prefixes" / f"{lang}.txt"
    removed = REMOVED_PREFIXES.get(lang, set())
    kept = [line for line in listed.read_text(encoding="utf-8").splitlines() if line.strip() not in removed]
    return MosesSplitter(read_prefixes(kept + EXTRA_PREFIXES.get(lang, [])))


_WHITESPACE = re.compile(r"\s*")
_GAP = 64  # whitespace between sentences that _locate's fast path looks past


def _locate(text: str, sentence: str, start: int) -> tuple[int, int] | None:
    """Where `sentence` (as the splitter returns it, whitespace runs collapsed) is in `text`,
    from `start`: where its words follow each other, whitespace between them. The splitter's
    sentences are consecutive, so the words are looked for at the first word after `start`
    (linear in the sentence); a regular expression searches the rest of the text only when the
    splitter changed the text."""
    if sentence and not (sentence[0].isspace() or sentence[-1].isspace()):
        # The sentence as sent, after a little whitespace (the search bounded: linear).
        at = text.find(sentence, start, start + len(sentence) + _GAP)
        if at == start or (at > start and text[start:at].isspace()):
            return at, at + len(sentence)
    at = _WHITESPACE.match(text, start).end()  # type: ignore[union-attr]  # \s* always matches
    words = sentence.split()
    if not words:
        return None
    at = _WHITESPACE.match(text, start).end()  # type: ignore[union-attr]  # \s* always matches
    begin = at
    for k, word in enumerate(words):
        if k:
            gap = _WHITESPACE.match(text, at).end()  # type: ignore[union-attr]
            if gap == at:
                break
            at = gap
        if not text.startswith(word, at):
            break
        at += len(word)
    else:
        return begin, at
    m = re.compile(r"\s+".join(map(re.escape, words))).search(text, start)
    return (m.start(), m.end()) if m else None


def sentence_spans(text: str, lang: str) -> list[tuple[int, int]]:
    """The spans of the sentences of `text` (one line of a text) in `lang` (any code)."""
    code = splitter_language(lang)
    spans: list[tuple[int, int]] = []
    at = 0
    for s in _splitter(code).split(text):
        for part in _GERMAN_QUOTE_END.split(s) if code == "de" and "“" in s else (s,):
            for sentence in _split_at_openers(part, code):
                span = _locate(text, sentence, at)
                if span is None:  # not the text the splitter was given: the line as one sentence
                    return _stripped(text, 0, len(text))
                spans.append(span)
                at = span[1]
    return spans


def _split_at_openers(sentence: str, code: str) -> list[str]:
    """`sentence` split before each of its language's _OPENERS that follows a word without final
    punctuation, or a kept period, other than one of _NEVER_LAST (and, in English and French,
    precedes a lower-case word). Linear in the sentence: the word before an opener is looked for
    between the previous opener and this one, the word after it is the pattern's group."""
    at_opener = _OPENER_AT.get(code)
    if at_opener is None or (sentence.count(" ") < 2 and sentence.isprintable()):
        return [sentence]  # no language rule, or fewer than the two whitespace runs around an opener
    never_last = _NEVER_LAST[code]
    parts: list[str] = []
    start = searched = 0
    for m in at_opener.finditer(sentence):
        if code in _LOWER_CASE_NOUNS and not m.group(1).islower():
            searched = m.end()
            continue
        if sentence[searched : m.start()].rsplit(None, 1)[-1].lower() not in never_last:
            parts.append(sentence[start : m.start()])
            start = m.end()
        searched = m.end()
    return [*parts, sentence[start:]]


def _stripped(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """[the span of text[start:end] without surrounding whitespace], or [] when it is blank."""
    part = text[start:end]
    lead = len(part) - len(part.lstrip())
    body = part.strip()
    return [(start + lead, start + lead + len(body))] if body else []


def segment_spans(text: str, split: str, lang: str) -> list[tuple[int, int]]:
    """The spans of `text`'s segments in order: `split` SPLIT_NONE the whole text (stripped),
    SPLIT_NEWLINES each line that is not blank, SPLIT_SENTENCES each sentence of each line."""
    if split == SPLIT_NONE:
        return _stripped(text, 0, len(text))
    spans: list[tuple[int, int]] = []
    for line in _LINE.finditer(text):
        for a, b in _stripped(text, line.start(), line.end()):
            if split == SPLIT_NEWLINES:
                spans.append((a, b))
            else:
                spans += [(a + x, a + y) for x, y in sentence_spans(text[a:b], lang)]
    return spans


def join(text: str, spans: list[tuple[int, int]], translations: list[str]) -> str:
    """`text` with each span replaced by its translation: what lies between spans stays."""
    out: list[str] = []
    at = 0
    for (a, b), t in zip(spans, translations):
        out += [text[at:a], t]
        at = b
    out.append(text[at:])
    return "".join(out)


def starts(text: str, spans: list[tuple[int, int]], translations: list[str], split: str) -> list[int]:
    """Where each translation starts in the text `assemble` makes of them (code points): after
    what `join` keeps before it; with SPLIT_NONE a text of one segment is its translation alone."""
    if split == SPLIT_NONE and len(spans) == 1:
        return [0]
    out, at, prev = [], 0, 0
    for (a, b), t in zip(spans, translations):
        at += a - prev
        out.append(at)
        at += len(t)
        prev = b
    return out


def split_ids(ids: list[int], limit: int, breaks_before: list[bool]) -> list[list[int]]:
    """`ids` cut into parts of at most `limit` tokens. Each cut is at the last position in the
    second half of the window where `breaks_before` is true (a word starts, or punctuation came
    before), else at the limit."""
    parts: list[list[int]] = []
    at = 0
    while len(ids) - at > limit:
        window = range(at + limit, at + limit // 2, -1)
        cut = next((i for i in window if breaks_before[i]), at + limit)
        parts.append(ids[at:cut])
        at = cut
    parts.append(ids[at:])
    return parts


@dataclass
class Plan:
    """How one text runs: its segments' spans and, per segment, its source rows (each with the
    language token and </s>: more than one when the sentence was too long for the model)."""

    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)
    rows: list[list[list[int]]] = field(default_factory=list)
    # Per segment the spans of its tokens in its normalised text (`normalize_text`), where the
    # plan kept them (`Rules.offsets`); None: whoever needs them tokenises the segment again.
    offsets: list[list[tuple[int, int]]] | None = None

    @property
    def row_count(self) -> int:
        return sum(len(r) for r in self.rows)


@dataclass(frozen=True)
class Rules:
    """What plan_text needs of the model and the server."""

    split: str
    language: str  # the source language's code, for the splitter
    lead: tuple[int, ...]  # tokens before each source (a multilingual model's language token)
    eos_id: int
    limit: int  # tokens of a source row at most, lead and </s> included
    max_text_bytes: int
    max_rows: int = 2**31  # rows of one text at most (the queue's size: more could never be queued)
    rows_bound: str = "the queue's size"  # max_rows as a message names it
    # Keep each segment's token spans (`Plan.offsets`): the markup's alignment and the glossary's
    # matching read them, where they would tokenise the segment again.
    offsets: bool = False


def plan_text(text: str, name: str, rules: Rules, tokenizer: TextTokenizer, point: Checkpoint = NO_CHECK) -> Plan:
    """The segments and rows of `text` (field `name`). INVALID_ARGUMENT past max_text_bytes, for a
    text with nothing to translate, with SPLIT_NONE for a text past the token limit, and for a
    text of more than max_rows segments (known before any is tokenised) or rows. `point` is
    checked between the steps and every CHECK_EVERY segments."""
    if len(text.encode("utf-8", "surrogatepass")) > rules.max_text_bytes:
        raise InvalidArgument(name, f"text exceeds max_text_bytes ({rules.max_text_bytes})")
    plan = Plan(text, offsets=[] if rules.offsets else None)
    room = rules.limit - 1 - len(rules.lead)
    spans = segment_spans(text, rules.split, rules.language)
    point.check()
    if len(spans) > rules.max_rows:  # each span but one of format characters alone is a row
        _check_rows(name, sum(1 for a, b in spans if normalize_text(text[a:b])), rules)
    for k, (a, b) in enumerate(spans):
        if k % CHECK_EVERY == CHECK_EVERY - 1:
            point.check()
        clean = normalize_text(text[a:b])
        if not clean:
            continue  # format characters alone: left in place, as the whitespace around segments
        if plan.offsets is not None:
            ids, offsets = tokenizer.encode_with_offsets(clean)
            plan.offsets.append(offsets)
        else:
            ids = tokenizer.encode(clean)
        if len(ids) > room and rules.split == SPLIT_NONE:
            raise InvalidArgument(
                name, f"{len(ids) + len(rules.lead) + 1} tokens exceed max_input_tokens ({rules.limit})"
            )
        parts = split_ids(ids, room, _breaks(ids, tokenizer)) if len(ids) > room else [ids]
        plan.spans.append((a, b))
        plan.rows.append([[*rules.lead, *p, rules.eos_id] for p in parts])
    if not plan.spans:
        raise InvalidArgument(name, "text is empty once whitespace, control and format characters are removed")
    _check_rows(name, plan.row_count, rules)
    return plan


def plan_texts(
    texts: list[str], field: str, rules: Rules, tokenizer: TextTokenizer, point: Checkpoint = NO_CHECK
) -> list[Plan]:
    """Each text's plan (`plan_text`, named `field[i]`, or `field` when it is not "texts");
    `point` checked between texts. INVALID_ARGUMENT for texts of more rows together than
    max_rows: such a request could never be queued."""
    plans, rows = [], 0
    for i, t in enumerate(texts):
        point.check()
        name = f"{field}[{i}]" if field == "texts" else field
        plans.append(plan_text(t, name, rules, tokenizer, point))
        rows += plans[-1].row_count
        if rows > rules.max_rows:
            raise InvalidArgument(name, f"{field} up to here make {rows} sentences, over {rules.rows_bound}")
    return plans


# Segments tokenised between two checks of the request's deadline and cancellation.
CHECK_EVERY = 256


def _check_rows(name: str, rows: int, rules: Rules) -> None:
    if rows > rules.max_rows:
        raise InvalidArgument(name, f"{rows} sentences exceed {rules.rows_bound}")


_PUNCTUATION = tuple(".,;:!?…)]»“”\"'")


def _breaks(ids: list[int], tokenizer: TextTokenizer) -> list[bool]:
    """For each position of `ids`, whether a part may start there: a word starts (a leading space
    marker) or the token before ends in punctuation."""
    pieces = [tokenizer.id_to_token(i) or "" for i in ids]
    return [
        i > 0 and (p.startswith(("▁", "Ġ", " ")) or pieces[i - 1].endswith(_PUNCTUATION)) for i, p in enumerate(pieces)
    ]


def _merge(parts: list[TranslationResult]) -> TranslationResult:
    """One translation of the parts of a sentence cut for length (or the one translation): texts
    joined by a space, tokens concatenated, the score the mean over parts weighted by their output
    tokens; no alignment or n-best list for a sentence of several parts."""
    if len(parts) == 1:
        return parts[0]
    return TranslationResult(
        text=" ".join(p.text for p in parts),
        score=mean_score(parts),
        tokens=[t for p in parts for t in p.tokens],
        token_ids=[t for p in parts for t in p.token_ids],
        input_tokens=sum(p.input_tokens for p in parts),
        output_tokens=sum(p.output_tokens for p in parts),
    )


def mean_score(results: list[TranslationResult]) -> float | None:
    """The results' scores averaged, weighted by their output tokens (None if one has none)."""
    if any(r.score is None for r in results):
        return None
    weight = sum(r.output_tokens for r in results)
    return sum(float(r.score or 0.0) * r.output_tokens for r in results) / max(weight, 1)


def assemble(plan: Plan, rows: list[TranslationResult], split: str) -> TranslationResult:
    """The translation of a planned text from its rows' translations (in plan order): the text
    put back together, the segments with their spans. A text of one segment keeps its alignment
    and n-best list; with SPLIT_NONE the text is the translation alone, as before splitting."""
    segments: list[Segment] = []
    at = 0
    for span, seg_rows in zip(plan.spans, plan.rows):
        segments.append(Segment(span[0], span[1], _merge(rows[at : at + len(seg_rows)])))
        at += len(seg_rows)
    done = [s.translation for s in segments]
    if len(segments) == 1:
        one = done[0]
        result = TranslationResult(**{**one.__dict__, "segments": segments})
        if split != SPLIT_NONE:
            result.text = join(plan.text, plan.spans, [one.text])
        return result
    return TranslationResult(
        text=join(plan.text, plan.spans, [t.text for t in done]),
        score=mean_score(done),
        tokens=[t for r in done for t in r.tokens],
        token_ids=[t for r in done for t in r.token_ids],
        input_tokens=sum(r.input_tokens for r in done),
        output_tokens=sum(r.output_tokens for r in done),
        segments=segments,
    )


def first_row_prefixes(prefixes: list[str], plans: list[Plan]) -> list[str]:
    """Each row's target prefix from each text's: the text's first row gets it, the others none."""
    out: list[str] = []
    for prefix, plan in zip(prefixes, plans):
        out += [prefix] + [""] * (plan.row_count - 1)
    return out
