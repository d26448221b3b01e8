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
