"""The translation service's features measured through the gRPC API: markup (HTML), tag placement,
glossaries and do-not-translate, and language detection, on a real `mtserve serve` on loopback
serving the de-en and fr-en models of a model repository.

    python -m benchmarks.translation_service --models models --json FILE
    python -m benchmarks.translation_service --only detection,placement --server-arg=--precision=fp32

Prints one JSON line of measured figures (never a verdict: the targets are listed beside them in
"targets"). Every request translates at beam 4 (`--beam`) and, unless stated, one text per call, so
that a text's translation never depends on its batch mates. Parts (`--only`):

- html: 300 German test sentences (multi30k test_2016_flickr; `build_html_cases`, seeded) with
  inline tags around words and phrases (b, i, span, a href), nested tags, void tags (br, img) and
  `<span translate="no">` spans. Figures: the share of outputs that parse (html5lib) to the same
  multiset of tags and attributes as the input; the share whose text (tags removed, whitespace
  collapsed) equals the plain translation (text_type TEXT) of the input's text; the share of
  translate="no" spans found byte for byte in the output; cost, HTML call time / plain call time
  over interleaved pairs (`--rounds` rounds, alternating which goes first), also by kind and over
  the "one_pass" sentences (no translate="no" element, which is decoded in two passes, and no
  `<br>`, which makes two rows): what the markup path itself costs.
- placement: benchmarks/data/tag_placement.tsv, hand-made German and French cases with the target
  words each tag must enclose. Figure: the share of tags enclosing exactly those words, among the
  tags whose output carries the words; outputs lacking the words, and tags lost, counted apart.
- glossary: 200 test sentences (German and French, half each) holding one common noun of `TERMS`
  whose plain translation has that noun's usual English word exactly once, and a one-entry glossary
  mapping it to a word the model does not write (Hund -> "canine"). Figures: the glossary's target
  in the output, in place of the usual word (same word index, or same place in a word alignment
  with the same word before it: `aligned`) and landed per applied_terms; the
  same sentences with the noun as a do-not-translate phrase: kept verbatim; 200 sentences matching
  no term of the language's whole glossary: byte-identical to no glossary; BLEU (sacreBLEU) on
  500 German test sentences (batches of 50) with an unrelated glossary vs none (and none vs none
  again: how much batching alone moves int8 translations); cost of the glossary on the matched
  sentences (interleaved pairs, as for html).
- glossary_cost: the cost part of "glossary" alone, on German sentences with one term whatever
  the model writes for it (for a model whose words the glossary part cannot read, such as the
  random real-size one: `--models benchmarks/.cache/real-size-.../models --model-names opus-size`).
- detection: source_language "auto" on German and French test sentences of at least 20 characters
  (batches of 50): the share detected right and sent to the right model; the detector alone per
  sentence (benchmarks/language_detection.py's harness, in a child process: its candidates are
  de, en and fr); a batch of German and French sentences mixed (each text routed on its own, its
  translation as when its language is named), and texts of one German and one French sentence
  with detect_per_segment (each segment's language, and its translation as routed alone).

A part that fails (an error status, a field the server does not fill) reports {"error": ...}
and the others still run. `--html-sentences`, `--glossary-sentences`, `--bleu-sentences` and
`--detection-limit` size the sets; the whole run takes about 80 s on two busy cores (int8)."""

from __future__ import annotations

import argparse
import difflib
import html
import os
import random
import re
import statistics
import string
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from benchmarks.figures import print_result
from benchmarks.processes import Server

REPO = Path(__file__).resolve().parent.parent
PLACEMENT = REPO / "benchmarks" / "data" / "tag_placement.tsv"
SPLIT = "test_2016_flickr"
PARTS = ("html", "placement", "glossary", "glossary_cost", "detection")
MIN_CHARS = 20  # detection: sentences of at least this many characters
TARGETS = {
    "html.tags_preserved": 1.0,
    "html.no_translate_verbatim": 1.0,
    "glossary.do_not_translate.verbatim": 1.0,
    "glossary.unmatched.identical": 1.0,
    "glossary.bleu.delta": 0.0,
    "glossary.matched.cost.median_of_ratios": "<= 1.5",
    "detection.accuracy.all.right": ">= 0.99",
}


# --- Markup: what html5lib makes of a text ------------------------------------------------------


def _fragment(markup: str) -> Any:
    import html5lib

    return html5lib.parseFragment(markup, treebuilder="etree", namespaceHTMLElements=False)


def _elements(markup: str) -> list[Any]:
    """The elements of `markup` in document order (comments and the fragment itself left out)."""
    root = _fragment(markup)
    return [e for e in root.iter() if e is not root and isinstance(e.tag, str)]


def _tag(element: Any) -> tuple[str, tuple[tuple[str, str], ...]]:
    return element.tag, tuple(sorted(element.attrib.items()))


def tag_multiset(markup: str) -> Counter[tuple[str, tuple[tuple[str, str], ...]]]:
    """Each element's (tag, sorted attributes) and how often it occurs, as html5lib parses it."""
    return Counter(_tag(e) for e in _elements(markup))


def _text_of(element: Any) -> str:
    """The text inside `element` (its tail left out); comments contribute nothing."""
    parts = [element.text or ""] if isinstance(element.tag, str) else []
    for child in element:
        parts += [_text_of(child), child.tail or ""]
    return "".join(parts)


def collapse(text: str) -> str:
    return " ".join(text.split())


def text_content(markup: str) -> str:
    """What a reader of `markup` sees: its text with the tags removed, entities decoded and
    whitespace collapsed."""
    return collapse(_text_of(_fragment(markup)))


NO_TRANSLATE = re.compile(r'<span translate="no">.*?</span>', re.S)


