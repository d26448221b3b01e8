"""Glossary terms forced by the search (service.decoding.terms): the rules on arrays without a
model, then through the tiny model's fused steps, greedy and beam."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding import terms as terms_module
from service.decoding.batch import DecodeBatch
from service.decoding.results import Finished
from service.decoding.terms import SourceTerm, advance, decide, landed
from service.runtime.onnx_model import OnnxSeq2Seq

EOS = 2


def test_a_row_starts_the_term_its_attention_is_on_and_is_given_its_tokens():
    terms = [(SourceTerm(3, 5, (40, 41)), SourceTerm(7, 8, (50,)))]
    at, pos, placed = np.array([-1]), np.array([0]), np.array([0])
    att = np.zeros((1, 10))
    att[0, 4] = 1.0  # on the first term's span
    step, at = decide(terms, at, pos, placed, att, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [40] and at.tolist() == [0] and step.no_eos.tolist() == [True]
    at, pos, placed = advance(terms, at, pos, placed, step.forced)
    assert (at.tolist(), pos.tolist(), placed.tolist()) == ([0], [1], [0])
    step, at = decide(terms, at, pos, placed, np.zeros((1, 10)), np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [41]
    at, pos, placed = advance(terms, at, pos, placed, step.forced)
    assert (at.tolist(), pos.tolist(), placed.tolist()) == ([-1], [0], [1])  # placed: free again


def test_a_row_about_to_end_places_its_missing_term_first():
    terms = [(SourceTerm(3, 5, (40,)), SourceTerm(7, 8, (50,)))]
    att = np.zeros((1, 10))
    att[0, 0] = 1.0  # on no term
    step, at = decide(
        terms, np.array([-1]), np.array([0]), np.array([1]), att, np.array([EOS]), np.array([True]), np.array([50]), EOS
    )
    assert step.forced.tolist() == [50] and at.tolist() == [1]
    step, _ = decide(
        terms, np.array([-1]), np.array([0]), np.array([1]), att, np.array([9]), np.array([True]), np.array([50]), EOS
    )
    assert step.forced.tolist() == [-1] and step.no_eos.tolist() == [True]  # it may not end yet
    step, _ = decide(
        terms, np.array([-1]), np.array([0]), np.array([3]), att, np.array([EOS]), np.array([True]), np.array([50]), EOS
    )
    assert step.forced.tolist() == [-1] and step.no_eos.tolist() == [False]  # all placed
    step, _ = decide(
        terms, np.array([-1]), np.array([0]), np.array([1]), att, np.array([9]), np.array([True]), np.array([1]), EOS
    )
    assert step.forced.tolist() == [50]  # only just room for it before the length limit


def test_attention_shared_with_a_word_outside_the_span_starts_no_term():
    terms = [(SourceTerm(1, 2, (40,)),)]
    state = np.array([-1]), np.array([0]), np.array([0])
    shared = np.array([[0.45, 0.5, 0.05, 0.0]])  # an article: on itself and the noun alike
    step, at = decide(terms, *state, shared, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [-1] and at.tolist() == [-1]
    on_it = np.array([[0.05, 0.9, 0.05, 0.0]])
    step, at = decide(terms, *state, on_it, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [40] and at.tolist() == [0]


def test_rows_without_terms_or_done_are_left_alone():
    terms = [(), (SourceTerm(0, 1, (40,)),)]
    att = np.ones((2, 4))
    step, at = decide(
        terms,
        np.array([-1, -1]),
        np.zeros(2, np.int64),
        np.zeros(2, np.int64),
        att,
        np.array([EOS, EOS]),
        np.array([True, False]),
        np.array([50, 50]),
        EOS,
    )
    assert step.forced.tolist() == [-1, -1] and step.no_eos.tolist() == [False, False] and at.tolist() == [-1, -1]


def test_landed_finds_each_terms_tokens_once_in_order():
    terms = (SourceTerm(0, 1, (7, 8)), SourceTerm(2, 3, (5,)))
    assert landed([5, 1, 7, 8, 5], terms) == [(1, 0, 1), (0, 2, 4)]
    assert landed([1, 7], terms) == []  # cut off


@pytest.fixture(scope="module")
def model(tiny_onnx_dir) -> OnnxSeq2Seq:
    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32")


def decode(model: OnnxSeq2Seq, batch: DecodeBatch) -> dict:
    out: dict = {}
    while len(batch):
        for f in batch.step(model):
            out[f.key] = f
        if not batch.active_keys():
            break
        batch.filter(batch.active_keys())
    return out


def term_for(model: OnnxSeq2Seq, text: str, word: str, target: str) -> SourceTerm:
    """The term over `word`'s source tokens in `text` (found by encoding the prefix before it)."""
    at = text.index(word)
    start = len(model.tokenizer.encode(text[:at].rstrip())) if at else 0
    end = len(model.tokenizer.encode(text[: at + len(word)]))
    return SourceTerm(start, end, tuple(model.tokenizer.encode_target(target)))


