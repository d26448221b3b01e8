"""Glossaries and do-not-translate phrases through the engine of the shipped de-en model (int8):
a term takes the place of the model's own word, applied_terms points at it in the text put back
together, sentences without a match decode as without a glossary, the limits and bad input,
named glossaries of a version folder, TranslateStream and the caller's (markup's) spans."""

from __future__ import annotations

import asyncio
import gzip
import re
import shutil
import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.decoding.terms import MAX_TERMS
from service.engine import documents, glossary
from service.engine.glossary import load_glossaries
from service.engine.languages import LanguagePair, Prefixes
from service.engine.requests import Chunk, GlossaryEntry, TranslateOptions, TranslationResult
from service.engine.streaming import translate_stream
from service.engine.terms import Match, Term
from service.engine.text import normalize_text, normalize_with_offsets
from service.errors import InvalidArgument, ModelLoadError, NotFound
from service.metrics import Metrics
from service.repository.layout import VersionDir
from service.repository.loader import ModelLoader
from service.settings import Settings
from tests.conftest import SHIPPED_MODEL

LIMIT = 40  # max_input_tokens: a long sentence is cut into parts
# Sentences the shipped model translates with the word the glossary replaces ("dog", "woman").
DOG = "Ein brauner Hund gräbt im Dreck."
WOMAN = "Eine Frau mit einem Hut macht Brot."
KIDS = "Zwei Kinder spielen auf einem Fahrrad."
UNMATCHED = ["Ein Mann an seinem Hochzeitstag.", "Zwei Männer sitzen auf einer Bank."]
NAMED = "# animals\nHund\tpuppy\tHunde|Hundes\nFrau\tlady\n"


@pytest.fixture(scope="module")
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory, shipped_int8_export, loop):
    """The shipped de-en model served from a version folder of its own with glossaries/animals.tsv."""
    version = tmp_path_factory.mktemp("glossary-repo") / "de-en" / "1"
    version.mkdir(parents=True)
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(SHIPPED_MODEL / name, version / name)
    (version / "onnx").symlink_to(shipped_int8_export, target_is_directory=True)
    (version / "glossaries").mkdir()
    (version / "glossaries" / "animals.tsv").write_text(NAMED, encoding="utf-8")
    settings = Settings(
        precision="int8",
        engine_process=False,
        decode_workers=1,
        text_processes=0,
        metrics_port=0,
        max_input_tokens=LIMIT,
    )
    model = loop.run_until_complete(ModelLoader(settings, Metrics()).load(VersionDir("de-en", "1", version)))
    yield model
    model.backend.shutdown()


@pytest.fixture(scope="module")
def translate(served, loop):
    def run(texts, markup=None, field_prefix="", **options) -> list[TranslationResult]:
        opts = TranslateOptions(**options)
        return loop.run_until_complete(served.engine.translate(texts, opts, field_prefix=field_prefix, terms=markup))

    return run


@pytest.mark.parametrize("beam", [1, 4])
def test_a_term_takes_the_place_of_the_models_word(translate, beam):
    glossary = [GlossaryEntry("Hund", "puppy"), GlossaryEntry("frau", "lady")]  # any case
    plain = translate([DOG, WOMAN], beam_size=beam)
    got = translate([DOG, WOMAN], beam_size=beam, glossary=glossary)
    for text, p, g, (word, target) in zip([DOG, WOMAN], plain, got, [("dog", "puppy"), ("woman", "lady")]):
        at = p.text.index(f" {word} ") + 1
        assert g.text[:at] == p.text[:at] and g.text[at : at + len(target)] == target, g.text
        assert word not in g.text.split()
        (term,) = g.applied_terms
        assert (term.target, term.start, term.end, term.origin) == (target, at, at + len(target), "glossary")
        assert text[term.source_start : term.source_end] == term.source and term.source in ("Hund", "Frau")


