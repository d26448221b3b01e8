"""Glossary terms and do-not-translate phrases matched on source words (service.engine.terms)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.engine.terms import MAX_TERM_WORDS, Term, TermError, TermIndex, check_term, read_tsv


def found(index: TermIndex, text: str) -> list[tuple[str, str]]:
    return [(m.text, m.target) for m in index.find(text)]


def test_terms_match_whole_words_whatever_their_case():
    index = TermIndex([Term("ACME Cloud", "ACME Cloud"), Term("Hund", "hound")])
    assert found(index, "Die acme cloud und der HUND.") == [("acme cloud", "ACME Cloud"), ("HUND", "hound")]
    assert found(index, "acmecloud, ACME Clouds, Hunde, Schäferhund") == []


def test_a_case_sensitive_term_matches_its_own_case_only():
    index = TermIndex([Term("Apple", "Apple Inc.", case_sensitive=True)])
    assert found(index, "Apple und apple") == [("Apple", "Apple Inc.")]


def test_forms_match_as_the_phrase_does():
    index = TermIndex([Term("Hund", "hound", forms=("Hunde", "Hundes", "Hunden"))])
    assert [m.text for m in index.find("Ein Hund, zwei Hunde, des Hundes, den Hunden.")] == [
        "Hund",
        "Hunde",
        "Hundes",
        "Hunden",
    ]


def test_the_longest_match_wins_then_the_earliest():
    index = TermIndex([Term("roter Hund", "red hound"), Term("Hund", "dog"), Term("Hund rennt schnell", "x")])
    assert found(index, "Ein roter Hund.") == [("roter Hund", "red hound")]
    # "Hund rennt schnell" (3 words) beats "roter Hund" (2), which overlaps it
    assert found(index, "Ein roter Hund rennt schnell.") == [("Hund rennt schnell", "x")]
    overlap = TermIndex([Term("a b", "1"), Term("b c", "2")])
    assert found(overlap, "a b c") == [("a b", "1")]  # equal length: the earliest


def test_a_do_not_translate_phrase_keeps_the_text_as_matched():
    index = TermIndex([Term("Firefox Nightly", "")])
    (m,) = index.find("Installiere firefox  nightly heute.")
    assert m.term.verbatim and m.target == "firefox  nightly" and (m.start, m.end) == (12, 28)


def test_spans_are_code_points():
    index = TermIndex([Term("Größe", "size")])
    (m,) = index.find("🐕 Die Größe zählt.")
    assert "🐕 Die Größe zählt."[m.start : m.end] == "Größe"


def test_terms_over_the_limits_or_without_words_are_refused_naming_the_field():
    with pytest.raises(TermError, match=r"glossary\[3\]\.source: has no word"):
        check_term("...", "x", where="glossary[3]")
    with pytest.raises(TermError, match=r"glossary\[0\]\.target: 300 characters, at most 256"):
        check_term("a", "x" * 300, where="glossary[0]")
    with pytest.raises(TermError, match=rf"forms\[1\]: {MAX_TERM_WORDS + 1} words"):
        check_term("a", "b", ["c", " ".join(["w"] * (MAX_TERM_WORDS + 1))])


def test_named_glossaries_are_read_from_tsv():
    terms = read_tsv("# product names\nACME Cloud\tACME Cloud\n\nHund\thound\tHunde|Hundes\n", "g.tsv")
    assert terms == [Term("ACME Cloud", "ACME Cloud"), Term("Hund", "hound", ("Hunde", "Hundes"))]
    with pytest.raises(TermError, match=r"g.tsv:2: 1 columns"):
        read_tsv("a\tb\nonly one\n", "g.tsv")
    with pytest.raises(TermError, match=r"g.tsv:1: the target is empty"):
        read_tsv("a\t \n", "g.tsv")


def test_matching_is_linear_in_the_text():
    index = TermIndex([Term(" ".join(["x"] * MAX_TERM_WORDS), "y"), Term("x x x", "z")])
    text = "x " * 50_000  # every word starts a candidate of 16 words
    t = time.perf_counter()
    n = len(index.find(text))
    assert n == 50_000 // MAX_TERM_WORDS
    assert time.perf_counter() - t < 10  # quadratic would be hours; linear is well under a second idle


@given(st.lists(st.sampled_from(["Hund", "Katze", "roter", "Ball", "und", "x"]), max_size=30))
def test_matches_never_overlap_and_each_is_a_term(ws):
    index = TermIndex([Term("roter Ball", "red ball"), Term("Ball", "ball"), Term("Hund und Katze", "pets")])
    text = " ".join(ws)
    ms = index.find(text)
    assert all(a.end <= b.start for a, b in zip(ms, ms[1:]))
    assert all(m.text.casefold() in {"roter ball", "ball", "hund und katze"} for m in ms)
