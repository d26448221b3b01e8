"""Glossary terms and do-not-translate phrases, matched on a source text's words.

A glossary is a list of `Term`s: a source phrase, the one target it must be translated to, and
optionally other surface forms of the source (its inflections: "Hund", forms "Hundes|Hunde|
Hunden"), which match as the phrase does. A do-not-translate phrase is a term whose target is the
matched source text itself, verbatim.

Matching is on words (maximal runs of letters, digits, marks and underscores; everything else
separates them), case-insensitively unless a term asks otherwise: "ACME Cloud" matches "acme
cloud", never "acmecloud" or "ACME Clouds". Where matches overlap, the longest wins, then the
earliest. A term of n words costs one walk of a trie per text word (`TermIndex.find`): linear in
the text for a bounded term length.

Named glossaries ship with a model version as `glossaries/ID.tsv` (`read_tsv`, in
contract.glossary's format): one term a line, `source<TAB>target`, and optionally a third column of
forms separated by `|`; blank lines and lines starting with `#` are skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from contract.glossary import GlossaryFormatError, parse_tsv

WORD = re.compile(r"\w+")
# Limits that every glossary (a request's own or a named one) is held to; GetModelInfo shows them.
MAX_TERM_CHARS = 256
MAX_TERM_WORDS = 16


class TermError(ValueError):
    """A term that cannot be used; the message names what is wrong with it."""


@dataclass(frozen=True)
class Term:
    source: str
    target: str  # for a do-not-translate phrase: "" (the matched source text is kept)
    forms: tuple[str, ...] = ()  # other surface forms of `source` that match it
    case_sensitive: bool = False

    @property
    def verbatim(self) -> bool:
        """A do-not-translate phrase: the matched text comes back as it is."""
        return not self.target


@dataclass(frozen=True)
class Match:
    """A term found in a text: its code-point span [start, end) and what it must become."""

    start: int
    end: int
    term: Term
    text: str  # the matched source text

    @property
    def target(self) -> str:
        return self.text if self.term.verbatim else self.term.target


def words(text: str) -> list[re.Match[str]]:
    return list(WORD.finditer(text))


def _key(word: str, case_sensitive: bool) -> str:
    return word if case_sensitive else word.casefold()


@dataclass
class _Node:
    next: dict[str, _Node] = field(default_factory=dict)
    terms: list[Term] = field(default_factory=list)  # terms whose phrase ends here


def check_term(source: str, target: str, forms: Sequence[str] = (), where: str = "term") -> None:
    """Raise TermError (naming `where`) for a term that cannot be matched or is over the limits."""
    for name, value in (("source", source), ("target", target), *((f"forms[{i}]", f) for i, f in enumerate(forms))):
        if len(value) > MAX_TERM_CHARS:
            raise TermError(f"{where}.{name}: {len(value)} characters, at most {MAX_TERM_CHARS}")
    for name, phrase in (("source", source), *((f"forms[{i}]", f) for i, f in enumerate(forms))):
        n = len(words(phrase))
        if n == 0:
            raise TermError(f"{where}.{name}: has no word to match")
        if n > MAX_TERM_WORDS:
            raise TermError(f"{where}.{name}: {n} words, at most {MAX_TERM_WORDS}")


class TermIndex:
    """The terms of one request (its glossary entries, do-not-translate phrases and named glossary)
    in a trie over their words, for `find`."""

    def __init__(self, terms: Iterable[Term]) -> None:
        self._roots = {False: _Node(), True: _Node()}  # by case sensitivity
        self.size = 0
        for term in terms:
            for phrase in (term.source, *term.forms):
                node = self._roots[term.case_sensitive]
                for w in words(phrase):
                    node = node.next.setdefault(_key(w.group(), term.case_sensitive), _Node())
                node.terms.append(term)
            self.size += 1

    def __bool__(self) -> bool:
        return self.size > 0

    def find(self, text: str) -> list[Match]:
        """The terms in `text`, in order, none overlapping: of overlapping candidates the one of
        most words wins, then the earliest (each word starts at most one candidate: its longest)."""
        ws = words(text)
        candidates = [(n, i, term) for i in range(len(ws)) if (best := self._longest_at(ws, i)) for n, term in [best]]
        taken = [False] * len(ws)
        found: list[Match] = []
        for n, i, term in sorted(candidates, key=lambda c: (-c[0], c[1])):
            if any(taken[i : i + n]):
                continue
            taken[i : i + n] = [True] * n
            start, end = ws[i].start(), ws[i + n - 1].end()
            found.append(Match(start, end, term, text[start:end]))
        return sorted(found, key=lambda m: m.start)

    def _longest_at(self, ws: Sequence[re.Match[str]], i: int) -> tuple[int, Term] | None:
        """(words, term) of the longest phrase starting at word i; the first term given wins ties."""
        best: tuple[int, Term] | None = None
        for case_sensitive, root in self._roots.items():
            node = root
            for n in range(min(MAX_TERM_WORDS, len(ws) - i)):
                nxt = node.next.get(_key(ws[i + n].group(), case_sensitive))
                if nxt is None:
                    break
                node = nxt
                if node.terms and (best is None or n + 1 > best[0]):
                    best = (n + 1, node.terms[0])
        return best


def read_tsv(text: str, where: str) -> list[Term]:
    """A named glossary's terms from its TSV text (contract.glossary's format); TermError names
    `where` and the line at fault."""
    terms: list[Term] = []
    try:
        lines = parse_tsv(text, where)
    except GlossaryFormatError as e:
        raise TermError(str(e)) from None
    for no, source, target, forms in lines:
        check_term(source, target, forms, where=f"{where}:{no}")
        terms.append(Term(source, target, forms))
    return terms
