"""The Moses sentence splitter of the sentence-splitter package (`SentenceSplitter.split`), rule
for rule, in linear time: its patterns compiled once, a word without a period skipped before any
pattern runs, and the text put back together with one join. The package compiles (looks up) each
pattern for every word: 299 ms for the 25,000 sentences of `"Ja. " * 25000`, where mtserve's whole
splitting takes 32 ms (`python -m benchmarks.splitter --speed`). The non-breaking prefix files are read as
the package reads them. tests/service/engine/test_splitter.py checks both give the same sentences."""

from __future__ import annotations

from pathlib import Path

import regex

_STARTER = r"[\'\"([\u00bf\u00A1\p{Initial_Punctuation}]"
_UPPER = r"[\p{Uppercase_Letter}\p{Other_Letter}]"
# The breaks the package adds before looking at periods, in its order (pattern, replacement).
_BREAKS = [
    regex.compile(rf"([?!]) +({_STARTER}*{_UPPER})", flags=regex.UNICODE),
    regex.compile(rf"(\.[\.]+) +({_STARTER}*{_UPPER})", flags=regex.UNICODE),
    regex.compile(
        rf"([?!\.][\ ]*[\'\")\]\p{{Final_Punctuation}}]+) +({_STARTER}*[\ ]*{_UPPER})",
        flags=regex.UNICODE,
    ),
    regex.compile(rf"([?!\.]) +([\'\"[\u00bf\u00A1\p{{Initial_Punctuation}}]+[\ ]*{_UPPER})", flags=regex.UNICODE),
]
_SPACES = regex.compile(r" +", flags=regex.UNICODE)
_PERIOD_END = regex.compile(r"([\w\.\-]*)([\'\"\)\]\%\p{Final_Punctuation}]*)(\.+)$", flags=regex.UNICODE)
_ACRONYM = regex.compile(r"(\.)[\p{Uppercase_Letter}\p{Other_Letter}\-]+(\.+)$", flags=regex.UNICODE)
_NEXT_STARTS = regex.compile(
    r"^([ ]*[\'\"([\u00bf\u00A1\p{Initial_Punctuation}]*[ ]*[\p{Uppercase_Letter}\p{Other_Letter}0-9])",
    flags=regex.UNICODE,
)
_NUMBER_START = regex.compile(r"^[0-9]+", flags=regex.UNICODE)
_COMMENT = regex.compile(r"#.*", flags=regex.DOTALL | regex.UNICODE)

DEFAULT, NUMERIC_ONLY = 1, 2


def read_prefixes(lines: list[str]) -> dict[str, int]:
    """Non-breaking prefixes (the lines of a Moses prefix file) as the package reads them:
    `#NUMERIC_ONLY#` marks a prefix that does not break only before a number; `#` starts a comment."""
    prefixes: dict[str, int] = {}
    for line in lines:
        kind = NUMERIC_ONLY if "#NUMERIC_ONLY#" in line else DEFAULT
        word = _COMMENT.sub("", line).strip()
        if word:
            prefixes[word] = kind
    return prefixes


class MosesSplitter:
    """`split(text)`: the sentences of one line of text, as sentence-splitter's SentenceSplitter
    with the same prefixes returns them."""

    def __init__(self, prefixes: dict[str, int]):
        self.prefixes = prefixes

    @classmethod
    def from_file(cls, path: Path) -> MosesSplitter:
        return cls(read_prefixes(path.read_text(encoding="utf-8").splitlines()))

    def split(self, text: str) -> list[str]:
        if not text:
            return []
        for pattern in _BREAKS:
            text = pattern.sub("\\1\n\\2", text)
        if "." not in text:  # no period to look at: the words as they were, single-spaced
            return _SPACES.sub(" ", text).replace("\n ", "\n").replace(" \n", "\n").strip().split("\n")
        words = _SPACES.split(text)
        seen: dict[tuple[str, str], bool] = {}  # a text repeating itself costs one look per pair
        for i in range(len(words) - 1):
            if "." in words[i]:
                pair = (words[i], words[i + 1])
                breaks = seen.get(pair)
                if breaks is None:
                    breaks = seen[pair] = self._breaks_after(*pair)
                if breaks:
                    words[i] += "\n"
        text = " ".join(words)
        text = _SPACES.sub(" ", text).replace("\n ", "\n").replace(" \n", "\n").strip()
        return text.split("\n")

    def _breaks_after(self, word: str, after: str) -> bool:
        """Whether a sentence ends after `word` (which has a period), `after` the next word."""
        match = _PERIOD_END.search(word)
        if not match:
            return False
        prefix, punct = match.group(1), match.group(2)
        kind = self.prefixes.get(prefix) if prefix else None
        if kind == DEFAULT and not punct:
            return False  # an abbreviation
        if _ACRONYM.search(word) or not _NEXT_STARTS.search(after):
            return False
        return not (kind == NUMERIC_ONLY and not punct and _NUMBER_START.search(after))
