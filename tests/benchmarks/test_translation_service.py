"""benchmarks/translation_service.py: its data sets (the HTML builder, the placement file, the
glossary sentences, the mixed-language texts) and its scoring of hand-written outputs; and the
detection part's server-free piece, service.runtime.language_id on the German and French sentences
the part sends. No timings."""

from __future__ import annotations

import types

import pytest

from benchmarks.translation_service import (
    KINDS,
    MIN_CHARS,
    TERMS,
    UNRELATED,
    GlossaryCase,
    HtmlCase,
    PlacementCase,
    build_html_cases,
    collapse,
    corpus,
    detection_sentences,
    glossary_candidates,
    interleaved,
    mixed_texts,
    no_translate_spans,
    occurrences,
    read_placement,
    score_glossary,
    score_html,
    score_placement,
    tag_multiset,
    text_content,
    unmatched,
    unrelated_glossary,
    usable,
    word_index,
)


@pytest.fixture(scope="module")
def german(data_dir):
    return corpus(data_dir, "de")


@pytest.fixture(scope="module")
def french(data_dir):
    return corpus(data_dir, "fr")


def test_the_tag_multiset_counts_tags_with_their_attributes_as_html5lib_parses_them():
    source = 'Ein <b>roter <i>Ball</i></b> liegt<br> im <a href="/x" title="t">Gras</a>.'
    assert tag_multiset(source) == {
        ("b", ()): 1,
        ("i", ()): 1,
        ("br", ()): 1,
        ("a", (("href", "/x"), ("title", "t"))): 1,
    }
    # Order, attribute order, quoting and text do not matter; a tag's count, name and attributes do.
    assert tag_multiset('A <a title="t" href="/x">grass</a> <b><i>red</i> ball</b><br>.') == tag_multiset(source)
    assert tag_multiset('A <b>red <i>ball</i></b> <a href="/y" title="t">grass</a><br>.') != tag_multiset(source)
    assert tag_multiset('A <b>red</b> <b>ball</b> <a href="/x" title="t">grass</a><br>.') != tag_multiset(source)
    assert tag_multiset("A <b>red ball<br> <i>x") == {("b", ()): 1, ("br", ()): 1, ("i", ()): 1}  # repaired
    assert tag_multiset("no <!-- comment --> tags") == {}


def test_text_content_drops_tags_and_comments_and_decodes_entities():
    assert (
        text_content('Ein <b>roter</b>  Ball<br> &amp; <img src="a.png" alt="x"> <!-- c -->Gras.')
        == "Ein roter Ball & Gras."
    )
    assert collapse(" a \n b  ") == "a b"


def test_the_html_set_is_seeded_and_keeps_each_sentence_as_its_text(german):
    cases = build_html_cases(german, 300, seed=0)
    assert len(cases) == 300
    assert cases == build_html_cases(german, 300, seed=0)
    assert [c.markup for c in cases] != [c.markup for c in build_html_cases(german, 300, seed=1)]
    for case in cases:
        assert text_content(case.markup) == collapse(case.text), case.markup
        assert tag_multiset(case.markup), case.markup  # at least one tag
    markups = [c.markup for c in cases]
    for wanted in ("<b>", "<i>", "<span class=", "<a href=", "<br>", "<img ", '<span translate="no">'):
        assert any(wanted in m for m in markups), wanted
    assert {k for c in cases for k in c.kinds} == {k for kind in KINDS for k in kind.split("+")}
    nested = [c for c in cases if "nested" in c.kinds]
    # A nested case's inner tag sits inside its outer one.
    assert all(len(tag_multiset(c.markup)) >= 2 for c in nested)
    assert sum(len(no_translate_spans(c.markup)) for c in cases) >= 90
    # Text that would be markup is escaped.
    (case,) = build_html_cases(["Tom & Jerry <3 spielen im Garten."], 1)
    assert text_content(case.markup) == "Tom & Jerry <3 spielen im Garten." and "&amp;" in case.markup