def no_translate_spans(markup: str) -> list[str]:
    """The `<span translate="no">...</span>` substrings of a builder's markup (none nested)."""
    return NO_TRANSLATE.findall(markup)


# --- The HTML set -------------------------------------------------------------------------------


@dataclass
class HtmlCase:
    text: str  # the sentence as in the corpus: the markup's text content
    markup: str
    kinds: list[str]


_WORD = re.compile(r"^(.*?\w)(\W*)$")  # a token's word, and the punctuation after it
INLINE = ("b", "i", "span", "a")


def split_token(token: str) -> tuple[str, str]:
    """A whitespace-separated token's word and the punctuation after it ("Gras." -> "Gras", ".");
    a token without a letter or digit is all punctuation."""
    m = _WORD.match(token)
    return (m[1], m[2]) if m else ("", token)


def _open(tag: str, index: int) -> str:
    if tag == "a":
        return f'<a href="https://example.com/p/{index}">'
    if tag == "span":
        return f'<span class="c{index % 3}">'
    return f"<{tag}>"


def _close(tag: str) -> str:
    return f"</{tag}>"


KINDS = ("word", "phrase", "nested", "void", "no_translate", "nested+no_translate")


class _Marking:
    """The tags put around the tokens of one sentence: each token's opening tags (outermost
    first), closing tags (innermost first) and a void tag before it."""

    def __init__(self, sentence: str, rng: random.Random, index: int):
        self.tokens = [split_token(t) for t in sentence.split()]
        self.words = [i for i, (word, _) in enumerate(self.tokens) if word]
        self.rng = rng
        self.index = index  # numbers the attributes' values
        self.opens: list[list[str]] = [[] for _ in self.tokens]
        self.closes: list[list[str]] = [[] for _ in self.tokens]
        self.before = ["" for _ in self.tokens]
        self.used: set[int] = set()

    def span(self, length: int) -> tuple[int, int] | None:
        """A run of `length` word tokens not tagged yet (drawn from rng), first and last index;
        punctuation inside the run would end up inside the tag: only its last token may have some."""
        starts = [
            k
            for k in range(len(self.tokens) - length + 1)
            if all(j in self.words and j not in self.used for j in range(k, k + length))
            and all(self.tokens[j][1] == "" for j in range(k, k + length - 1))
        ]
        if not starts:
            return None
        k = self.rng.choice(starts)
        self.used.update(range(k, k + length))
        return k, k + length - 1

    def wrap(self, tag_open: str, tag_close: str, at: tuple[int, int]) -> None:
        self.opens[at[0]].append(tag_open)
        self.closes[at[1]].insert(0, tag_close)

    def tagged(self, length: int) -> None:
        """An inline tag around a run of `length` words."""
        at = self.span(length)
        if at:
            tag = self.rng.choice(INLINE)
            self.wrap(_open(tag, self.index), _close(tag), at)

    def nested(self) -> None:
        """A tag around two or three words and another around one of them."""
        at = self.span(self.rng.choice((2, 3)))
        if at:
            outer, inner = self.rng.sample(INLINE, 2)
            self.wrap(_open(outer, self.index), _close(outer), at)
            k = self.rng.randint(*at)
            self.wrap(_open(inner, self.index + 1), _close(inner), (k, k))

    def void(self) -> None:
        """A br or img before a word other than the first."""
        j = self.rng.choice(self.words[1:])
        self.before[j] = self.rng.choice(("<br>", f'<img src="/img/{self.index}.png" alt="">'))

    def no_translate(self) -> None:
        at = self.span(self.rng.choice((1, 2)))
        if at:
            self.wrap('<span translate="no">', "</span>", at)

    def markup(self) -> str:
        return " ".join(
            self.before[j]
            + "".join(self.opens[j])
            + html.escape(word, quote=False)
            + "".join(self.closes[j])
            + html.escape(punct, quote=False)
            for j, (word, punct) in enumerate(self.tokens)
        )


def build_html_cases(sentences: Sequence[str], n: int, seed: int = 0) -> list[HtmlCase]:
    """Markup over the first `n` sentences of at least four words: each sentence gets its kind by
    its index (KINDS: a word in a tag, a phrase in a tag, a tag inside a tag, a void tag (br, img)
    and a word in a tag, a translate="no" span and a word in a tag, a tag inside a tag and a
    translate="no" span), tags and positions drawn from random.Random(seed). The markup's text
    content is the sentence, whitespace collapsed."""
    rng = random.Random(seed)
    cases: list[HtmlCase] = []
    for sentence in sentences:
        if len(cases) >= n:
            break
        m = _Marking(sentence, rng, len(cases))
        if len(m.words) < 4:
            continue
        kind = KINDS[len(cases) % len(KINDS)]
        if kind == "phrase":
            m.tagged(rng.choice((2, 3)))
        elif kind.startswith("nested"):
            m.nested()
        if kind == "void":
            m.void()
        if "no_translate" in kind:
            m.no_translate()
        if kind in ("word", "void", "no_translate"):
            m.tagged(1)
        cases.append(HtmlCase(text=sentence, markup=m.markup(), kinds=kind.split("+")))
    return cases


@dataclass
class HtmlOutcome:
    tags_preserved: bool
    text_as_plain: bool
    no_translate_kept: int
    no_translate_spans: int


def score_html(case: HtmlCase, output: str, plain: str) -> HtmlOutcome:
    """One output against its input: the same tags and attributes, the plain translation's text,
    and how many of the input's translate="no" spans it carries byte for byte."""
    spans = no_translate_spans(case.markup)
    return HtmlOutcome(
        tags_preserved=tag_multiset(output) == tag_multiset(case.markup),
        text_as_plain=text_content(output) == collapse(plain),
        no_translate_kept=sum(min(output.count(s), spans.count(s)) for s in set(spans)),
        no_translate_spans=len(spans),
    )


