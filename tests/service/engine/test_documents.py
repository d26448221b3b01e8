"""service.engine.documents without a server: the splitter on the hand-made cases, the segments'
spans, the reassembly of a text around them and the cut of an over-long sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.engine import documents
from service.engine.documents import SPLIT_NEWLINES, SPLIT_NONE, SPLIT_SENTENCES

CASES = json.loads((Path(__file__).parent / "data" / "splitter_cases.json").read_text(encoding="utf-8"))


def test_the_case_set_covers_german_french_and_english():
    assert len(CASES) >= 60
    assert {c["lang"] for c in CASES} == {"de", "fr", "en"}
    assert all(sum(c["lang"] == lang for c in CASES) >= 20 for lang in ("de", "fr", "en"))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['lang']}-{i}" for i, c in enumerate(CASES)])
def test_each_case_splits_exactly(case):
    text = " ".join(case["sentences"])
    assert [text[a:b] for a, b in documents.sentence_spans(text, case["lang"])] == case["sentences"]


@pytest.mark.parametrize(
    "code, lang",
    [
        ("de", "de"),
        ("deu_Latn", "de"),
        ("fra_Latn", "fr"),
        ("__fr__", "fr"),
        ("en-GB", "en"),
        ("xx", "en"),
        ("jpn_Jpan", "en"),
    ],
)
def test_language_codes_map_to_the_splitter_or_to_english(code, lang):
    assert documents.splitter_language(code) == lang


TEXT = "  Dr. Müller kommt.  Er bringt Kuchen mit!\nZwei Zeilen.\n\n\tEin neuer Absatz, z. B. dieser. Ende.\r\n  "


def test_spans_cover_each_sentence_and_nothing_between():
    spans = documents.segment_spans(TEXT, SPLIT_SENTENCES, "de")
    assert [TEXT[a:b] for a, b in spans] == [
        "Dr. Müller kommt.",
        "Er bringt Kuchen mit!",
        "Zwei Zeilen.",
        "Ein neuer Absatz, z. B. dieser.",
        "Ende.",
    ]
    assert [TEXT[a:b] for a, b in documents.segment_spans(TEXT, SPLIT_NEWLINES, "de")] == [
        "Dr. Müller kommt.  Er bringt Kuchen mit!",
        "Zwei Zeilen.",
        "Ein neuer Absatz, z. B. dieser. Ende.",
    ]
    assert [TEXT[a:b] for a, b in documents.segment_spans(TEXT, SPLIT_NONE, "de")] == [TEXT.strip()]
    assert documents.segment_spans(" \n\t ", SPLIT_SENTENCES, "de") == []


def test_join_keeps_everything_between_segments():
    spans = documents.segment_spans(TEXT, SPLIT_SENTENCES, "de")
    out = documents.join(TEXT, spans, ["A.", "B!", "C.", "D.", "E."])
    assert out == "  A.  B!\nC.\n\n\tD. E.\r\n  "
    assert documents.join(TEXT, spans, [TEXT[a:b] for a, b in spans]) == TEXT


def test_split_ids_cuts_at_the_last_break_within_the_limit():
    ids = list(range(10))
    breaks = [i in (3, 6) for i in range(10)]
    assert documents.split_ids(ids, 4, breaks) == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    assert documents.split_ids(ids, 4, [False] * 10) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert documents.split_ids(ids, 10, breaks) == [ids]