@pytest.mark.parametrize("beam", [1, 4])
def test_a_term_lands_at_the_word_the_model_used_its_article_kept(translate, beam):
    """Two passes: the model's "A man ..." becomes "A gentleman ...", not "gentleman ..." (the
    article's step attends to "Mann" as much as the noun's) nor "... gentleman." at the end."""
    text = "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
    (plain,) = translate([text], beam_size=beam)
    (got,) = translate([text], beam_size=beam, glossary=[GlossaryEntry("Mann", "gentleman")])
    assert plain.text.startswith("A man ")
    assert got.text.startswith("A gentleman ") and "man" not in got.text.split()
    (term,) = got.applied_terms
    assert (term.start, term.end) == (2, 2 + len("gentleman"))


@pytest.mark.parametrize("beam", [1, 4])
def test_a_do_not_translate_phrase_comes_back_verbatim(translate, beam):
    text = "Ein Mann in einem Karateanzug in der Luft."
    (got,) = translate([text], beam_size=beam, do_not_translate=["karateanzug"])
    (term,) = got.applied_terms
    assert term.origin == "do_not_translate" and term.source == term.target == "Karateanzug"
    assert got.text[term.start : term.end] == "Karateanzug"


def test_applied_terms_point_into_the_text_put_back_together(translate):
    text = f"  {KIDS} {WOMAN}\n\n{DOG}\n"
    glossary = [GlossaryEntry("Kinder", "kids"), GlossaryEntry("Frau", "lady"), GlossaryEntry("Hund", "puppy")]
    (got,) = translate([text], glossary=glossary)
    assert [t.source for t in got.applied_terms] == ["Kinder", "Frau", "Hund"]
    for t in got.applied_terms:
        assert text[t.source_start : t.source_end] == t.source
        assert got.text[t.start : t.end] == t.target, (got.text, t)
    (alone,) = translate([WOMAN], split="none", glossary=glossary)
    (t,) = alone.applied_terms
    assert alone.text[t.start : t.end] == "lady"


@pytest.mark.parametrize("beam", [1, 4])
def test_sentences_without_a_match_decode_as_without_a_glossary(translate, beam):
    texts = [DOG, *UNMATCHED, f"{UNMATCHED[0]} {WOMAN}"]
    plain = translate(texts, beam_size=beam, return_scores=True)
    got = translate(texts, beam_size=beam, return_scores=True, glossary=[GlossaryEntry("Frau", "lady")])
    for p, g in zip(plain[:3], got[:3]):  # the scores within what other batch shapes change in int8 kernels
        assert (g.text, g.token_ids, g.applied_terms) == (p.text, p.token_ids, [])
        assert g.score == pytest.approx(p.score, abs=0.05)
    first_p, second_p = plain[3].segments
    first_g, second_g = got[3].segments
    assert first_g.translation.token_ids == first_p.translation.token_ids
    assert "lady" in second_g.translation.text and len(got[3].applied_terms) == 1


def test_the_terms_count_in_the_metrics(served, translate):
    registry = served.engine.metrics.registry
    labels = {"model": "de-en", "version": "1", "origin": "do_not_translate"}
    before = registry.get_sample_value("mtserve_glossary_terms_applied_total", labels) or 0.0
    translate([DOG, WOMAN], do_not_translate=["Hund", "Frau"])
    assert registry.get_sample_value("mtserve_glossary_terms_applied_total", labels) == before + 2


