"""Glossary terms forced by the search (service.decoding.terms): the rules on arrays without a
model, then through the tiny model's fused steps, greedy and beam."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding import terms as terms_module
from service.decoding.batch import DecodeBatch
from service.decoding.results import Finished
from service.decoding.terms import SourceTerm, TermState, advance, decide, landed
from service.runtime.onnx_model import OnnxSeq2Seq

EOS = 2


def test_a_row_starts_the_term_its_attention_is_on_and_is_given_its_tokens():
    terms = [(SourceTerm(3, 5, (40, 41)), SourceTerm(7, 8, (50,)))]
    s = TermState.new(1)
    att = np.zeros((1, 10))
    att[0, 4] = 1.0  # on the first term's span
    step, s = decide(terms, s, att, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [40] and s.at.tolist() == [0] and step.no_eos.tolist() == [True]
    s = advance(terms, s, step.forced)
    assert (s.at.tolist(), s.pos.tolist(), s.placed.tolist()) == ([0], [1], [0])
    step, s = decide(terms, s, np.zeros((1, 10)), np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [41]
    s = advance(terms, s, step.forced)
    assert (s.at.tolist(), s.pos.tolist(), s.placed.tolist()) == ([-1], [0], [1])  # placed: free again


def test_after_a_term_the_row_may_not_write_the_token_it_wanted_where_the_term_started():
    terms = [(SourceTerm(3, 4, (40,)),)]
    att = np.zeros((1, 10))
    att[0, 3] = 1.0
    s = TermState.new(1)
    step, s = decide(terms, s, att, np.array([9]), np.array([True]), np.array([50]), EOS)  # wants 9 there
    assert step.forced.tolist() == [40] and step.banned == [()]
    s = advance(terms, s, step.forced)
    banned = []
    for _ in range(terms_module.BAN_STEPS + 1):
        step, s = decide(terms, s, np.zeros((1, 10)), np.array([9]), np.array([True]), np.array([50]), EOS)
        banned += step.banned
        s = advance(terms, s, step.forced)
    assert banned == [(9,)] * terms_module.BAN_STEPS + [()]


def test_no_ban_where_the_row_wanted_the_terms_own_token_or_to_end():
    terms = [(SourceTerm(3, 4, (40,)),)]
    att = np.zeros((1, 10))
    att[0, 3] = 1.0
    for wanted in (40, EOS):
        step, s = decide(terms, TermState.new(1), att, np.array([wanted]), np.array([True]), np.array([50]), EOS)
        s = advance(terms, s, step.forced)
        step, s = decide(terms, s, np.zeros((1, 10)), np.array([9]), np.array([True]), np.array([50]), EOS)
        assert step.banned == [()]


def test_a_term_with_a_position_starts_there_whatever_the_attention():
    terms = [(SourceTerm(3, 4, (40, 41), position=2, replaces=(9, 19)),)]
    on_span = np.zeros((1, 10))
    on_span[0, 3] = 1.0
    s = TermState.new(1)
    for here in (0, 1):  # the attention is on the span, the position not reached
        step, s = decide(terms, s, on_span, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([here]))
        assert step.forced.tolist() == [-1] and step.no_eos.tolist() == [True]
        s = advance(terms, s, step.forced)
    off_span = np.zeros((1, 10))
    off_span[0, 8] = 1.0
    step, s = decide(terms, s, off_span, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([2]))
    assert step.forced.tolist() == [40] and s.ban.tolist() == [0]  # the term's replaced tokens, not the row's best (7)
    s = advance(terms, s, step.forced)
    step, s = decide(terms, s, off_span, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([3]))
    assert step.forced.tolist() == [41]
    s = advance(terms, s, step.forced)
    step, s = decide(terms, s, off_span, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([4]))
    assert step.glued.tolist() == [True] and step.banned == [(9, 19)] and step.no_eos.tolist() == [False]
    s = advance(terms, s, step.forced)
    step, s = decide(terms, s, off_span, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([5]))
    assert step.glued.tolist() == [False]  # only the step right after the term


def test_a_row_past_a_terms_position_starts_it_at_once_and_positions_go_in_order():
    terms = [(SourceTerm(5, 6, (50,), position=4), SourceTerm(1, 2, (40,), position=1))]
    att = np.zeros((1, 10))
    step, s = decide(terms, placed(0), att, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([6]))
    assert step.forced.tolist() == [40] and s.at.tolist() == [1]  # the earlier position first
    step, s = decide(terms, placed(2), att, np.array([7]), np.array([True]), np.array([50]), EOS, np.array([6]))
    assert step.forced.tolist() == [50] and s.at.tolist() == [0]


def placed(bits: int) -> TermState:
    """One row's state: the terms of `bits` placed, none under way."""
    s = TermState.new(1)
    s.placed[0] = bits
    return s