# --- The placement set --------------------------------------------------------------------------


@dataclass
class PlacementCase:
    lang: str
    markup: str
    expected: list[str]  # the target words each tag encloses, in the order the tags open


def read_placement(path: Path = PLACEMENT) -> list[PlacementCase]:
    """benchmarks/data/tag_placement.tsv (# comments and blank lines skipped); ValueError naming
    the line whose number of expectations differs from its number of tags."""
    cases = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        lang, markup, expected = line.split("\t")
        case = PlacementCase(lang, markup, [e.strip() for e in expected.split("|")])
        if len(_elements(markup)) != len(case.expected):
            raise ValueError(f"{path.name}:{number}: {len(_elements(markup))} tags, {len(case.expected)} expectations")
        cases.append(case)
    return cases


_EDGE = string.punctuation + "“”‘’«»…"


def normalized(words: str) -> str:
    """Case folded, whitespace collapsed, punctuation at either end stripped."""
    return collapse(words).strip(_EDGE + " ").casefold()


def holds_words(text: str, words: str) -> bool:
    """Whether `text` has `words` as whole words (case-insensitive)."""
    return re.search(rf"(?<!\w){re.escape(normalized(words))}(?!\w)", collapse(text).casefold()) is not None


def score_placement(case: PlacementCase, output: str) -> list[str]:
    """Per tag of the case, in the order they open: "exact" (it encloses exactly the expected
    words), "word_missing" (the output's text lacks them: the model translated otherwise),
    "tag_missing" (no element with its tag and attributes left for it) or "wrong"."""
    got: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
    for e in _elements(output):
        got.setdefault(_tag(e), []).append(_text_of(e))
    text = text_content(output)
    seen: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()
    outcomes = []
    for element, expected in zip(_elements(case.markup), case.expected, strict=True):
        key = _tag(element)
        k = seen[key]
        seen[key] += 1
        if not holds_words(text, expected):
            outcomes.append("word_missing")
        elif k >= len(got.get(key, [])):
            outcomes.append("tag_missing")
        else:
            outcomes.append("exact" if normalized(got[key][k]) == normalized(expected) else "wrong")
    return outcomes


# --- The glossary sets --------------------------------------------------------------------------

# Common nouns: source word -> (the English word the models usually write, a glossary target they
# do not write). "Junge" is left out: it is also the adjective "junge".
TERMS: dict[str, dict[str, tuple[str, str]]] = {
    "de": {
        "Hund": ("dog", "canine"),
        "Mann": ("man", "gentleman"),
        "Frau": ("woman", "lady"),
        "Kind": ("child", "youngster"),
        "Straße": ("street", "roadway"),
        "Mädchen": ("girl", "maiden"),
        "Ball": ("ball", "sphere"),
        "Strand": ("beach", "seashore"),
        "Wasser": ("water", "liquid"),
        "Hemd": ("shirt", "blouse"),
    },
    "fr": {
        "chien": ("dog", "canine"),
        "homme": ("man", "gentleman"),
        "femme": ("woman", "lady"),
        "enfant": ("child", "youngster"),
        "rue": ("street", "roadway"),
        "fille": ("girl", "maiden"),
        "garçon": ("boy", "lad"),
        "plage": ("beach", "seashore"),
        "ballon": ("ball", "sphere"),
        "chemise": ("shirt", "blouse"),
    },
}
# A German glossary that none of the BLEU sentences match (`unrelated_glossary` checks).
UNRELATED = {
    "Quantencomputer": "quantum computer",
    "Steuererklärung": "tax return",
    "Mietvertrag": "lease agreement",
    "Betriebssystem": "operating system",
    "Datenbank": "database",
    "Rechnung": "invoice",
    "Bundestag": "federal parliament",
    "Kündigungsfrist": "notice period",
}


def occurrences(text: str, word: str, strict: bool = False) -> int:
    """Whole-word occurrences of `word` in `text`, case-insensitive; strict: not joined to an
    apostrophe or hyphen either (French "l'homme" counts loosely, not strictly)."""
    edge = r"\w'’-" if strict else r"\w"
    return len(re.findall(rf"(?<![{edge}]){re.escape(word)}(?![{edge}])", text, re.I))


@dataclass
class GlossaryCase:
    lang: str
    text: str
    term: str  # the glossary entry's source (TERMS' key)
    surface: str  # the term as the text spells it
    usual: str  # the English word the model writes for it without a glossary
    target: str  # the glossary's target


def glossary_candidates(lines: Sequence[str], lang: str) -> list[GlossaryCase]:
    """Sentences with exactly one occurrence of one of TERMS[lang] (standing alone: not joined to
    an apostrophe or hyphen) and no other term, taken round-robin over the terms in corpus order
    (so that no one noun fills the set)."""
    terms = TERMS[lang]
    by_term: dict[str, list[GlossaryCase]] = {t: [] for t in terms}
    for line in lines:
        found = [t for t in terms if occurrences(line, t)]
        if len(found) == 1 and occurrences(line, found[0]) == 1 and occurrences(line, found[0], strict=True) == 1:
            t = found[0]
            m = re.search(rf"(?<!\w){re.escape(t)}(?!\w)", line, re.I)
            assert m is not None
            by_term[t].append(GlossaryCase(lang, line, t, m[0], *terms[t]))
    out: list[GlossaryCase] = []
    for k in range(max(map(len, by_term.values()), default=0)):
        out += [cases[k] for cases in by_term.values() if k < len(cases)]
    return out