def test_html_outputs_are_scored_on_tags_text_and_kept_spans():
    case = HtmlCase(
        text="Ein roter Ball liegt im Gras.",
        markup='Ein <b>roter</b> Ball liegt <br>im <span translate="no">Gras</span>.',
        kinds=["void", "no_translate"],
    )
    plain = "A red ball is lying in the grass."
    good = score_html(case, 'A <b>red</b> ball is lying <br>in the <span translate="no">Gras</span>.', plain)
    assert (good.tags_preserved, good.text_as_plain, good.no_translate_kept, good.no_translate_spans) == (
        True,
        False,  # "Gras" is not the plain translation's "grass"
        1,
        1,
    )
    lost = score_html(case, "A red ball is lying <br>in the grass.", "A red ball is lying in the grass.")
    assert (lost.tags_preserved, lost.text_as_plain, lost.no_translate_kept) == (False, True, 0)
    changed = score_html(case, 'A <b>red</b> ball <br>is lying in the <span translate="no">gras</span>.', plain)
    assert changed.tags_preserved and changed.no_translate_kept == 0


def test_the_placement_file_parses_with_both_languages_and_an_expectation_per_tag():
    cases = read_placement()
    assert len(cases) >= 100
    by_lang = {lang: sum(c.lang == lang for c in cases) for lang in ("de", "fr")}
    assert {c.lang for c in cases} == {"de", "fr"} and min(by_lang.values()) >= 45, by_lang
    assert len({c.markup for c in cases}) == len(cases)  # no case twice
    for case in cases:
        assert len(tag_multiset(case.markup)) >= 1 and all(case.expected), case
    assert any(len(c.expected) == 2 for c in cases) and any(" " in e for c in cases for e in c.expected)


def test_a_placement_file_with_an_expectation_missing_is_refused(tmp_path):
    bad = tmp_path / "placement.tsv"
    bad.write_text("# comment\n\nde\tEin <b>roter</b> Hund und ein <i>schwarzer</i> Hund.\tred\n")
    with pytest.raises(ValueError, match=r"placement.tsv:3: 2 tags, 1 expectations"):
        read_placement(bad)


def test_placement_is_scored_per_tag():
    case = PlacementCase("de", "Ein <b>roter</b> Hund und ein <i>schwarzer</i> Hund.", ["red", "black"])
    assert score_placement(case, "A <b>red</b> dog and a <i>Black</i> dog.") == ["exact", "exact"]
    assert score_placement(case, "A <b>red dog</b> and a <i>black</i> dog.") == ["wrong", "exact"]
    assert score_placement(case, "A <b>red</b> dog and a black dog.") == ["exact", "tag_missing"]
    # The model wrote "dark", not "black": counted apart, whatever the tag holds.
    assert score_placement(case, "A <b>red</b> dog and a <i>dark</i> dog.") == ["exact", "word_missing"]
    # The same tag twice: matched in order.
    twice = PlacementCase("fr", "Un <b>chien</b> et un <b>chat</b>.", ["dog", "cat"])
    assert score_placement(twice, "A <b>dog</b> and a <b>cat</b>.") == ["exact", "exact"]
    assert score_placement(twice, "A <b>cat</b> and a <b>dog</b>.") == ["wrong", "wrong"]
    phrase = PlacementCase("de", "Ein Hund springt <b>ins Wasser</b>.", ["into the water"])
    assert score_placement(phrase, "A dog jumps <b>into the water.</b>") == ["exact"]  # end punctuation aside
    assert score_placement(phrase, "A dog jumps into <b>the water</b>.") == ["wrong"]


def test_glossary_sentences_hold_one_term_once(german, french):
    for lang, lines in (("de", german), ("fr", french)):
        cases = glossary_candidates(lines, lang)
        assert len(cases) >= 200, lang  # enough to keep 100 per language after the plain check
        assert len({c.term for c in cases[: len(TERMS[lang])]}) == len(TERMS[lang])  # round-robin
        for case in cases:
            assert [t for t in TERMS[lang] if occurrences(case.text, t)] == [case.term]
            assert occurrences(case.text, case.term, strict=True) == 1
            assert case.surface.casefold() == case.term.casefold() and case.surface in case.text
        none = unmatched(lines, lang, 100)
        assert len(none) == 100 and not any(occurrences(t, term) for t in none for term in TERMS[lang])
    # "l'homme" is an occurrence, but not one standing alone.
    assert occurrences("Un chien et l'homme.", "homme") == 1 and occurrences("l'homme", "homme", strict=True) == 0
    assert glossary_candidates(["L'homme et un chien.", "Un homme court."], "fr") == [
        GlossaryCase("fr", "Un homme court.", "homme", "homme", "man", "gentleman")
    ]
    assert unrelated_glossary(german[:500]) == UNRELATED  # none of them occurs in the BLEU sentences
    assert "Datenbank" not in unrelated_glossary(["Eine Datenbank."])


