"""service.repository.routing's detection without a server: per text and per segment (undecided
segments take a neighbour's language, the text's language is the one of most characters), and
the candidates (one language spelled two ways is one candidate; two scripts stay apart)."""

from __future__ import annotations

import pytest

from service.repository.detection import Found, detect_texts
from service.repository.routing import _labels, _merge
from service.runtime.language_id import LanguageDetector, Undecided

DE = "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
FR = "Un homme en tenue claire photographie un groupe d'hommes portant des costumes sombres et des chapeaux."
CANDIDATES = ["de", "fr", "en"]


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector.shared()


def test_each_text_gets_its_language_or_is_undecided(detector):
    de, fr, digits = detect_texts(detector, [DE, FR, "12 345 !!"], CANDIDATES, 0.9)
    assert isinstance(de, Found) and de.language == "de" and de.confidence > 0.99
    assert de.groups[0].start == 0 and de.groups[0].end == len(DE) and not de.segments
    assert isinstance(fr, Found) and fr.language == "fr"
    assert isinstance(digits, Undecided) and {c for c, _ in digits.candidates} == set(CANDIDATES)
    assert digits.error("request.", "texts[2]").message.startswith(
        'request.source_language: texts[2]: "auto": no language reached the detection threshold 0.9 (best: '
    )


def test_segments_are_detected_and_grouped_in_runs(detector):
    text = f"  {DE} {DE}\n{FR} Ja.  "
    (found,) = detect_texts(detector, [text], CANDIDATES, 0.9, "sentences")
    assert isinstance(found, Found)
    langs = [(text[s.start : s.end], s.language, s.decided) for s in found.segments]
    assert langs == [(DE, "de", True), (DE, "de", True), (FR, "fr", True), ("Ja.", "fr", False)]
    # Consecutive segments of one language are one group, spanning the whitespace between them.
    assert [(text[g.start : g.end], g.language) for g in found.groups] == [(f"{DE} {DE}", "de"), (f"{FR} Ja.", "fr")]
    # The text's language: most characters (two German sentences are longer than the French one).
    assert found.language == "de" and found.confidence > 0.99
    # The undecided segment reports its own (low) probability of the language it took.
    assert found.segments[-1].confidence < 0.9


def test_a_text_of_one_language_is_one_group_as_sent(detector):
    text = f"{DE} Ja. {DE}"
    (found,) = detect_texts(detector, [text], CANDIDATES, 0.9, "sentences")
    assert isinstance(found, Found) and found.groups[0].start == 0 and found.groups[0].end == len(text)
    assert [s.decided for s in found.segments] == [True, False, True]


def test_a_text_no_segment_of_which_is_decided(detector):
    (undecided,) = detect_texts(detector, ["Ja. 12."], CANDIDATES, 0.9, "sentences")
    assert isinstance(undecided, Undecided)


def test_one_language_spelled_two_ways_is_one_candidate(detector):
    codes = ["de", "fr", "deu_Latn", "zho_Hans", "zho_Hant", "acm_Arab"]
    merged = _merge(codes, _labels(detector, codes))
    assert merged.spellings == {
        "de": ("de", "deu_Latn"),
        "fr": ("fr",),
        "zho_Hans": ("zho_Hans",),
        "zho_Hant": ("zho_Hant",),
    }
    (found,) = detect_texts(detector, [DE], merged.codes, 0.9)
    assert isinstance(found, Found) and found.language == "de" and found.confidence > 0.99