def unmatched(lines: Sequence[str], lang: str, n: int) -> list[str]:
    """The first `n` lines in which no term of TERMS[lang] occurs (even joined to an apostrophe)."""
    return [line for line in lines if not any(occurrences(line, t) for t in TERMS[lang])][:n]


def unrelated_glossary(lines: Sequence[str]) -> dict[str, str]:
    """UNRELATED without the entries that occur in `lines`."""
    return {s: t for s, t in UNRELATED.items() if not any(occurrences(line, s) for line in lines)}


def word_index(text: str, word: str) -> int | None:
    """The index among `text`'s words (runs of \\w, case-insensitive) of the first word of `word`'s
    only whole-word occurrence; None when it occurs zero times or more than once."""
    words = [w.casefold() for w in re.findall(r"\w+", text)]
    wanted = [w.casefold() for w in re.findall(r"\w+", word)]
    at = [i for i in range(len(words) - len(wanted) + 1) if words[i : i + len(wanted)] == wanted]
    return at[0] if len(at) == 1 else None


def aligned(plain: str, usual: str, output: str, target: str) -> bool:
    """Whether `target` stands in `output` where `usual` stood in `plain` (each once), the words
    around allowed to differ: in a word alignment (difflib) of `plain`, `usual` replaced by
    `target`, with `output`, the target is matched to itself together with the word before it
    (or both texts start with it), and it stands within one word of the usual word's index. A word
    lost or added right before the target (an article) is a misplacement; one changed earlier in
    the sentence ("are jumping" for "jump") is not; nor is the target moved elsewhere in the
    sentence with its article ("Running is a canine." for "A dog is running.")."""
    i, j = word_index(plain, usual), word_index(output, target)
    if i is None or j is None:
        return False
    words = [w.casefold() for w in re.findall(r"\w+", plain)]
    n = len(re.findall(r"\w+", usual))
    a_words = words[:i] + [w.casefold() for w in re.findall(r"\w+", target)] + words[i + n :]
    b_words = [w.casefold() for w in re.findall(r"\w+", output)]
    for a, b, size in difflib.SequenceMatcher(None, a_words, b_words, autojunk=False).get_matching_blocks():
        if a <= i < a + size and j == b + (i - a):
            return abs(j - i) <= 1 and (i > a or (i == 0 and j == 0))
    return False


def usable(case: GlossaryCase, plain: str) -> bool:
    """The plain translation has the usual word exactly once and not the glossary's target."""
    return occurrences(plain, case.usual) == 1 and occurrences(plain, case.target) == 0


@dataclass
class GlossaryOutcome:
    target_present: bool  # the target occurs as a whole word
    replaced: bool  # the target occurs once and the usual word no more
    in_place: bool  # replaced, and where the usual word stood in the plain translation (`aligned`)
    landed: bool  # an applied term of the entry whose span in the text holds the target


def score_glossary(
    case: GlossaryCase, plain: str, output: str, applied: Sequence[tuple[str, int, int]]
) -> GlossaryOutcome:
    """`applied`: (target, start, end) of each applied term of the translation (code points)."""
    present = occurrences(output, case.target) > 0
    replaced = occurrences(output, case.target) == 1 and occurrences(output, case.usual) == 0
    position = word_index(plain, case.usual)
    same_index = position is not None and word_index(output, case.target) == position
    in_place = replaced and (same_index or aligned(plain, case.usual, output, case.target))
    landed = any(t == case.target and 0 <= s < e and output[s:e] == case.target for t, s, e in applied)
    return GlossaryOutcome(present, replaced, in_place, landed)


# --- Figures ------------------------------------------------------------------------------------


def share(flags: Sequence[bool]) -> float | None:
    return round(sum(flags) / len(flags), 4) if flags else None


def interleaved(
    a: Callable[[Any], Any],
    b: Callable[[Any], Any],
    items: Sequence[Any],
    rounds: int,
    groups: Sequence[Sequence[str]] | None = None,
) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """Calls a(item) and b(item) for every item, `rounds` times, the two back to back (which goes
    first alternates by item and round): the cost figures of a against b, and the answers of
    the first round (a's, b's). Per item the median time over the rounds; "median_of_ratios" is
    the median over items of a's median / b's; "ratio_of_sums" is the sum of a's medians / b's.
    With `groups` (the names of the groups each item is in), "median_of_ratios_by_group" too."""
    ta: list[list[float]] = [[] for _ in items]
    tb: list[list[float]] = [[] for _ in items]
    first_a: list[Any] = [None] * len(items)
    first_b: list[Any] = [None] * len(items)
    for r in range(rounds):
        for i, item in enumerate(items):
            order = ((a, ta, first_a), (b, tb, first_b))
            for call, times, answers in order if (r + i) % 2 == 0 else order[::-1]:
                start = time.perf_counter()
                answer = call(item)
                times[i].append(time.perf_counter() - start)
                if r == 0:
                    answers[i] = answer
    ma = [statistics.median(t) for t in ta]
    mb = [statistics.median(t) for t in tb]
    cost: dict[str, Any] = {
        "n": len(items),
        "rounds": rounds,
        "a_ms_median": round(statistics.median(ma) * 1000, 2) if ma else None,
        "b_ms_median": round(statistics.median(mb) * 1000, 2) if mb else None,
        "median_of_ratios": round(statistics.median(x / y for x, y in zip(ma, mb)), 3) if ma else None,
        "ratio_of_sums": round(sum(ma) / sum(mb), 3) if ma else None,
    }
    if groups is not None:
        by_group: dict[str, list[float]] = {}
        for names, x, y in zip(groups, ma, mb):
            for name in names:
                by_group.setdefault(name, []).append(x / y)
        cost["median_of_ratios_by_group"] = {g: round(statistics.median(r), 3) for g, r in sorted(by_group.items())}
    return cost, first_a, first_b