def test_a_glossary_translation_is_scored_against_the_plain_one():
    case = GlossaryCase("de", "Ein Hund rennt.", "Hund", "Hund", "dog", "canine")
    plain = "A dog is running."
    assert usable(case, plain) and not usable(case, "A dog and a dog.") and not usable(case, "A canine dog.")
    assert word_index(plain, "dog") == 1 and word_index("a dog, a dog", "dog") is None
    assert word_index("A man in a red shirt", "red shirt") == 4
    placed = score_glossary(case, plain, "A canine is running.", [("canine", 2, 8)])
    assert (placed.target_present, placed.replaced, placed.in_place, placed.landed) == (True, True, True, True)
    elsewhere = score_glossary(case, plain, "Running is a canine.", [("canine", 13, 19)])
    assert (elsewhere.replaced, elsewhere.in_place, elsewhere.landed) == (True, False, True)
    both = score_glossary(case, plain, "A canine dog is running.", [("canine", 2, 9)])  # a span off by one
    assert (both.target_present, both.replaced, both.landed) == (True, False, False)
    missed = score_glossary(case, plain, "A dog is running.", [("canine", -1, -1)])
    assert (missed.target_present, missed.landed) == (False, False)


def test_interleaved_pairs_alternate_and_report_ratios():
    calls = []

    def a(x):
        calls.append(("a", x))
        return f"a{x}"

    def b(x):
        calls.append(("b", x))
        return f"b{x}"

    cost, first_a, first_b = interleaved(a, b, [1, 2], rounds=2)
    assert first_a == ["a1", "a2"] and first_b == ["b1", "b2"]
    assert calls == [("a", 1), ("b", 1), ("b", 2), ("a", 2), ("b", 1), ("a", 1), ("a", 2), ("b", 2)]
    assert cost["n"] == 2 and cost["rounds"] == 2 and cost["median_of_ratios"] > 0 and cost["ratio_of_sums"] > 0


def test_the_mixed_texts_join_a_german_and_a_french_sentence(german, french):
    texts = mixed_texts(german, french, 50)
    assert len(texts) == 50
    for i, (text, spans) in enumerate(texts):
        assert [lang for _, _, lang in spans] == (["de", "fr"] if i % 2 == 0 else ["fr", "de"])
        (a, b, first), (c, d, _) = spans
        assert a == 0 and d == len(text) and text[b:c] == " "
        assert text[a:b] in (german if first == "de" else french)


def test_the_detector_tells_the_detection_sentences_apart(data_dir):
    """The detection part's sentences and the detector the server asks, without the server: the
    99% target holds for the detector alone (py3langid's model is exact arithmetic on any CPU)."""
    from service.runtime.language_id import LanguageDetector

    sentences = detection_sentences(data_dir, 300)
    detector = LanguageDetector.shared()
    for lang, texts in sentences.items():
        assert len(texts) == 300 and all(len(t) >= MIN_CHARS for t in texts)
        right = [ranked[0][0] == lang for ranked in detector.detect_batch(texts, ("de", "fr"))]
        assert sum(right) / len(right) >= 0.99, lang


def test_interleaved_pairs_report_each_groups_median_ratio(monkeypatch):
    clock = [0.0]  # a's call takes 4 units for the items of {1, 3}, 1 otherwise; b's 1
    monkeypatch.setattr("benchmarks.translation_service.time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def a(x):
        clock[0] += 4.0 if x in (1, 3) else 1.0

    def b(x):
        clock[0] += 1.0

    cost, _, _ = interleaved(a, b, [1, 2, 3], rounds=1, groups=[["slow"], ["fast"], ["slow", "odd"]])
    assert cost["median_of_ratios_by_group"] == {"fast": 1.0, "odd": 4.0, "slow": 4.0}
    assert cost["median_of_ratios"] == 4.0
