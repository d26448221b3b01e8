"""Marked-up texts through the engine (service.engine.markup_text) with the shipped de-en and fr-en
models: the tags come back around the translated words and byte for byte, the text alone is the
plain translation of the text without its tags, translate="no" stays verbatim, malformed XML is
INVALID_ARGUMENT with its position, and all the blocks of a request are one call of the plain
path. Also the pieces without a model: the source offsets through the normalisation and the
target tokens' spans."""

from __future__ import annotations

import collections
import gzip
import html
import random
import re
import xml.etree.ElementTree as ET

import html5lib
import numpy as np
import pytest

from service.engine.markup import parse
from service.engine.requests import TranslateOptions
from service.engine.streaming import translate_stream
from service.engine.text import normalize_text, normalize_with_offsets
from service.engine.token_alignment import links, source_span, target_spans
from service.errors import InvalidArgument
from service.runtime.tokenizer import BpeTokenizer

LIMIT = 64  # max_input_tokens of the server here
TAG = re.compile(r"<[^>]*>")


@pytest.fixture(scope="module")
def server(make_server, shipped_repository):
    return make_server(
        model_dir=None,
        onnx_dir=None,
        model_repository=shipped_repository,
        models="de-en,fr-en",
        precision="int8",
        continuous_batching=False,
        max_input_tokens=LIMIT,
    )


@pytest.fixture(scope="module")
def de_en(server):
    return server.server.models.resolve("de-en").engine


@pytest.fixture(scope="module")
def fr_en(server):
    return server.server.models.resolve("fr-en").engine


def translate(server, engine, texts: list[str], **options) -> list:
    return server.call(engine.translate(texts, TranslateOptions(**options)))


def html_translate(server, engine, texts: list[str], **options) -> list:
    return translate(server, engine, texts, text_type="html", **options)


def refused(server, engine, texts: list[str], **options) -> str:
    with pytest.raises(InvalidArgument) as e:
        translate(server, engine, texts, **options)
    return str(e.value)


def words_of(markup: str, kind: str = "html") -> list[str]:
    """The texts of the blocks of `markup`: its words without the tags, entities decoded."""
    return [block.text for block in parse(markup, kind).blocks]


def collapsed(text: str) -> str:
    return " ".join(text.split(" ")).strip()


def tags(markup: str) -> collections.Counter[str]:
    return collections.Counter(TAG.findall(markup))


def html_parses_cleanly(markup: str) -> bool:
    parser = html5lib.HTMLParser()
    parser.parseFragment(markup)
    return not parser.errors


# -- inline markup -------------------------------------------------------------------------------

INLINE = [
    "Ein <b>roter</b> Hund läuft über die <i>Straße</i>.",
    'Ein Mann mit <a href="/hut?farbe=rot&amp;größe=2" title=\'Ein "Hut"\'>einem Hut</a> steht vor dem Haus.',
    'Zwei <span class="x" data-n=3>kleine <b><i>Kinder</i></b> spielen</span> im Sand.',
    "Eine Frau <em>in einem roten Kleid</em> liest ein <strong>Buch</strong>.",
]


def test_inline_tags_come_back_once_each_byte_for_byte_around_the_translated_words(server, de_en):
    plain = translate(server, de_en, [" ".join(words_of(t)) for t in INLINE])
    done = html_translate(server, de_en, INLINE)
    for source, result, alone in zip(INLINE, done, plain):
        assert tags(result.text) == tags(source), result.text
        assert words_of(result.text) == [collapsed(alone.text)]
        assert html_parses_cleanly(result.text), result.text
    # A tag lands around the words the model made of the words it enclosed.
    assert re.search(r"<strong>[^<]*\bbook\b[^<]*</strong>", done[3].text), done[3].text
    assert re.search(r"<em>[^<]*\bdress\b[^<]*</em>", done[3].text), done[3].text


def test_void_elements_comments_and_entities_stay_where_they_were(server, de_en):
    source = (
        '<!-- Kopf --><p>Ein Hund <img src="hund.png" alt="Ein Hund &amp; ein Ball"> fängt'
        " <!-- mitten --> einen Ball.&nbsp;</p>"
    )
    (result,) = html_translate(server, de_en, [source])
    out = result.text
    assert out.startswith("<!-- Kopf --><p>") and out.endswith("&nbsp;</p>")
    assert tags(out) == tags(source)
    assert out.index('<img src="hund.png" alt="Ein Hund &amp; ein Ball">') < out.index("<!-- mitten -->")
    (alone,) = translate(server, de_en, ["Ein Hund fängt einen Ball."])
    assert words_of(out) == [collapsed(alone.text) + "\xa0"]