# --- The server's side --------------------------------------------------------------------------


class Client:
    """Translate calls to the server at `address`, one beam width for all."""

    def __init__(self, address: str, beam: int, timeout: float = 120.0):
        from service.api.mtserve.v1 import translation_pb2 as pb
        from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

        self.pb = pb
        self.channel = grpc.insecure_channel(address, [("grpc.max_receive_message_length", 64 << 20)])
        self.stub = pb_grpc.TranslationServiceStub(self.channel)
        self.beam = beam
        self.timeout = timeout

    def translate(self, texts: Sequence[str], source: str = "", target: str = "en", **options: Any) -> Any:
        """The TranslateResponse; `options` are TranslationOptions fields (beam_size defaults to the
        client's)."""
        options.setdefault("beam_size", self.beam)
        request = self.pb.TranslateRequest(
            texts=list(texts),
            source_language=source,
            target_language=target,
            options=self.pb.TranslationOptions(**options),
        )
        return self.stub.Translate(request, timeout=self.timeout)

    def one(self, text: str, source: str, **options: Any) -> Any:
        """The Translation of one text."""
        return self.translate([text], source, **options).translations[0]

    def served(self) -> dict[str, str]:
        """Source language -> "NAME:VERSION" of each served model (its default pair)."""
        info = self.stub.GetModelInfo(self.pb.GetModelInfoRequest(), timeout=self.timeout)
        return {m.source_language: f"{m.name}:{m.version}" for m in info.models}

    def close(self) -> None:
        self.channel.close()


def corpus(data_dir: Path, lang: str) -> list[str]:
    from export.data import read_lines, split_path

    return read_lines(split_path(data_dir, SPLIT, lang))


def run_html(client: Client, data_dir: Path, n: int, rounds: int, seed: int) -> dict[str, Any]:
    html_type = client.pb.TEXT_TYPE_HTML
    cases = build_html_cases(corpus(data_dir, "de"), n, seed)
    # One pass: a sentence of one row without a translate="no" element, decoded once as its plain
    # text is (a <br> makes two rows, a translate="no" element two passes: docs/terminology.md).
    groups = [
        ["+".join(c.kinds)] + (["one_pass"] if "no_translate" not in c.kinds and "<br" not in c.markup else [])
        for c in cases
    ]
    cost, outputs, plains = interleaved(
        lambda c: client.one(c.markup, "de", text_type=html_type).text,
        lambda c: client.one(c.text, "de").text,
        cases,
        rounds,
        groups,
    )
    scored = [score_html(c, out, plain) for c, out, plain in zip(cases, outputs, plains)]
    kinds = Counter(k for c in cases for k in c.kinds)
    failed = [
        {"markup": c.markup, "output": out, "plain": plain}
        for c, out, plain, s in zip(cases, outputs, plains, scored)
        if not (s.tags_preserved and s.text_as_plain)
    ]
    spans = sum(s.no_translate_spans for s in scored)
    return {
        "n": len(cases),
        "kinds": dict(kinds),
        "tags_preserved": share([s.tags_preserved for s in scored]),
        "text_as_plain": share([s.text_as_plain for s in scored]),
        # The invariant holds for markup without translate="no" content; a <br> is a
        # segment boundary (docs/markup.md), so its sentence is two rows and reads differently.
        "text_as_plain_applicable": share(
            [s.text_as_plain for c, s in zip(cases, scored) if "no_translate" not in c.kinds and "<br" not in c.markup]
        ),
        "text_as_plain_by_kind": {
            k: share([s.text_as_plain for c, s in zip(cases, scored) if k in c.kinds]) for k in sorted(kinds)
        },
        "no_translate_spans": spans,
        "no_translate_verbatim": round(sum(s.no_translate_kept for s in scored) / spans, 4) if spans else None,
        "cost_html_vs_plain": cost,
        "examples_failed": failed[:5],
        "failed": len(failed),
    }


def run_placement(client: Client, path: Path) -> dict[str, Any]:
    html_type = client.pb.TEXT_TYPE_HTML
    cases = read_placement(path)
    by_lang: dict[str, Counter[str]] = {}
    wrong = []
    for case in cases:
        output = client.one(case.markup, case.lang, text_type=html_type).text
        outcomes = score_placement(case, output)
        by_lang.setdefault(case.lang, Counter()).update(outcomes)
        if any(o != "exact" for o in outcomes):
            wrong.append({"markup": case.markup, "output": output, "expected": case.expected, "outcomes": outcomes})
    total: Counter[str] = sum(by_lang.values(), Counter())

    def figures(c: Counter[str]) -> dict[str, Any]:
        tags = sum(c.values())
        judged = tags - c["word_missing"]
        return {
            "tags": tags,
            **{k: c[k] for k in ("exact", "wrong", "tag_missing", "word_missing")},
            "exact_share": round(c["exact"] / judged, 4) if judged else None,
            "exact_share_of_all": round(c["exact"] / tags, 4) if tags else None,
        }

    return {
        "cases": len(cases),
        "all": figures(total),
        **{lang: figures(c) for lang, c in sorted(by_lang.items())},
        "examples_not_exact": wrong[:8],
        "not_exact": len(wrong),
    }


def _applied(t: Any) -> list[tuple[str, int, int]]:
    return [(a.target, a.start, a.end) for a in t.applied_terms]


