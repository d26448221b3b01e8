"""The language pairs a model serves, and what a request's pair adds to its sentences: the source
language token a multilingual model puts first on the source, and the target language token it is
forced to generate first (`contract.manifest.LanguageSpec`). No gRPC here."""

from __future__ import annotations

from dataclasses import dataclass

from contract.manifest import LanguageSpec
from service.errors import InvalidArgument, quote

# Pairs named in a status message (NOT_FOUND for a pair no model serves) before "... N in all".
LISTED_PAIRS = 20
# A language code as a message shows it: longer ones (client input) are quoted and cut.
SHOWN_CODE_CHARS = 16
# UTF-8 bytes of a list of a model's languages in a status message before it is cut with "…".
LISTED_LANGUAGE_BYTES = 400


@dataclass(frozen=True)
class LanguagePair:
    """A request's source_language and target_language; empty: not given."""

    source: str = ""
    target: str = ""
    encoding: bool = False  # the pair of a call that has no target language (Encode)

    def __bool__(self) -> bool:
        return bool(self.source or self.target)

    def __str__(self) -> str:
        return f"{_shown(self.source)}->{_shown(self.target)}"


def _shown(code: str) -> str:
    """A request's language code in a message: '*' when empty; cut and quoted when long or odd."""
    if not code:
        return "*"
    if len(code) <= SHOWN_CODE_CHARS and code.isascii() and code.isprintable():
        return code
    return quote(code, SHOWN_CODE_CHARS)


@dataclass(frozen=True)
class Prefixes:
    """What a pair adds to a sentence: ids before the source text, ids forced first on the target."""

    source: tuple[int, ...] = ()
    target: tuple[int, ...] = ()


class ModelLanguages:
    """The languages of one model version: the pairs it serves and the tokens that select them."""

    def __init__(self, spec: LanguageSpec):
        self.spec = spec
        self.multilingual = bool(spec.target_tokens)
        src, tgt = spec.source, spec.target
        self._pairs = [(s, t) for s in src for t in tgt if s != t or len(src) == len(tgt) == 1]

    @property
    def pairs(self) -> list[tuple[str, str]]:
        """Every (source, target) pair, sources in the model's order, then targets; a
        multilingual model does not translate a language into itself."""
        return self._pairs

    @property
    def has_default_pair(self) -> bool:
        """Whether a request may leave the languages empty: a model without language tokens has
        one pair (or translates whatever it reads); one with them needs the request's languages."""
        return not (self.spec.source_tokens or self.spec.target_tokens)

    def describe(self) -> str:
        """What the model serves, for a status message: a multilingual model's languages
        ("8 languages to 8: cs, de, en, ..."), sorted and cut at LISTED_LANGUAGE_BYTES; else its
        pairs ("de->en")."""
        src, tgt = self.spec.source, self.spec.target
        if not self.multilingual:
            return describe_pairs(self.pairs)
        if set(src) == set(tgt):
            return f"{len(src)} languages to {len(tgt)}: {list_languages(src)}"
        return f"{len(src)} languages to {len(tgt)}: from {list_languages(src)}; into {list_languages(tgt)}"

    def why_not(self, pair: LanguagePair) -> str:
        """Why the model does not serve `pair` (`serves(pair)` is false), in a few words."""
        spec = self.spec
        if pair.source and pair.source not in spec.source:
            return f"{_shown(pair.source)} is not one of its source languages"
        if pair.target and pair.target not in spec.target:
            return f"{_shown(pair.target)} is not one of its target languages"
        return "it does not translate a language into itself"

    def serves(self, pair: LanguagePair) -> bool:
        """Whether the model translates `pair` (a side left empty matches any language)."""
        spec = self.spec
        if pair.source and pair.source not in spec.source:
            return False
        if pair.target and pair.target not in spec.target:
            return False
        return not (self.multilingual and pair.source and pair.source == pair.target)

    def prefixes(self, pair: LanguagePair, prefix: str = "", need_target: bool = True) -> Prefixes:
        """The language tokens of `pair` for this model (`serves(pair)` holds); InvalidArgument
        naming the field (`prefix` + source_language / target_language) that a multilingual
        model needs and the request left empty. `need_target=False`: the source side only (Encode)."""
        spec = self.spec
        source: tuple[int, ...] = ()
        target: tuple[int, ...] = ()
        if spec.source_tokens:
            if not pair.source:
                langs = list_languages(spec.source)
                raise InvalidArgument(f"{prefix}source_language", f"this model needs the source language ({langs})")
            source = (spec.source_tokens[pair.source],)
        if spec.target_tokens and need_target:
            if not pair.target:
                langs = list_languages(spec.target)
                raise InvalidArgument(
                    f"{prefix}target_language", f"this model is multilingual: name the target language ({langs})"
                )
            target = (spec.target_tokens[pair.target],)
        return Prefixes(source, target)


def list_languages(codes: list[str], limit: int = LISTED_LANGUAGE_BYTES) -> str:
    """`codes` sorted, "af, am, ar", cut with ", …" before the list passes `limit` UTF-8 bytes."""
    shown: list[str] = []
    size = 0
    for code in sorted(codes):
        size += len(code.encode("utf-8")) + (2 if shown else 0)
        if size > limit:
            return ", ".join(shown) + ", …"
        shown.append(code)
    return ", ".join(shown)


def describe_pairs(pairs: list[tuple[str, str]], listed: int = LISTED_PAIRS) -> str:
    """Up to `listed` pairs "de->en, fr->en", then how many there are in all."""
    shown = ", ".join(f"{s}->{t}" for s, t in pairs[:listed])
    return shown if len(pairs) <= listed else f"{shown}, ... ({len(pairs)} in all)"


DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
MAX_PAGE_TOKEN_DIGITS = 18  # a page token is an offset into a model's pairs: an int64 at most


def pair_page(pairs: list[tuple[str, str]], page_size: int, page_token: str) -> tuple[list[tuple[str, str]], str]:
    """One page of a model's pairs (GetModelInfoRequest's page_size, 0 = DEFAULT_PAGE_SIZE, and
    page_token, the offset an earlier page ended at) and the next page's token ("" at the end)."""
    if not 0 <= page_size <= MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"{page_size} is outside 0..{MAX_PAGE_SIZE} (0 = {DEFAULT_PAGE_SIZE})")
    size = page_size or DEFAULT_PAGE_SIZE
    if page_token and not (page_token.isascii() and page_token.isdigit()):
        raise InvalidArgument("page_token", "not a token from ServedModel.next_page_token")
    if len(page_token) > MAX_PAGE_TOKEN_DIGITS:  # checked before int(): its work grows with the digits
        raise InvalidArgument(
            "page_token",
            f"{len(page_token)} digits, more than {MAX_PAGE_TOKEN_DIGITS}: not a token from next_page_token",
        )
    start = int(page_token or 0)
    page = pairs[start : start + size]
    return page, str(start + size) if start + size < len(pairs) else ""