def test_script_style_code_pre_and_attributes_are_not_translated(server, de_en):
    source = (
        "<style>p { color: red }</style><pre>Ein Hund  bellt.</pre>"
        '<p title="Ein Titel">Der Mann <code>ls -l</code> liest.</p><script>var a = "<p>Ein Hund</p>";</script>'
    )
    (result,) = html_translate(server, de_en, [source])
    for kept in ("<style>p { color: red }</style>", "<pre>Ein Hund  bellt.</pre>", '<p title="Ein Titel">'):
        assert kept in result.text
    assert result.text.endswith('<script>var a = "<p>Ein Hund</p>";</script>')
    assert "<code>ls -l</code>" in result.text


def test_block_elements_are_segments_of_their_own(server, de_en):
    sentences = ["Ein Hund bellt.", "Zwei Kinder spielen im Sand.", "Eine Frau liest.", "Ein Mann singt."]
    source = f"<h1>{sentences[0]}</h1>\n<ul><li>{sentences[1]}</li><li>{sentences[2]}<br>{sentences[3]}</li></ul>"
    (result,) = html_translate(server, de_en, [source], return_scores=True)
    alone = translate(server, de_en, sentences)
    assert words_of(result.text) == [collapsed(a.text) for a in alone]
    assert [source[s.start : s.end] for s in result.segments] == sentences
    assert [s.translation.text for s in result.segments] == [html.escape(a.text, quote=False) for a in alone]
    assert "\n<ul><li>" in result.text and result.text.count("<br>") == 1
    assert result.input_tokens == sum(s.translation.input_tokens for s in result.segments)
    assert result.score is not None and all(s.translation.score is not None for s in result.segments)


def test_the_blocks_of_all_the_texts_are_one_call_of_the_plain_path(server, de_en, monkeypatch):
    calls = []
    submit = de_en.scheduler.submit
    monkeypatch.setattr(de_en.scheduler, "submit", lambda sentences: (calls.append(len(sentences)), submit(sentences)))
    texts = ["<p>Ein Hund.</p><p>Eine Katze.</p>", "<div>Ein Mann.</div>", "<img src=a.png><!-- nichts -->"]
    results = html_translate(server, de_en, texts)
    assert calls == [3]
    assert results[2].text == texts[2] and not results[2].segments and results[2].input_tokens == 0
    calls.clear()
    assert html_translate(server, de_en, ["<br>", "<p>&nbsp;</p>"])[1].text == "<p>&nbsp;</p>"
    assert calls == []  # nothing for the model


def test_only_a_block_with_markup_to_place_is_aligned(server, de_en, monkeypatch):
    import service.engine.markup_text as markup_text

    aligned = []
    piece_translation = markup_text._piece_translation
    monkeypatch.setattr(
        markup_text, "_piece_translation", lambda *a: (aligned.append(a[2].text), piece_translation(*a))[1]
    )
    source = "<p>Ein Hund bellt.</p><p>Eine <b>Katze</b> schläft.</p><p>Ein Mann<br>singt.</p>"
    (result,) = html_translate(server, de_en, [source])
    assert aligned == ["Eine Katze schläft."]
    alone = translate(server, de_en, ["Ein Hund bellt.", "Eine Katze schläft.", "Ein Mann", "singt."])
    assert words_of(result.text) == [collapsed(a.text) for a in alone]


def test_the_plans_token_spans_align_as_tokenising_again_does(server, de_en, monkeypatch):
    """The plain path keeps the blocks' token spans in their plans (documents.Rules.offsets); a
    plan without them (made in a plan process) tokenises each segment again, with the same result."""
    import service.engine.documents as documents

    source = "<p>Zwei <i>junge</i> Männer  spielen <b>am   Strand</b>.  Ein <a href='x'>Hund</a> bellt.</p>"
    (kept,) = html_translate(server, de_en, [source])
    plan_text = documents.plan_text

    def without(text, name, rules, tokenizer, point=documents.NO_CHECK):
        plan = plan_text(text, name, rules, tokenizer, point)
        assert plan.offsets is not None and len(plan.offsets) == 2  # two sentences, each with its spans
        plan.offsets = None
        return plan

    monkeypatch.setattr(documents, "plan_text", without)
    (again,) = html_translate(server, de_en, [source])
    assert again.text == kept.text and again.alignment == kept.alignment