def matched_set(client: Client, data_dir: Path, per_lang: int) -> tuple[list[GlossaryCase], dict[str, str], dict]:
    """Up to `per_lang` glossary candidates per language whose plain translation has the usual
    word once and not the target (`usable`), their plain translations, and the candidates' count."""
    matched: list[GlossaryCase] = []
    plain: dict[str, str] = {}
    pool: dict[str, int] = {}
    for lang in ("de", "fr"):
        candidates = glossary_candidates(corpus(data_dir, lang), lang)
        pool[lang] = len(candidates)
        taken = 0
        for case in candidates:
            if taken >= per_lang:
                break
            out = client.one(case.text, lang).text
            if usable(case, out):
                matched.append(case)
                plain[case.text] = out
                taken += 1
    return matched, plain, pool


def glossary_matched(client: Client, matched: list[GlossaryCase], plain: dict[str, str], rounds: int) -> dict:
    """Each matched sentence with its one-entry glossary and without, interleaved: where the
    target landed, and the cost."""
    pb = client.pb
    cost, outputs, again = interleaved(
        lambda c: client.one(c.text, c.lang, glossary=[pb.GlossaryEntry(source=c.term, target=c.target)]),
        lambda c: client.one(c.text, c.lang).text,
        matched,
        rounds,
    )
    scored = [score_glossary(c, plain[c.text], t.text, _applied(t)) for c, t in zip(matched, outputs)]
    misses = [
        {
            "text": c.text,
            "glossary": [c.term, c.target],
            "plain": plain[c.text],
            "output": t.text,
            "applied": _applied(t),
        }
        for c, t, s in zip(matched, outputs, scored)
        if not s.in_place
    ]
    return {
        "n": len(matched),
        "terms": dict(Counter(f"{c.lang}:{c.term}" for c in matched)),
        "target_present": share([s.target_present for s in scored]),
        "replaced": share([s.replaced for s in scored]),
        "in_place": share([s.in_place for s in scored]),
        "landed": share([s.landed for s in scored]),
        "plain_stable": share([plain[c.text] == a for c, a in zip(matched, again)]),  # the same text twice
        "examples_not_in_place": misses[:5],
        "cost": {**cost, "a": f"glossary of one entry, beam {client.beam}", "b": "no glossary"},
    }


def do_not_translate(client: Client, matched: list[GlossaryCase], plain: dict[str, str]) -> dict[str, Any]:
    """The matched sentences with their noun, as the text spells it, as a do-not-translate phrase:
    whether it comes back verbatim, and whether where the model's word for it stood in the plain
    translation (`aligned`, as the glossary's `in_place`)."""
    verbatim, landed, in_place, misses = [], [], [], []
    for case in matched:
        t = client.one(case.text, case.lang, do_not_translate=[case.surface])
        verbatim.append(case.surface in t.text)
        in_place.append(
            occurrences(t.text, case.surface) == 1
            and occurrences(t.text, case.usual) == 0
            and aligned(plain[case.text], case.usual, t.text, case.surface)
        )
        landed.append(any(0 <= s and t.text[s:e] == case.surface for _, s, e in _applied(t)))
        if not verbatim[-1]:
            misses.append({"text": case.text, "phrase": case.surface, "output": t.text})
    return {
        "n": len(verbatim),
        "verbatim": share(verbatim),
        "landed": share(landed),
        "in_place": share(in_place),
        "examples_not_verbatim": misses[:5],
    }


def unmatched_identical(client: Client, data_dir: Path, per_lang: int) -> dict[str, Any]:
    """Sentences no term matches, with the language's whole glossary and without."""
    identical, differing = [], []
    for lang in ("de", "fr"):
        glossary = [client.pb.GlossaryEntry(source=s, target=t) for s, (_, t) in TERMS[lang].items()]
        for text in unmatched(corpus(data_dir, lang), lang, per_lang):
            with_glossary = client.one(text, lang, glossary=glossary).text
            without = client.one(text, lang).text
            identical.append(with_glossary == without)
            if with_glossary != without:
                differing.append({"text": text, "glossary": with_glossary, "none": without})
    return {"n": len(identical), "identical": share(identical), "examples_differing": differing[:5]}


def run_glossary(client: Client, data_dir: Path, n: int, bleu_n: int, rounds: int) -> dict[str, Any]:
    per_lang = n // 2
    matched, plain, pool = matched_set(client, data_dir, per_lang)
    return {
        "candidates": pool,
        "matched": part(lambda: glossary_matched(client, matched, plain, rounds)),
        "do_not_translate": part(lambda: do_not_translate(client, matched, plain)),
        "unmatched": part(lambda: unmatched_identical(client, data_dir, per_lang)),
        "bleu": part(lambda: bleu_with_unrelated(client, data_dir, bleu_n)),
    }


def run_glossary_cost(client: Client, data_dir: Path, n: int, rounds: int) -> dict[str, Any]:
    """The cost of a one-entry glossary on German sentences with one term (`glossary_candidates`),
    against no glossary, whatever the model writes for the term: for a model whose translations
    the "glossary" part cannot read (the random real-size model, benchmarks/real_size_model.py)."""
    cases = glossary_candidates(corpus(data_dir, "de"), "de")[:n]

    def entry(c: GlossaryCase) -> Any:
        return [client.pb.GlossaryEntry(source=c.term, target=c.target)]

    cost, _, _ = interleaved(
        lambda c: client.one(c.text, "de", glossary=entry(c)).text,
        lambda c: client.one(c.text, "de").text,
        cases,
        rounds,
    )
    return {**cost, "a": "glossary of one entry", "b": "no glossary"}


