"""The one normalisation every source text gets before it is validated and tokenised, on every API
(docs/security.md, "Texts with nothing to translate").

1. Control (Unicode category Cc) and format (Cf) characters are removed, except the ordinary
   whitespace controls: tab, line feed, vertical tab, form feed and carriage return. NUL, escape,
   C1 controls (NEL included), zero-width spaces and joiners, bidi marks, the BOM, soft hyphens
   and tag characters go; the model never saw them in training, and a text made of them alone
   used to come back as a made-up sentence.
2. The rest is put in NFC (canonical composition), so that the same text typed two ways tokenises
   the same.
3. Leading and trailing whitespace (any Unicode whitespace, Zs included) is dropped.

A text with nothing left is refused with INVALID_ARGUMENT naming it (`texts[i]`, `text`, or the
KServe element `inputs[0][i]`). Other characters (combining marks, private use, unassigned code
points, emoji) are kept: byte-level BPE maps every one of them to known tokens.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Sequence

# The control characters that are ordinary whitespace, kept: \t \n \v \f \r.
KEPT_CONTROLS = frozenset("\t\n\x0b\x0c\r")
_ASCII_REMOVED = re.compile("[\x00-\x08\x0e-\x1f\x7f]")


@functools.cache
def _removed() -> re.Pattern[str]:
    """One character class of every Cc and Cf code point but KEPT_CONTROLS, in ranges. Built on
    the first text that is not ASCII (a scan of all code points, about 0.15 s), from the Unicode
    tables of this Python, so it follows them."""
    ranges: list[tuple[int, int]] = []
    for c in range(sys.maxunicode + 1):
        ch = chr(c)
        if unicodedata.category(ch) in ("Cc", "Cf") and ch not in KEPT_CONTROLS:
            if ranges and ranges[-1][1] == c - 1:
                ranges[-1] = (ranges[-1][0], c)
            else:
                ranges.append((c, c))
    body = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}" for a, b in ranges)
    return re.compile(f"[{body}]")


def normalize_text(text: str) -> str:
    """`text` as the model sees it: controls and format characters removed, NFC, stripped. An
    empty result means the text has nothing to translate."""
    if text.isascii():  # the common case: no format characters, already NFC
        return _ASCII_REMOVED.sub("", text).strip()
    return unicodedata.normalize("NFC", _removed().sub("", text)).strip()


def utf8_bytes(text: str) -> int:
    """UTF-8 bytes of `text` (lone surrogates as 3 bytes each), as a size limit counts them."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def normalize_with_offsets(text: str) -> tuple[str, Sequence[int], Sequence[int]]:
    """`normalize_text(text)` and, for each of its characters, the span [start, end) of `text` it
    comes from (code points): a character that NFC composed from several stands for all of them.
    A text that normalisation leaves as it is but for whitespace at the ends (the usual case) maps
    one to one: the spans are ranges."""
    removed = _ASCII_REMOVED if text.isascii() else _removed()
    if removed.search(text) is None and (text.isascii() or unicodedata.is_normalized("NFC", text)):
        lead = len(text) - len(text.lstrip())
        stop = len(text.rstrip())
        if stop <= lead:
            return "", [], []
        return text[lead:stop], range(lead, stop), range(lead + 1, stop + 1)
    kept: list[str] = []
    where: list[int] = []  # each kept character's index in `text`
    at = 0
    for m in [*removed.finditer(text), None]:
        stop = len(text) if m is None else m.start()
        kept.append(text[at:stop])
        where.extend(range(at, stop))
        if m is not None:
            at = m.end()
    body = "".join(kept)
    if text.isascii() or unicodedata.is_normalized("NFC", body):
        out, starts, ends = body, where, [i + 1 for i in where]
    else:
        out, starts, ends = _composed(body, where)
    lead = len(out) - len(out.lstrip())
    stop = len(out.rstrip())
    if stop <= lead:
        return "", [], []
    return out[lead:stop], starts[lead:stop], ends[lead:stop]


def _composed(body: str, where: list[int]) -> tuple[str, list[int], list[int]]:
    """NFC of `body` with each output character's source span: `body` in runs that compose on
    their own (a starter and the characters that follow it, merged with the run before where
    NFC joins them, as Hangul jamo), a run's characters mapped one to one where NFC kept its
    length, else each to the whole run."""
    runs: list[tuple[int, int]] = []  # [start, end) in body
    for i, ch in enumerate(body):
        if runs and unicodedata.combining(ch):
            runs[-1] = (runs[-1][0], i + 1)
            continue
        if runs:
            a, b = runs[-1]
            both = unicodedata.normalize("NFC", body[a : i + 1])
            if both != unicodedata.normalize("NFC", body[a:b]) + unicodedata.normalize("NFC", ch):
                runs[-1] = (a, i + 1)
                continue
        runs.append((i, i + 1))
    out: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for a, b in runs:
        composed = unicodedata.normalize("NFC", body[a:b])
        out.append(composed)
        if len(composed) == b - a:
            starts += where[a:b]
            ends += [i + 1 for i in where[a:b]]
        else:
            starts += [where[a]] * len(composed)
            ends += [where[b - 1] + 1] * len(composed)
    text = "".join(out)
    if text != unicodedata.normalize("NFC", body):  # composition across runs the merge missed
        whole = unicodedata.normalize("NFC", body)
        return whole, [where[0]] * len(whole), [where[-1] + 1] * len(whole)
    return text, starts, ends