# -- the text alone is the plain translation ----------------------------------------------------


def _corpus(data_dir, lang: str, n: int) -> list[str]:
    with gzip.open(data_dir / f"test_2016_flickr.{lang}.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line, _ in zip(f, range(n))]


def _marked_up(sentence: str, rng: random.Random) -> str:
    """`sentence` with inline tags around some of its words, a void element and a comment
    between two of them, its text escaped."""
    words = [html.escape(w, quote=False) for w in sentence.split()]
    wrappers = [
        ("<b>", "</b>"),
        ("<i>", "</i>"),
        ('<a href="https://example.com/?q=1&amp;r=2" title=\'T "x"\'>', "</a>"),
        ('<span class="hl">', "</span>"),
        ("<b><i>", "</i></b>"),
    ]
    for _ in range(2):
        first = rng.randrange(len(words))
        last = min(len(words) - 1, first + rng.randrange(3))
        if any(TAG.search(w) for w in words[first : last + 1]):
            continue
        open_tag, close_tag = rng.choice(wrappers)
        words[first] = open_tag + words[first]
        words[last] += close_tag
    at = rng.randrange(1, len(words))
    words.insert(at, rng.choice(['<img src="x.png" alt="Bild">', "<!-- c -->", "<wbr>"]))
    return " ".join(words)


@pytest.mark.parametrize("lang", ["de", "fr"])
def test_without_the_tags_the_translation_is_the_plain_translation_of_the_text(server, de_en, fr_en, data_dir, lang):
    engine = de_en if lang == "de" else fr_en
    sentences = _corpus(data_dir, lang, 20)
    rng = random.Random(lang)
    marked = [_marked_up(s, rng) for s in sentences]
    assert [words_of(m) for m in marked] == [[collapsed(s)] for s in sentences]
    plain = translate(server, engine, sentences)
    done = html_translate(server, engine, marked)
    for source, result, alone in zip(marked, done, plain):
        assert words_of(result.text) == [collapsed(alone.text)], (source, result.text)
        assert tags(result.text) == tags(source), (source, result.text)


# -- translate="no" -----------------------------------------------------------------------------


def test_translate_no_inside_a_sentence_comes_back_verbatim_in_place(server, de_en):
    texts = [
        'Das <span translate="no">iPhone 15</span> ist ein gutes Telefon.',
        '<p>Ein Mann liest <b>das Buch <i class="notranslate">Der Zauberberg</i></b> im Park.</p>',
        '<p><span translate="no">Kein Text</span> Ein Hund bellt.</p><p translate="no">Ein Hund.</p>',
    ]
    results = html_translate(server, de_en, texts)
    assert '<span translate="no">iPhone 15</span>' in results[0].text
    assert '<i class="notranslate">Der Zauberberg</i>' in results[1].text
    assert (
        results[1].text.index("<b>") < results[1].text.index('<i class="notranslate">') < results[1].text.index("</b>")
    )
    assert results[2].text.startswith('<p><span translate="no">Kein Text</span>')
    assert results[2].text.endswith('<p translate="no">Ein Hund.</p>')
    for source, result in zip(texts, results):
        assert tags(result.text) == tags(source)
    # Forced by the search as do-not-translate terms of origin "markup", reported where they landed.
    for result, words in zip(results, ["iPhone 15", "Der Zauberberg", "Kein Text"]):
        (term,) = [t for t in result.applied_terms if t.origin == "markup"]
        assert (term.source, term.target) == (words, words)
        assert result.text[term.start : term.end] == words


# -- XML ----------------------------------------------------------------------------------------


def test_xml_keeps_its_declaration_and_namespaces(server, de_en):
    source = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<doc xmlns="urn:d" xmlns:x="urn:x">\n'
        '  <x:para id="1">Ein <x:b>roter</x:b> Hund bellt.</x:para>\n  <x:para id="2">Zwei Kinder spielen.</x:para>\n</doc>'
    )
    (result,) = translate(server, de_en, [source], text_type="xml")
    out = result.text
    assert out.startswith('<?xml version="1.0" encoding="UTF-8"?>\n<doc xmlns="urn:d" xmlns:x="urn:x">\n')
    assert tags(out) == tags(source)
    tree = ET.fromstring(out.encode("utf-8"))
    assert [(e.tag, e.attrib) for e in tree.iter()] == [
        (e.tag, e.attrib) for e in ET.fromstring(source.encode()).iter()
    ]
    alone = translate(server, de_en, ["Ein roter Hund bellt.", "Zwei Kinder spielen."])
    assert words_of(out, "xml") == [collapsed(a.text) for a in alone]