def test_limits_and_bad_terms_are_refused_naming_the_field(translate):
    cases = [
        ({"glossary": [GlossaryEntry(f"w{i}", "x") for i in range(257)]}, "options.glossary"),
        ({"glossary": [GlossaryEntry("a", "b")] * 200, "do_not_translate": ["c"] * 57}, "options.do_not_translate"),
        ({"glossary": [GlossaryEntry("Hund", "dog"), GlossaryEntry("x" * 257, "y")]}, "options.glossary[1].source"),
        ({"glossary": [GlossaryEntry("Hund", "dog", (" ".join(["w"] * 17),))]}, "options.glossary[0].forms[0]"),
        ({"glossary": [GlossaryEntry("Hund", " ")]}, "options.glossary[0].target"),
        ({"do_not_translate": ["--"]}, "options.do_not_translate[0]"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidArgument) as e:
            translate([DOG], **options)
        assert e.value.field == field, e.value
    with pytest.raises(InvalidArgument) as e:
        translate([DOG], field_prefix="request.", do_not_translate=[""])
    assert e.value.field == "request.options.do_not_translate[0]"


def test_a_sentence_of_more_matches_than_the_search_holds_is_refused(served):
    """MAX_TERMS matches in one row (past this engine's max_input_tokens: planned by hand)."""
    engine = served.engine
    text = " ".join(["a"] * (MAX_TERMS + 1))
    plans = [
        documents.Plan(t, [(0, len(t))], [[[*engine.tokenizer.encode(t), engine.eos_id]]]) for t in ("Hund .", text)
    ]
    wanted = engine.request_terms(TranslateOptions(do_not_translate=["a"]))
    assert wanted is not None
    with pytest.raises(InvalidArgument) as e:
        glossary.place(wanted, plans, engine.tokenizer, 0, engine.manifest.special_ids.unk_id)
    assert e.value.field == "texts[1]" and str(MAX_TERMS) in str(e.value)
    found = glossary.place(wanted, plans[:1] + [plans[0]], engine.tokenizer, 0, engine.manifest.special_ids.unk_id)
    assert found is None  # no match: nothing for the search to do


def test_a_named_glossary_is_listed_used_and_overridden(served, translate):
    info = served.engine.model_info()
    assert info["glossaries"] == ["animals"]
    assert {k: info["limits"][k] for k in ("max_glossary_terms", "max_term_chars", "max_term_words")} == {
        "max_glossary_terms": 256,
        "max_term_chars": 256,
        "max_term_words": 16,
    }
    dog, woman = translate([DOG, WOMAN], glossary_id="animals")
    assert [(t.target, t.origin) for t in dog.applied_terms + woman.applied_terms] == [
        ("puppy", "animals"),
        ("lady", "animals"),
    ]
    (dog,) = translate([DOG], glossary_id="animals", glossary=[GlossaryEntry("Hund", "cat")])
    ((t,),) = [dog.applied_terms]
    assert (t.target, t.origin) == ("cat", "glossary") and dog.text[t.start : t.end] == "cat"
    with pytest.raises(NotFound) as e:
        translate([DOG], glossary_id="plants")
    assert str(e.value).startswith("options.glossary_id:") and "animals" in str(e.value)


def test_a_glossary_file_at_fault_names_its_line(tmp_path):
    (tmp_path / "glossaries").mkdir()
    path = tmp_path / "glossaries" / "bad.tsv"
    path.write_text("Hund\tdog\n\nKatze\n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(path))}:3: 1 columns"):
        load_glossaries(tmp_path)
    path.write_bytes(b"Hund\tdog\nK\xe4tze\tcat\n")
    with pytest.raises(ModelLoadError, match=rf"{re.escape(str(path))}:2: not UTF-8"):
        load_glossaries(tmp_path)
    path.write_text("Hund\t" + "x" * 300 + "\n", encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"bad.tsv:1.target: 300 characters"):
        load_glossaries(tmp_path)


def test_a_term_across_the_cut_of_an_over_long_sentence_is_not_forced(served, translate):
    words = []
    for line in gzip.open(Path(__file__).parents[3] / "data/multi30k/test_2016_flickr.de.gz", "rt"):
        words += [w for w in line.split() if w.isalpha() and w.islower() and w not in words]
        if len(words) >= 40:
            break
    text = " ".join(words[:40])
    engine = served.engine
    (plan,) = engine.plans([text], TranslateOptions(), LanguagePair(), Prefixes())
    first, second = plan.rows[0][:2]
    head = engine.tokenizer.decode(first[:-1]).split()[-1]
    tail = engine.tokenizer.decode(second[:-1]).split()[0]
    (got,) = translate([text], do_not_translate=[f"{head} {tail}", words[0]])
    across, inside = sorted(got.applied_terms, key=lambda t: t.source != f"{head} {tail}")
    assert (across.start, across.end) == (-1, -1)
    assert got.text[inside.start : inside.end] == words[0]


def test_markup_spans_are_kept_and_win_over_glossary_terms(translate):
    text = "Ein Mann in einem Karateanzug in der Luft."
    at = text.index("Karateanzug")
    span = Match(at, at + len("Karateanzug"), Term("Karateanzug", ""), "Karateanzug")
    (got,) = translate([text], markup=[(span,)], glossary=[GlossaryEntry("Karateanzug", "suit")])
    (t,) = got.applied_terms
    assert t.origin == "markup" and got.text[t.start : t.end] == "Karateanzug"


def test_translate_stream_forces_the_terms_and_its_chunks_add_up(served, loop):
    async def collect():
        opts = TranslateOptions(beam_size=1, glossary=[GlossaryEntry("Frau", "lady")])
        return [e async for e in translate_stream(served.engine, f"{KIDS} {WOMAN}", opts)]

    events = loop.run_until_complete(collect())
    *chunks, final = events
    assert all(isinstance(c, Chunk) for c in chunks) and isinstance(final, TranslationResult)
    assert "".join(c.text for c in chunks) == final.text
    (t,) = final.applied_terms
    assert final.text[t.start : t.end] == "lady"


@given(st.text(alphabet=st.sampled_from("aéeb\u0301\u200b\x00 \u1100\u1161\u11a8ß\t"), max_size=20))
def test_normalized_text_maps_back_to_the_text_as_sent(text):
    clean, starts, ends = normalize_with_offsets(text)
    assert clean == normalize_text(text) and len(starts) == len(ends) == len(clean)
    assert all(a < b for a, b in zip(starts, ends)) and list(starts) == sorted(starts) and list(ends) == sorted(ends)
    for ch, a, b in zip(clean, starts, ends):
        source = unicodedata.normalize("NFC", text[a:b])
        assert ch == source or (len(source) > 1 and ch in unicodedata.normalize("NFC", normalize_text(source) or " "))


def test_the_plans_token_spans_place_the_terms_as_tokenising_again_does(served):
    """A request with terms keeps its segments' token spans in its plan (documents.Rules.offsets):
    the same spans as tokenising each segment again, and the same terms placed with them."""
    engine = served.engine
    texts = ["Ein Hund läuft.  Zwei\u00a0Hunde  spielen am Strand.", "Der Mann und der Hund."]
    opts = TranslateOptions(glossary=[GlossaryEntry("Hund", "canine", ["Hunde"]), GlossaryEntry("Strand", "shore")])
    pair, prefixes = LanguagePair(), Prefixes((), ())
    kept = engine.plans(texts, opts, pair, prefixes, offsets=True)
    bare = engine.plans(texts, opts, pair, prefixes)
    assert all(p.offsets is None for p in bare)
    for plan in kept:
        assert plan.offsets is not None and len(plan.offsets) == len(plan.spans)
        for (a, b), spans in zip(plan.spans, plan.offsets):
            assert spans == engine.tokenizer.encode_with_offsets(normalize_text(plan.text[a:b]))[1]
    wanted = engine.request_terms(opts, texts=len(texts))
    unk = engine.manifest.special_ids.unk_id
    with_spans, again = (glossary.place(wanted, plans, engine.tokenizer, 0, unk) for plans in (kept, bare))
    assert with_spans is not None and again is not None
    assert with_spans.rows == again.rows and any(with_spans.rows)
    assert [[(f.source, f.row, f.term) for f in t] for t in with_spans.texts] == [
        [(f.source, f.row, f.term) for f in t] for t in again.texts
    ]
