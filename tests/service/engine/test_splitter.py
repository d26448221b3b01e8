"""service.engine.splitter: the same sentences as the sentence-splitter package on every case and
on texts made to hit each of its rules, and splitting in linear time."""

from __future__ import annotations

import gzip
import json
import random
import time
from pathlib import Path

import pytest
from sentence_splitter import SentenceSplitter

from service.engine import documents
from service.engine.splitter import MosesSplitter

CASES = json.loads((Path(__file__).parent / "data" / "splitter_cases.json").read_text(encoding="utf-8"))
WORDS = [
    "Ja.", "Nein!", "Was?", "Dr.", "z.", "B.", "Nr.", "3.", "10", "U.S.A.", "etc.", "„Hallo.“", "(so).", "Er",
    "der", "Mann", "...", "Ende…", "'Gut.'", "«Non»", "¿Qué?", "Art.", "5", "Mr.", "p.", "a", "«", "A.B.", "-",
    "No.", "Str.", "\"Oh!\"", "x", "Der", "La", "Une", "femme", "The", "man", "1.", "II.", "é.", "ÄÖ.",
]  # fmt: skip


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 30))) + rng.choice(["", " ", "  x"]) for _ in range(n)
    ]


@pytest.mark.parametrize("lang", ["de", "fr", "en"])
def test_the_linear_splitter_splits_as_the_package(lang):
    package = SentenceSplitter(language=lang)
    ours = MosesSplitter.from_file(
        Path(__import__("sentence_splitter").__file__).parent / "non_breaking_prefixes" / f"{lang}.txt"
    )
    texts = [" ".join(c["sentences"]) for c in CASES] + _texts(hash(lang) % 1000, 3000)
    texts += [t.replace(" ", "  ", 3) for t in texts[:200]]
    for text in texts:
        assert ours.split(text) == package.split(text), text


def test_corpus_lines_split_as_before(data_dir):
    """400 multi30k lines joined: the spans are in order, stripped, and cover every word once."""
    lines = gzip.open(data_dir / "val.de.gz", "rt", encoding="utf-8").read().splitlines()[:400]
    text = " ".join(lines)
    spans = documents.sentence_spans(text, "de")
    assert spans == sorted(spans) and all(text[a:b].strip() == text[a:b] for a, b in spans)
    joined = " ".join(text[a:b] for a, b in spans)
    assert joined.split() == text.split()


def _best(fn, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


@pytest.mark.parametrize(
    "text",
    [("x Der " * 16667)[:100000], "Ja. " * 25000, ("Ein Mann geht mit seinem Hund spazieren. " * 2500)[:100000]],
    ids=["openers", "short-sentences", "prose"],
)
def test_splitting_is_linear(text):
    """100 kB split in well under a second (the openers took 4 s), and in about the time of ten
    texts of 10 kB split one after the other (quadratic splitting takes ten times as long)."""
    tenth = text[: len(text) // 10]

    def split(t: str) -> None:
        documents.segment_spans(t, documents.SPLIT_SENTENCES, "de")

    split(tenth)
    whole = _best(lambda: split(text))
    parts = _best(lambda: [split(tenth) for _ in range(10)])
    assert whole < 1.0, f"{whole:.3f} s for 100 kB"
    assert whole < 4 * parts, f"{whole:.3f} s for 100 kB, {parts:.3f} s for ten times 10 kB"