def test_malformed_xml_is_invalid_argument_naming_the_text_and_the_position(server, de_en):
    message = refused(server, de_en, ["<p>Gut.</p>", "<doc>\n  <p>Ein <b>Hund</p>\n</doc>"], text_type="xml")
    assert message == "texts[1]: malformed markup at line 2, column 19: mismatched tag"
    with pytest.raises(InvalidArgument) as e:
        server.call(de_en.translate(["<a>"], TranslateOptions(text_type="xml"), field_prefix="request."))
    assert str(e.value).startswith("request.texts[0]: malformed markup at line 1, column 4")


def test_malformed_html_is_repaired(server, de_en):
    source = "<p>Ein <b>Hund bellt.</p><p>Eine Katze</i> schläft.</p>"
    (result,) = html_translate(server, de_en, [source])
    assert html_parses_cleanly(result.text), result.text
    assert result.text.count("<b>") == result.text.count("</b>") == 1 and "</i>" not in result.text
    alone = translate(server, de_en, ["Ein Hund bellt.", "Eine Katze schläft."])
    assert words_of(result.text) == [collapsed(a.text) for a in alone]


# -- options and errors -------------------------------------------------------------------------


def test_what_a_marked_up_request_cannot_have_is_invalid_argument_naming_it(server, de_en):
    assert refused(server, de_en, ["Ein Hund."], text_type="rtf") == (
        "options.text_type: 'rtf' is not one of text, html, xml"
    )
    with pytest.raises(InvalidArgument, match=r"^request\.options\.text_type: "):
        server.call(de_en.translate(["x"], TranslateOptions(text_type="md"), field_prefix="request."))
    assert refused(server, de_en, ["<p>Ein Hund.</p>"], text_type="html", beam_size=2, num_hypotheses=2).startswith(
        "options.num_hypotheses: "
    )
    assert refused(server, de_en, ["<p>Ein Hund.</p>"], text_type="html", target_prefixes=["A"]).startswith(
        "target_prefixes: "
    )
    long = "<p>Kurz.</p><p>" + "Ein Mann und eine Frau und ein Kind " * 12 + "laufen.</p>"
    message = refused(server, de_en, ["<b>Gut.</b>", long], text_type="html", split="none")
    assert message.startswith("texts[1]: a block: ") and f"max_input_tokens ({LIMIT})" in message


def test_alignment_and_tokens_as_the_caller_asked(server, de_en):
    (bare,) = html_translate(server, de_en, ["<p>Ein <b>Hund</b> bellt.</p>"])
    assert bare.alignment is None and not bare.tokens and bare.token_ids
    (full,) = html_translate(
        server, de_en, ["<p>Ein <b>Hund</b> bellt.</p>"], return_alignment=True, return_tokens=True
    )
    assert full.text == bare.text and full.tokens and full.alignment is not None
    assert full.alignment.weights.shape == (len(full.tokens) + 1, len(full.alignment.source_tokens))
    (two,) = html_translate(server, de_en, ["<p>Ein Hund.</p><p>Eine Katze.</p>"], return_alignment=True)
    assert two.alignment is None and all(s.translation.alignment is not None for s in two.segments)