def test_a_row_about_to_end_places_its_missing_term_first():
    terms = [(SourceTerm(3, 5, (40,)), SourceTerm(7, 8, (50,)))]
    att = np.zeros((1, 10))
    att[0, 0] = 1.0  # on no term
    step, state = decide(terms, placed(1), att, np.array([EOS]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [50] and state.at.tolist() == [1]
    step, _ = decide(terms, placed(1), att, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [-1] and step.no_eos.tolist() == [True]  # it may not end yet
    step, _ = decide(terms, placed(3), att, np.array([EOS]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [-1] and step.no_eos.tolist() == [False]  # all placed
    step, _ = decide(terms, placed(1), att, np.array([9]), np.array([True]), np.array([1]), EOS)
    assert step.forced.tolist() == [50]  # only just room for it before the length limit


def test_attention_shared_with_a_word_outside_the_span_starts_no_term():
    terms = [(SourceTerm(1, 2, (40,)),)]
    shared = np.array([[0.45, 0.5, 0.05, 0.0]])  # an article: on itself and the noun alike
    step, s = decide(terms, placed(0), shared, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [-1] and s.at.tolist() == [-1]
    on_it = np.array([[0.05, 0.9, 0.05, 0.0]])
    step, s = decide(terms, placed(0), on_it, np.array([9]), np.array([True]), np.array([50]), EOS)
    assert step.forced.tolist() == [40] and s.at.tolist() == [0]


def test_rows_without_terms_or_done_are_left_alone():
    terms = [(), (SourceTerm(0, 1, (40,)),)]
    att = np.ones((2, 4))
    step, s = decide(
        terms,
        TermState.new(2),
        att,
        np.array([EOS, EOS]),
        np.array([True, False]),
        np.array([50, 50]),
        EOS,
    )
    assert step.forced.tolist() == [-1, -1] and step.no_eos.tolist() == [False, False] and s.at.tolist() == [-1, -1]


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


@pytest.mark.parametrize("beam", [1, 4])
def test_a_term_with_a_position_starts_at_it_and_the_piece_after_it_is_passed_over(model, test_split, beam):
    """The position trigger through the tiny model's steps: the term's target starts at its
    output position (greedy: after the plain output's tokens), or earlier where a beam is about to
    write the replaced token before it; and where the token the row writes right after the term
    is made a word-internal piece (`pieces`), it writes another there."""
    de, _ = test_split
    texts = [t for t in de if " Hund " in t][:3]
    src = model.source_ids(texts)
    keys = list(range(len(texts)))
    plain = decode(model, DecodeBatch.from_sources(model, src, keys, beam=beam))
    terms = []
    for i, t in enumerate(texts):
        base = term_for(model, t, "Hund", "wolfhound")
        terms.append((SourceTerm(base.start, base.end, base.target, position=2, replaces=(plain[i].tokens[2],)),))
    got = decode(model, DecodeBatch.from_sources(model, src, keys, beam=beam, terms=terms))
    after = []
    for i, (term,) in enumerate(terms):
        ((_, s, e),) = got[i].terms
        assert (s == 2 if beam == 1 else s <= 2) and tuple(got[i].tokens[s:e]) == term.target
        if beam == 1:
            assert got[i].tokens[:s] == plain[i].tokens[:s]
        after.append(got[i].tokens[e] if e < len(got[i].tokens) else model.eos_id)
    assert any(a != model.eos_id for a in after)
    pieces = np.zeros(model.vocab_size, dtype=bool)
    pieces[[a for a in after if a != model.eos_id]] = True
    again = decode(model, DecodeBatch.from_sources(model, src, keys, beam=beam, terms=terms, pieces=[pieces] * 3))
    for i in range(len(terms)):
        ((_, s, e),) = again[i].terms
        assert (s == 2 if beam == 1 else s <= 2) and (e == len(again[i].tokens) or not pieces[again[i].tokens[e]])


def test_a_term_cut_by_the_length_limit_is_not_reported(model):
    text = "Ein Hund."
    (src,) = model.source_ids([text])
    long_term = SourceTerm(0, 1, tuple(model.tokenizer.encode_target("a b c d e f g h i j k l m n o p")))
    (got,) = decode(model, DecodeBatch.from_sources(model, [src], [0], terms=[(long_term,)], max_lens=[5])).values()
    assert len(got.tokens) <= 4 and got.terms == []


def test_a_positioned_term_also_starts_where_the_row_would_write_the_token_it_replaces():
    from service.decoding.terms import _start

    att = np.array([0.9, 0.05, 0.05])
    terms = [
        SourceTerm(1, 2, (7, 8), position=5, replaces=(42, 52)),
        SourceTerm(2, 3, (9,), position=8, replaces=(43,)),
    ]
    assert _start(terms, 0, att, ending=False, here=1, best=3) == -1  # before its place, another token
    assert _start(terms, 0, att, ending=False, here=1, best=42) == 0  # the model's own word for it, early
    assert _start(terms, 0, att, ending=False, here=1, best=52) == 0  # in another case ("Boy" for "boy")
    assert _start(terms, 0, att, ending=False, here=5, best=3) == 0  # its place
    assert _start(terms, 1, att, ending=False, here=2, best=43) == 1  # the second, once the first is placed
    assert _start(terms, 1, att, ending=False, here=2, best=42) == -1  # a placed term's token starts nothing


def test_beams_keep_a_terms_replaced_tokens_out_before_it_greedy_rows_start_it_there():
    terms = [(SourceTerm(3, 4, (40,), position=3, replaces=(9, 19, 40)),)] * 2
    att = np.zeros((2, 10))
    live, room, here = np.array([True, True]), np.array([50, 50]), np.array([1, 1])
    step, _ = decide(terms, TermState.new(2), att, np.array([7, 7]), live, room, EOS, here, ahead=True)
    assert step.forced.tolist() == [-1, -1] and step.banned == [(9, 19), (9, 19)]  # not the term's own token
    step, _ = decide(terms, TermState.new(2), att, np.array([7, 7]), live, room, EOS, here)
    assert step.banned == [(), ()]  # greedy: its best starts the term, its others may be anything
    step, s = decide(terms, TermState.new(2), att, np.array([19, 7]), live, room, EOS, here, ahead=True)
    assert step.forced.tolist() == [40, -1] and s.ban.tolist() == [0, -1]


def test_a_sentence_whose_live_beams_have_no_candidate_left_keeps_them(model, test_split):
    """After a term, every candidate of every live beam is a banned token or a word-internal
    piece (all the vocabulary but one token is made a piece, and that one is the banned one): the
    sentence keeps its candidates instead of ending with nothing (it came back empty)."""
    de, _ = test_split
    text = next(t for t in de if " Hund " in t)
    (src,) = model.source_ids([text])
    (plain,) = decode(model, DecodeBatch.from_sources(model, [src], [0], beam=4)).values()
    base = term_for(model, text, "Hund", "wolfhound")
    left = plain.tokens[1]  # the one token that is not a piece, banned after the term
    term = SourceTerm(base.start, base.end, base.target, position=0, replaces=(left,))
    pieces = np.ones(model.vocab_size, dtype=bool)
    pieces[left] = False
    (got,) = decode(
        model, DecodeBatch.from_sources(model, [src], [0], beam=4, terms=[(term,)], pieces=[pieces])
    ).values()
    ((_, s, e),) = got.terms
    assert (s, tuple(got.tokens[s:e])) == (0, term.target) and len(got.tokens) > e


@pytest.mark.parametrize("n_texts", [1, 3])  # a lone sentence's step and a batch's
def test_a_step_after_a_term_ranks_a_few_candidates_first_and_all_where_they_may_not_do(
    model, test_split, monkeypatch, n_texts
):
    """Right after a term a beam step ranks GLUE_BEAM_TRY more candidates, and again with
    GLUE_BEAM_EXTRA more where a sentence's best allowed ones may lie past a row's ranked ones:
    the translations are those of ranking them all at once, whether the step had enough (random
    pieces leave most) or not (none more at first, every piece banned: it ranks again)."""
    import service.decoding.term_rows as terms_module

    de, _ = test_split
    texts = [t for t in de if " Hund " in t][:n_texts]
    src, keys = model.source_ids(texts), list(range(n_texts))
    terms = [(term_for(model, t, "Hund", "wolfhound"),) for t in texts]
    rng, first_try = np.random.default_rng(0), terms_module.GLUE_BEAM_TRY
    short = terms_module.TermRows._short_of_candidates
    again: list[int] = []

    def counted(self, *a):
        k = short(self, *a)
        again.append(k)
        return k

    def run(try_more: int, pieces: np.ndarray) -> list:
        monkeypatch.setattr(terms_module, "GLUE_BEAM_TRY", try_more)
        batch = DecodeBatch.from_sources(model, src, keys, beam=4, terms=terms, pieces=[pieces] * n_texts)
        return [(f.tokens, f.score) for _, f in sorted(decode(model, batch).items())]

    for share in (0.05, 0.6):  # the word-internal pieces: a few, then most of the vocabulary
        pieces = rng.random(model.vocab_size) < share
        again.clear()
        whole = run(terms_module.GLUE_BEAM_EXTRA, pieces)  # all 72 at once
        monkeypatch.setattr(terms_module.TermRows, "_short_of_candidates", counted)
        assert run(first_try, pieces) == whole
        assert run(0, pieces) == whole  # 8 a row at first, no more than the beams' 2K: ranked again
        assert any(again)
        monkeypatch.setattr(terms_module.TermRows, "_short_of_candidates", short)


def test_a_step_that_would_rank_again_past_the_vocabulary_ranks_it_once_and_goes_on(model, test_split, monkeypatch):
    """Where the candidates a step after a term runs again with exceed the vocabulary, it runs
    again with the whole vocabulary, once, and the search is the one of ranking it all at once."""
    import threading

    import service.decoding.term_rows as terms_module

    de, _ = test_split
    texts = [t for t in de if " Hund " in t][:2]
    src, keys = model.source_ids(texts), [0, 1]
    terms = [(term_for(model, t, "Hund", "wolfhound"),) for t in texts]
    pieces = np.random.default_rng(1).random(model.vocab_size) < 0.6
    monkeypatch.setattr(terms_module, "GLUE_BEAM_EXTRA", model.vocab_size + 50)

    def run(first_try: int, out: list) -> None:
        monkeypatch.setattr(terms_module, "GLUE_BEAM_TRY", first_try)
        batch = DecodeBatch.from_sources(model, src, keys, beam=4, terms=terms, pieces=[pieces] * 2)
        out.append([(f.tokens, f.score) for _, f in sorted(decode(model, batch).items())])

    whole: list = []
    run(model.vocab_size, whole)  # the whole vocabulary at once
    again: list = []
    thread = threading.Thread(target=run, args=(0, again), daemon=True)
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "the step kept ranking again"
    assert again == whole