def bleu_with_unrelated(client: Client, data_dir: Path, n: int, batch: int = 50) -> dict[str, Any]:
    """BLEU of the first `n` German test sentences with the unrelated glossary and without, in the
    same batches; and without it a second time: the noise floor of "identical" (int8 rows may
    decode differently beside other batch mates, which the server's scheduling varies)."""
    import sacrebleu

    from export.data import read_lines, split_path

    sources = corpus(data_dir, "de")[:n]
    refs = read_lines(split_path(data_dir, SPLIT, "en"))[: len(sources)]
    glossary = unrelated_glossary(sources)
    entries = [client.pb.GlossaryEntry(source=s, target=t) for s, t in glossary.items()]
    with_glossary: list[str] = []
    without: list[str] = []
    again: list[str] = []
    for i in range(0, len(sources), batch):
        texts = sources[i : i + batch]
        with_glossary += [t.text for t in client.translate(texts, "de", glossary=entries).translations]
        without += [t.text for t in client.translate(texts, "de").translations]
        again += [t.text for t in client.translate(texts, "de").translations]
    none_bleu = sacrebleu.corpus_bleu(without, [refs]).score
    glossary_bleu = sacrebleu.corpus_bleu(with_glossary, [refs]).score
    return {
        "n": len(sources),
        "glossary_terms": len(glossary),
        "none": round(none_bleu, 2),
        "glossary": round(glossary_bleu, 2),
        "delta": round(glossary_bleu - none_bleu, 2),
        "identical": share([a == b for a, b in zip(with_glossary, without)]),
        "none_again_delta": round(sacrebleu.corpus_bleu(again, [refs]).score - none_bleu, 2),
        "none_again_identical": share([a == b for a, b in zip(again, without)]),
    }


def detection_sentences(data_dir: Path, limit: int) -> dict[str, list[str]]:
    """German and French test sentences of at least MIN_CHARS characters (the first `limit` of
    each; 0: all)."""
    return {lang: [t for t in corpus(data_dir, lang) if len(t) >= MIN_CHARS][: limit or None] for lang in ("de", "fr")}


def mixed_texts(german: Sequence[str], french: Sequence[str], n: int) -> list[tuple[str, list[tuple[int, int, str]]]]:
    """`n` texts of two sentences, German then French and French then German by turns (sentences
    ending with a full stop): each text and its sentences' code-point spans and languages."""
    de = [t for t in german if t.endswith(".")]
    fr = [t for t in french if t.endswith(".")]
    out = []
    for i in range(min(n, len(de), len(fr))):
        pair = [(de[i], "de"), (fr[i], "fr")]
        if i % 2:
            pair.reverse()
        text = f"{pair[0][0]} {pair[1][0]}"
        first = len(pair[0][0])
        out.append((text, [(0, first, pair[0][1]), (first + 1, len(text), pair[1][1])]))
    return out


def _language_at(start: int, end: int, spans: Sequence[tuple[int, int, str]]) -> str:
    """The language of the sentence that overlaps [start, end) most."""
    return max(spans, key=lambda s: min(end, s[1]) - max(start, s[0]))[2]


def detection_accuracy(
    client: Client, sentences: dict[str, list[str]], models: dict[str, str], batch: int = 50
) -> dict[str, Any]:
    """source_language "auto" on each language's sentences, in batches: detected right, sent to
    the model that serves the language."""
    accuracy: dict[str, Any] = {}
    right_all: list[bool] = []
    model_all: list[bool] = []
    wrong = []
    for lang, texts in sentences.items():
        right, model_right, confidences = [], [], []
        for i in range(0, len(texts), batch):
            chunk = texts[i : i + batch]
            for text, t in zip(chunk, client.translate(chunk, "auto").translations):
                right.append(t.detected_language == lang)
                model_right.append(t.model == models.get(lang))
                confidences.append(t.detected_confidence)
                if t.detected_language != lang:
                    wrong.append({"text": text, "expected": lang, "detected": t.detected_language})
        accuracy[lang] = {
            "n": len(texts),
            "right": share(right),
            "model_right": share(model_right),
            "confidence_p50": round(statistics.median(confidences), 4) if confidences else None,
        }
        right_all += right
        model_all += model_right
    accuracy["all"] = {"n": len(right_all), "right": share(right_all), "model_right": share(model_all)}
    accuracy["examples_wrong"] = wrong[:10]
    return accuracy


def _named(client: Client, texts: Sequence[str], lang: str) -> dict[str, str]:
    """Each text's translation with its language named."""
    return dict(zip(texts, (t.text for t in client.translate(texts, lang).translations)))


def mixed_batch(client: Client, sentences: dict[str, list[str]], models: dict[str, str], n: int = 32) -> dict[str, Any]:
    """One request of German and French sentences by turns with source_language "auto": each
    text's language, model, and translation as when its language is named."""
    mixed = [(t, lang) for pair in zip(sentences["de"][:n], sentences["fr"][:n]) for t, lang in zip(pair, ("de", "fr"))]
    routed = {lang: _named(client, [t for t, lng in mixed if lng == lang], lang) for lang in ("de", "fr")}
    answers = client.translate([t for t, _ in mixed], "auto").translations
    return {
        "n": len(mixed),
        "language_right": share([a.detected_language == lang for a, (_, lang) in zip(answers, mixed)]),
        "model_right": share([a.model == models.get(lang) for a, (_, lang) in zip(answers, mixed)]),
        "text_as_routed": share([a.text == routed[lang][t] for a, (t, lang) in zip(answers, mixed)]),
        "models_seen": dict(Counter(a.model for a in answers)),
    }