def test_translate_stream_sends_the_whole_translation_as_one_chunk(server, de_en):
    source = "<p>Ein <b>roter</b> Hund.</p><p>Zwei Kinder.</p>"

    async def collect() -> list:
        return [m async for m in translate_stream(de_en, source, TranslateOptions(text_type="html"))]

    *chunks, final = server.call(collect())
    (unary,) = html_translate(server, de_en, [source])
    assert [c.text for c in chunks] == [final.text] and final.text == unary.text

    async def malformed() -> list:
        return [m async for m in translate_stream(de_en, "<a>", TranslateOptions(text_type="xml"))]

    with pytest.raises(InvalidArgument, match=r"^text: malformed markup at line 1, column 4"):
        server.call(malformed())


def test_texts_are_counted_by_text_type(server, de_en):
    registry = server.server.metrics.registry

    def count(text_type: str) -> float:
        labels = {"model": "de-en", "version": "1", "text_type": text_type}
        return registry.get_sample_value("mtserve_text_types_total", labels) or 0.0

    def texts() -> float:
        return registry.get_sample_value("mtserve_texts_total", {"model": "de-en", "version": "1"}) or 0.0

    before = {t: count(t) for t in ("text", "html", "xml")}
    texts_before = texts()
    translate(server, de_en, ["Ein Hund."])
    html_translate(server, de_en, ["<p>Ein Hund.</p><p>Eine Katze.</p>", "<br>"])
    translate(server, de_en, ["<a>Ein Hund.</a>"], text_type="xml")
    assert {t: count(t) - before[t] for t in before} == {"text": 1, "html": 2, "xml": 1}
    assert texts() - texts_before == 3  # "<br>" queued no row


# -- without a model ------------------------------------------------------------------------------


def _source_offsets(text: str, clean: str):
    """A span of `clean` (normalize_text(text)) as a span of `text`, as the markup path maps it."""
    mapped, froms, tos = normalize_with_offsets(text)
    assert mapped == clean
    return lambda start, end: source_span(0, len(text), froms, tos, start, end)


def test_source_offsets_through_the_normalisation():
    for text in ["Ein Hund.", "Ein\u00adHund \u200bbellt.", "Cafe\u0301 au lait", "\u200b Ein Hund"]:
        clean = normalize_text(text)
        where = _source_offsets(text, clean)
        for word in re.finditer(r"\S+", clean):
            start, end = where(word.start(), word.end())
            assert normalize_text(text[start:end]) == word.group(), (text, word.group())
    where = _source_offsets("Cafe\u0301 au", "Café au")
    assert where(0, 4) == (0, 5) and where(5, 7) == (6, 8)


def test_target_spans_cover_the_decoded_text_token_by_token(shipped_int8_export):
    tokenizer = BpeTokenizer(shipped_int8_export / "tokenizer.json")
    text = "A dog — über 3€ naïve"
    ids = tokenizer.encode(text)
    spans, starts = target_spans(tokenizer, ids, tokenizer.decode(ids).strip())
    assert len(spans) == len(ids) and spans[-1][1] == len(text)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    words = [text[a:b] for a, b in spans if b > a]
    assert "".join(words).replace(" ", "") == text.replace(" ", "")
    assert all(a == 0 or text[a - 1] == " " for (a, b), first in zip(spans, starts) if first and b > a)
    assert [text[a:b] for (a, b), first in zip(spans, starts) if first and b > a] == ["A", "dog", "über", "3", "n"]


# -- the alignment's links ---------------------------------------------------------------------


def test_links_are_one_to_one_strongest_first():

    # "A red ball" for "Ein roter Ball": the article looks at the adjective too, the adjective wins it.
    weights = [[0.5, 0.45, 0.05], [0.1, 0.8, 0.1], [0.05, 0.15, 0.8]]
    assert links(np.array(weights), 3, 0, 3) == (0, 1, 2)
    # "a guitar" for "Gitarre": the article has no counterpart, whatever its row says.
    assert links(np.array([[0.6], [0.9]]), 2, 0, 1) == (-1, 0)
    # "ice cream" for "Eis": the token after the winner keeps it.
    assert links(np.array([[0.9], [0.5]]), 2, 0, 1) == (0, 0)
    # A language token leads the source and </s> ends it: neither is linked; no alignment, no links.
    assert links(np.array([[0.9, 0.05, 0.05], [0.1, 0.8, 0.1]]), 2, 1, 1) == (-1, 0)
    assert links(None, 2, 0, 3) == (-1, -1)
