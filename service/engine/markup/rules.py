"""Which elements end a segment, which have no content, which are kept as sent: the HTML lists,
and for XML the rule that an element inside text (mixed content) is inline."""

from __future__ import annotations

from dataclasses import dataclass

from service.engine.markup.tokens import END, START, TEXT, Token

# Elements without content (HTML: no end tag).
VOID = frozenset(
    "area base basefont bgsound br col embed frame hr img input keygen link meta param source track wbr".split()
)
# Block (flow) elements: each start and end tag ends a segment.
BLOCK = frozenset(
    (
        "address article aside blockquote body br canvas caption center col colgroup dd details dialog dir div dl dt "
        "fieldset figcaption figure footer form frame frameset h1 h2 h3 h4 h5 h6 head header hgroup hr html iframe "
        "legend li main menu nav noscript ol optgroup option p pre section select summary table tbody td tfoot th "
        "thead title tr ul video audio"
    ).split()
)
# Elements kept as sent, content included; those of INVISIBLE show no text (inside a sentence they
# travel like a void element, never in the text to translate).
PROTECTED = frozenset("script style template textarea code pre kbd samp svg math".split())
INVISIBLE = frozenset("script style template".split())
# HTML's optional end tags: a start tag of the key's name first ends an open element of these
# names (the nearest, unless a block element other than these lies between).
_P_CLOSERS = frozenset(
    (
        "address article aside blockquote center details dialog dir div dl fieldset figcaption figure footer form "
        "h1 h2 h3 h4 h5 h6 header hgroup hr main menu nav ol p pre section summary table ul li dd dt"
    ).split()
)
_SECTIONS = {"tbody", "thead", "tfoot", "tr", "td", "th"}
CLOSES: dict[str, frozenset[str]] = {
    "li": frozenset({"li"}),
    "dt": frozenset({"dt", "dd"}),
    "dd": frozenset({"dt", "dd"}),
    "option": frozenset({"option"}),
    "optgroup": frozenset({"option", "optgroup"}),
    "tr": frozenset({"tr", "td", "th"}),
    "td": frozenset({"td", "th"}),
    "th": frozenset({"td", "th"}),
    "tbody": frozenset(_SECTIONS),
    "thead": frozenset(_SECTIONS),
    "tfoot": frozenset(_SECTIONS),
}
OPTIONAL_END = frozenset("p li dt dd option optgroup tr td th tbody thead tfoot colgroup caption rb rt rp rtc".split())
_WHITESPACE = " \t\n\r\f"
# Elements open at once at most: deeper markup is refused (the projection recurses per level).
MAX_DEPTH = 200


def closed_by(name: str) -> frozenset[str]:
    """The names of open elements that a start tag `name` ends (HTML's implied end tags)."""
    closes = CLOSES.get(name, frozenset())
    return closes | {"p"} if name in _P_CLOSERS else closes


@dataclass(frozen=True, eq=False)
class Element:
    """An open element: its start token and what the rules make of it (equal only to itself)."""

    id: int
    name: str
    token: Token
    block: bool
    void: bool
    protected: bool
    invisible: bool


def _no_translate(token: Token) -> bool:
    for name, value in token.attributes:
        local = name.rpartition(":")[2].lower()
        if local == "translate" and value.strip().lower() == "no":
            return True
        if local == "class" and "notranslate" in value.split():
            return True
    return False


def html_element(index: int, token: Token) -> Element:
    name = token.name
    protected = name in PROTECTED or _no_translate(token)
    return Element(index, name, token, name in BLOCK, name in VOID, protected, name in INVISIBLE)


def xml_inline(tokens: list[Token]) -> set[int]:
    """The indices of the start tokens of inline XML elements: those inside an inline element, and
    those whose parent has text of its own (mixed content): words, or spaces on one line (a line
    break with spaces is indentation). A fragment's top level is the parent of its elements."""
    parents: dict[int, int] = {}
    mixed: set[int] = set()
    stack = [-1]
    run: list[str] = []  # the text since the last tag (expat cuts it at line breaks)
    for index, token in enumerate([*tokens, Token(END, 0, 0)]):
        if token.kind == TEXT:
            run.append(token.data)
            continue
        text, run = "".join(run), []
        if text and (text.strip(_WHITESPACE) or "\n" not in text):
            mixed.add(stack[-1])
        if token.kind == START:
            parents[index] = stack[-1]
            if not token.empty:
                stack.append(index)
        elif token.kind == END and len(stack) > 1:
            stack.pop()
    inline: set[int] = set()
    for index in sorted(parents):
        if parents[index] in mixed or parents[index] in inline:
            inline.add(index)
    return inline


def xml_element(index: int, token: Token, inline: set[int]) -> Element:
    return Element(index, token.name, token, index not in inline, token.empty, _no_translate(token), False)
