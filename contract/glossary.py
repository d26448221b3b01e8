"""The glossary file format: what a model version ships as `glossaries/ID.tsv` and what
`mtserve translate --glossary FILE` reads.

One term a line: `source<TAB>target`, and optionally a third column of the source's other surface
forms (its inflections) separated by `|`. Blank lines and lines starting with `#` are skipped.
UTF-8. Leading and trailing spaces of a column are not part of it.
"""

from __future__ import annotations

GLOSSARY_DIR = "glossaries"  # in a model version's folder
GLOSSARY_SUFFIX = ".tsv"


class GlossaryFormatError(ValueError):
    """A line that is not a term; the message names `where` and the line."""


def parse_tsv(text: str, where: str) -> list[tuple[int, str, str, tuple[str, ...]]]:
    """(line number, source, target, forms) of each term line of a glossary file's `text`."""
    terms = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        cols = line.split("\t")
        if len(cols) not in (2, 3):
            raise GlossaryFormatError(f"{where}:{no}: {len(cols)} columns, want source<TAB>target[<TAB>forms]")
        source, target = cols[0].strip(), cols[1].strip()
        forms = tuple(f.strip() for f in cols[2].split("|") if f.strip()) if len(cols) == 3 else ()
        if not source:
            raise GlossaryFormatError(f"{where}:{no}: the source is empty")
        if not target:
            raise GlossaryFormatError(f"{where}:{no}: the target is empty")
        terms.append((no, source, target, forms))
    return terms