def per_segment(client: Client, sentences: dict[str, list[str]], n: int = 50) -> dict[str, Any]:
    """Texts of a German and a French sentence with detect_per_segment: the segments as the
    sentences were joined, each segment's language, its translation as when its language is
    named, and the text's language (that of most of its characters)."""
    two = mixed_texts(sentences["de"], sentences["fr"], n)
    single = {
        lang: _named(client, [text[a:b] for text, spans in two for a, b, lng in spans if lng == lang], lang)
        for lang in ("de", "fr")
    }
    answers = client.translate([t for t, _ in two], "auto", split=client.pb.SPLIT_SENTENCES, detect_per_segment=True)
    as_sent, right, as_routed, text_right = [], [], [], []
    for (text, spans), t in zip(two, answers.translations):
        segments = list(t.segments)
        as_sent.append([(s.start, s.end) for s in segments] == [(a, b) for a, b, _ in spans])
        for s in segments:
            lang = _language_at(s.start, s.end, spans)
            right.append(s.detected_language == lang)
            as_routed.append(s.text == single[lang].get(text[s.start : s.end]))
        text_right.append(t.detected_language == max(spans, key=lambda s: s[1] - s[0])[2])
    return {
        "n": len(two),
        "split_as_sent": share(as_sent),
        "segments": len(right),
        "segment_language_right": share(right),
        "segment_text_as_routed": share(as_routed),
        "text_language_right": share(text_right),
        "models_seen": dict(Counter(t.model for t in answers.translations)),
    }


def detector_alone(data_dir: Path, limit: int) -> dict[str, Any]:
    """The serving path's detector without the server: benchmarks/language_detection.py's harness
    (its long sentences; candidates de, en and fr), in a child process."""
    from benchmarks.language_detection import measure_in_child

    harness = measure_in_child("mtserve (service.runtime.language_id)", data_dir, limit)
    if "long" not in harness:
        return {"error": harness.get("error")}
    long = harness["long"]
    return {
        "load_s": harness["load_s"],
        "rss_added_mib": harness["rss_added_mib"],
        **{k: long[k] for k in ("median_us", "mean_us", "p99_us")},
        "accuracy_restricted": {lang: long["accuracy"][lang]["restricted"] for lang in ("de", "fr")},
        "candidates": "de, en, fr",
    }


def run_detection(client: Client, data_dir: Path, limit: int) -> dict[str, Any]:
    models = client.served()
    sentences = detection_sentences(data_dir, limit)
    return {
        "served": models,
        "accuracy": part(lambda: detection_accuracy(client, sentences, models)),
        "mixed_batch": part(lambda: mixed_batch(client, sentences, models)),
        "per_segment": part(lambda: per_segment(client, sentences)),
        "detector_alone": part(lambda: detector_alone(data_dir, limit)),
    }


def part(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """The figures of one part (or piece of one) and its seconds; {"error": ...} when it fails
    with an error status or a field the server does not fill (the others still run)."""
    start = time.perf_counter()
    try:
        out = run()
    except grpc.RpcError as e:
        out = {"error": f"{e.code().name}: {(e.details() or '')[:300]}"}
    except (ValueError, LookupError) as e:  # e.g. a field the server does not fill yet
        out = {"error": f"{type(e).__name__}: {e}", "where": traceback.format_exc(limit=-2)[-600:]}
    out["seconds"] = round(time.perf_counter() - start, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.machine import machine
    from export.data import DEFAULT_DATA_DIR

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=str(REPO / "models"), help="model repository (NAME/VERSION/)")
    ap.add_argument("--model-names", default="de-en,fr-en", help="the models to serve from it")
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_DATA_DIR), help="multi30k directory")
    ap.add_argument("--only", default=",".join(PARTS), help=f"the parts to run, of {', '.join(PARTS)}")
    ap.add_argument("--beam", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the interleaved cost pairs")
    ap.add_argument("--seed", type=int, default=0, help="of the HTML set's tags and positions")
    ap.add_argument("--html-sentences", type=int, default=300)
    ap.add_argument("--glossary-sentences", type=int, default=200, help="matched (and unmatched) sentences")
    ap.add_argument("--bleu-sentences", type=int, default=500)
    ap.add_argument("--detection-limit", type=int, default=0, help="sentences per language (0: all)")
    ap.add_argument("--placement", type=Path, default=PLACEMENT)
    ap.add_argument("--server-arg", action="append", default=[], help="a flag for mtserve serve (repeatable)")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    parts = [p for p in args.only.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        ap.error(f"--only: no part {', '.join(unknown)} (parts: {', '.join(PARTS)})")
    load_before = os.getloadavg()
    start = time.perf_counter()
    names = args.model_names.split(",")
    result: dict[str, Any] = {
        "benchmark": "translation_service",
        "machine": machine(),
        "models": args.models,
        "model_names": names,
        "server_args": args.server_arg,
        "beam": args.beam,
        "targets": TARGETS,
    }
    with Server(args.models, args.server_arg, log_prefix="mtserve-service-", models=names) as server:
        client = Client(server.address, args.beam)
        runs: dict[str, Callable[[], dict[str, Any]]] = {
            "html": lambda: run_html(client, args.data, args.html_sentences, args.rounds, args.seed),
            "placement": lambda: run_placement(client, args.placement),
            "glossary": lambda: run_glossary(
                client, args.data, args.glossary_sentences, args.bleu_sentences, args.rounds
            ),
            "glossary_cost": lambda: run_glossary_cost(client, args.data, args.glossary_sentences, args.rounds),
            "detection": lambda: run_detection(client, args.data, args.detection_limit),
        }
        for name in parts:
            result[name] = part(runs[name])
        client.close()
        if any("error" in result[name] for name in parts):
            result["server_log_tail"] = server.tail()
    result["load_average"] = {"before": load_before, "after": os.getloadavg()}
    result["seconds"] = round(time.perf_counter() - start, 1)
    print_result(result, args.json)


if __name__ == "__main__":
    main()