@pytest.mark.parametrize("beam", [1, 4])
def test_terms_are_forced_and_sentences_without_them_decode_as_before(model, test_split, beam):
    de, _ = test_split
    texts = [t for t in de if " Hund " in t][:3] + de[:5]
    src = model.source_ids(texts)
    keys = list(range(len(texts)))
    plain = decode(model, DecodeBatch.from_sources(model, src, keys, beam=beam))
    terms = [(term_for(model, t, "Hund", "wolfhound"),) if " Hund " in t else () for t in texts]
    assert sum(map(bool, terms)) == 3
    got = decode(model, DecodeBatch.from_sources(model, src, keys, beam=beam, terms=terms))
    for i, ts in enumerate(terms):
        f: Finished = got[i]
        if not ts:
            assert f.tokens == plain[i].tokens and not f.terms  # no match: exactly as without terms
            continue
        ((j, s, e),) = f.terms
        assert tuple(f.tokens[s:e]) == ts[0].target
        assert "wolfhound" in model.detokenize([f.tokens])[0]


def test_a_term_stands_where_the_model_translates_its_source(model, test_split, monkeypatch):
    """Where the plain output's attention first lands on the term's source word, the term's
    target starts, and the output before it is the plain one. The tiny model's attention is never
    DOMINANCE times more on one word than on every other: here any weight on the span will do
    (tests/service/engine/test_glossary.py places terms on the shipped model with it)."""
    monkeypatch.setattr(terms_module, "DOMINANCE", 0.0)
    de, _ = test_split
    checked = 0
    for text in de[:300]:
        word = next((w for w in ("Mann", "Frau", "Hund", "Junge", "Mädchen") if f" {w} " in text), None)
        if word is None:
            continue
        (src,) = model.source_ids([text])
        (plain,) = decode(model, DecodeBatch.from_sources(model, [src], [0], want_alignment=True)).values()
        term = term_for(model, text, word, "wolfhound")
        on_span = [t for t, row in enumerate(plain.alignment[:-1]) if term.start <= int(row.argmax()) < term.end]
        if not on_span:
            continue  # the tiny model never looks at the word: nothing to place it by
        (got,) = decode(model, DecodeBatch.from_sources(model, [src], [0], terms=[(term,)])).values()
        ((_, s, _),) = got.terms
        assert s == on_span[0], text
        assert got.tokens[:s] == plain.tokens[:s]
        checked += 1
        if checked == 5:
            break
    assert checked == 5


def test_a_term_cut_by_the_length_limit_is_not_reported(model):
    text = "Ein Hund."
    (src,) = model.source_ids([text])
    long_term = SourceTerm(0, 1, tuple(model.tokenizer.encode_target("a b c d e f g h i j k l m n o p")))
    (got,) = decode(model, DecodeBatch.from_sources(model, [src], [0], terms=[(long_term,)], max_lens=[5])).values()
    assert len(got.tokens) <= 4 and got.terms == []
