"""Where pass 1 puts a sentence's terms (service.engine.placement), without a model: the word
whose tokens attend most to the span, the run of a phrase, positions moved by the terms before
them, the fallback, the word-internal pieces of a vocabulary; and the passes' futures."""

from __future__ import annotations

import asyncio
import concurrent.futures

import numpy as np
import pytest

from service.batching.jobs import Sentence
from service.decoding.results import Finished
from service.decoding.resume import DecoderState
from service.decoding.terms import SourceTerm
from service.engine import placement
from service.errors import ResourceExhausted

# Output tokens: 10 "▁A", 11 "▁man", 12 "▁in", 13 "▁hat", 14 "den" (a piece), 15 ".", 16 "▁Man"
PIECES = np.zeros(20, dtype=bool)
PIECES[14] = True
LETTERS = np.ones(20, dtype=bool)
LETTERS[15] = False
WORDS = placement.TargetWords(PIECES, {11: (11, 16), 16: (11, 16)}, LETTERS)


def rows(*weights: list[float]) -> np.ndarray:
    """An alignment of one row per output token (and the </s> row, zeros) over 6 source tokens."""
    a = np.array([*weights, [0.0] * 6], dtype=np.float32)
    return a / np.maximum(a.sum(axis=1, keepdims=True), 1e-9)


def test_the_term_takes_the_last_word_of_the_run_that_attends_to_its_span():
    # source: 0 Ein, 1 Mann, 2 mit, 3 Hut, 4 ., 5 </s>; the article's row attends to "Mann" most of all
    att = rows([0.4, 0.5, 0, 0, 0, 0.1], [0, 0.45, 0.3, 0, 0, 0.25], [0, 0, 0.9, 0, 0, 0.1], [0, 0, 0, 1, 0, 0])
    (term,) = placement.positioned([SourceTerm(1, 2, (7, 8))], [10, 11, 12, 13], att, WORDS)
    assert (term.position, term.replaces) == (1, (11, 16))  # "man" (in both cases), not "A"


def test_a_word_of_several_pieces_is_replaced_whole_and_later_terms_move():
    # output: "▁A ▁hat den ▁in ▁man ." ; terms over source 3 (Hut) and 1 (Mann)
    att = rows(
        [1, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 0, 0],
        [0, 0, 0, 0.6, 0.4, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 1, 0],
    )
    hat, man = placement.positioned(
        [SourceTerm(3, 4, (7,)), SourceTerm(1, 2, (8, 9, 9))], [10, 13, 14, 12, 11, 15], att, WORDS
    )
    assert (hat.position, hat.replaces) == (1, (13,))  # "▁hat den" (two tokens) becomes one
    assert (man.position, man.replaces) == (3, (11, 16))  # 4 in pass 1, one token earlier after "hat"


def test_no_place_where_nothing_attends_to_the_span_or_a_run_reaches_a_cut():
    att = rows([1, 0, 0, 0, 0, 0], [0, 0.9, 0, 0, 0, 0.1], [0, 0, 1, 0, 0, 0])
    (unseen,) = placement.positioned([SourceTerm(3, 4, (7,))], [10, 11, 12], att, WORDS)
    assert unseen.position == -1
    (cut,) = placement.positioned([SourceTerm(2, 3, (7,))], [10, 11, 12], att, WORDS, cut=True)
    assert cut.position == -1
    (whole,) = placement.positioned([SourceTerm(2, 3, (7,))], [10, 11, 12], att, WORDS)
    assert whole.position == 2
    assert placement.positioned([SourceTerm(2, 3, (7,))], [], None, WORDS)[0].position == -1


def test_a_term_the_attention_does_not_place_goes_where_its_translation_alone_stands_once():
    att = rows([1, 0, 0, 0, 0, 0], [0, 0.9, 0, 0, 0, 0.1], [0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    tokens = [10, 16, 12, 13]  # "A Man in hat": nothing attends to source 4
    (named,) = placement.positioned([SourceTerm(4, 5, (7,))], tokens, att, WORDS, anchors=[(11, 16)])
    assert (named.position, named.replaces) == (1, (11, 16))
    (twice,) = placement.positioned([SourceTerm(4, 5, (7,))], [10, 11, 12, 16], att, WORDS, anchors=[(11, 16)])
    assert twice.position == -1  # the word stands twice: no place
    (none,) = placement.positioned([SourceTerm(4, 5, (7,))], tokens, att, WORDS, anchors=[()])
    assert none.position == -1


def test_the_anchor_is_the_first_token_of_the_last_word_with_a_letter_in_each_case():
    assert placement.anchor([10, 16, 15], WORDS) == (11, 16)  # "A Man ." -> man, Man
    assert placement.anchor([13, 14, 15], WORDS) == (13,)  # "hat den ." -> hat
    assert placement.anchor([15], WORDS) == ()


class Vocabulary:
    def __init__(self, entries: list[str | None]):
        self.entries = entries

    def id_to_token(self, i: int) -> str | None:
        return self.entries[i] if i < len(self.entries) else None


def test_target_words_are_the_pieces_that_continue_a_word_letters_and_the_cases_of_a_token():
    v = Vocabulary(["<pad>", "</s>", "▁dog", "Ġcat", "den", "7", ".", None, "é", "▁Dog", "▁DOG", "▁."])
    words = placement.target_words(v, 13)
    assert words.pieces.tolist() == [False] * 4 + [True, True, False, False, True] + [False] * 4
    assert words.letters.tolist() == [
        False,
        False,
        True,
        True,
        True,
        True,
        False,
        False,
        True,
        True,
        True,
        False,
        False,
    ]
    assert words.spellings(2) == words.spellings(10) == (2, 9, 10) and words.spellings(3) == (3,)


class Backend:
    """Queues nothing: it keeps what it is given, and answers as the test says."""

    def __init__(self) -> None:
        self.submitted: list[list[Sentence]] = []

    def submit(self, sentences: list[Sentence]) -> None:
        self.submitted.append(list(sentences))


def sentence(terms: tuple[SourceTerm, ...] = ()) -> Sentence:
    return Sentence(src_ids=[5, 6, 7, 2], beam=4, length_penalty=1.0, max_len=20, terms=terms)


def done(
    s: Sentence, tokens: list[int], alignment: np.ndarray | None = None, state: DecoderState | None = None
) -> None:
    s.future.set_result(Finished(s.key, tokens, None, None, alignment, len(tokens) + 1, state=state))


def state_of(tokens: list[int], layers: int = 2, heads: int = 2, d_k: int = 3) -> DecoderState:
    """A greedy row's decoder state after emitting `tokens` and </s> (3): one entry an input."""
    T = len(tokens) + 1
    ks = [np.full((heads, T, d_k), float(i), dtype=np.float32) for i in range(layers)]
    cross = [np.zeros((heads, 4, d_k), dtype=np.float32) for _ in range(layers)]
    return DecoderState([*tokens, 3], ks, ks, cross, cross)


def test_rows_with_terms_decode_twice_the_others_once():
    async def run() -> None:
        backend = Backend()
        plain, termed = sentence(), sentence((SourceTerm(1, 2, (7,)),))
        decoding = placement.Decoding(backend, [plain, termed], WORDS)
        (first,) = backend.submitted
        assert first[1] is plain and first[0] is not termed and first[0].terms == () and first[0].beam == 1
        assert first[0].want_alignment and first[0].max_len == 2 + placement.LOOKAHEAD and first[0].keep_state
        # The request arrives with pass 1 and is answered with pass 2: pass 1 is the engine's own.
        assert (first[0].arriving, first[0].answered) == (termed.beam, 0)
        task = asyncio.ensure_future(decoding.results())
        done(plain, [11])
        att = rows([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])
        done(first[0], [10, 11, 12], att, state_of([10, 11, 12]))
        while len(backend.submitted) < 2:
            await asyncio.sleep(0)
        assert backend.submitted[1] == [termed] and termed.terms[0].position == 1
        # Pass 2 goes on from pass 1's state: "A" forced, the term next, no encoder.
        assert termed.resume is not None and termed.resume.upto == 1 and termed.resume.tokens == [10]
        assert termed.resume.attention is not None and np.array_equal(termed.resume.attention, att[:1])
        assert (termed.arriving, termed.answered) == (0, termed.beam)
        done(termed, [10, 7, 12])
        got = await task
        assert [f.tokens for f in got] == [[11], [10, 7, 12]]
        assert got[1].state is None

    asyncio.run(run())


def test_a_term_the_attention_does_not_place_is_placed_by_its_span_alone_in_a_pass_between():
    async def run() -> None:
        backend = Backend()
        termed = sentence((SourceTerm(4, 5, (7,)),))
        termed.src_ids = [5, 6, 7, 8, 9, 2]
        decoding = placement.Decoding(backend, [termed], WORDS)
        task = asyncio.ensure_future(decoding.results())
        (first,) = backend.submitted[0]
        tokens = [10, 16, 12, 13]  # "A Man in hat": nothing attends to source 4
        att = rows([1, 0, 0, 0, 0, 0], [0, 0.9, 0, 0, 0, 0.1], [0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0])
        done(first, tokens, att, state_of(tokens))
        while len(backend.submitted) < 2:
            await asyncio.sleep(0)
        (alone,) = backend.submitted[1]  # the term's source span alone, greedy, without its terms
        assert (alone.src_ids, alone.beam, alone.terms, alone.keep_state) == ([9, 2], 1, (), False)
        assert (alone.arriving, alone.answered) == (0, 0)
        done(alone, [16, 15])  # "Man ."
        while len(backend.submitted) < 3:
            await asyncio.sleep(0)
        assert backend.submitted[2] == [termed] and termed.terms[0].position == 1
        assert termed.resume is not None and termed.resume.tokens == [10]
        done(termed, [10, 7, 12, 13])
        assert [f.tokens for f in await task] == [[10, 7, 12, 13]]

    asyncio.run(run())


def test_pass_2_starts_from_the_start_without_a_state_or_where_a_term_has_no_place():
    termed = sentence((SourceTerm(1, 2, (7,), position=1),))
    draft = Finished(0, [10, 11, 12], None, None, rows([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]), 4)
    assert placement.resumed(termed, draft) is None  # an engine process keeps no state
    draft.state = state_of([10, 11, 12])
    assert placement.resumed(termed, draft).upto == 1
    unplaced = sentence((SourceTerm(1, 2, (7,), position=1), SourceTerm(3, 4, (8,))))
    assert placement.resumed(unplaced, draft) is None  # the attention trigger may fire anywhere
    at_start = sentence((SourceTerm(1, 2, (7,), position=0),))
    assert placement.resumed(at_start, draft).upto == 0  # the encoder's results alone
    other = Finished(0, [10, 16, 12], None, None, draft.alignment, 4, state=draft.state)
    assert placement.resumed(sentence((SourceTerm(1, 2, (7,), position=2),)), other) is None  # not its tokens


def test_a_failed_first_pass_cancels_every_row():
    async def run() -> None:
        backend = Backend()
        plain, termed = sentence(), sentence((SourceTerm(1, 2, (7,)),))
        decoding = placement.Decoding(backend, [plain, termed], WORDS)
        first = backend.submitted[0][0]
        first.future.set_exception(RuntimeError("decoder failed"))
        with pytest.raises(RuntimeError):
            await decoding.results()
        await asyncio.sleep(0)
        assert plain.future.cancelled() and len(backend.submitted) == 1

    asyncio.run(run())


def test_again_is_a_new_sentence():
    s = sentence()
    t = s.again(beam=1)
    assert t.key != s.key and t.future is not s.future and isinstance(t.future, concurrent.futures.Future)
    assert (t.beam, t.src_ids) == (1, s.src_ids)


def test_a_worker_queues_pass_2_itself_and_pass_1_is_answered_with_it():
    """The worker that finished pass 1 runs its continuation (`Sentence.then`, as the scheduler
    does before settling a future): where every term has a place, pass 2 is queued from there and
    pass 1's future is settled only once pass 2 is done, so the event loop wakes once for both."""

    async def run() -> None:
        backend = Backend()
        termed = sentence((SourceTerm(1, 2, (7,)),))
        decoding = placement.Decoding(backend, [termed], WORDS)
        task = asyncio.ensure_future(decoding.results())
        (first,) = backend.submitted[0]
        att = rows([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])
        draft = Finished(first.key, [10, 11, 12], None, None, att, 4, state=state_of([10, 11, 12]))
        assert first.then is not None and first.then(draft) is True
        assert backend.submitted[1] == [termed] and termed.resume is not None and termed.resume.upto == 1
        await asyncio.sleep(0.01)
        assert not first.future.done() and not task.done()
        termed.future.set_result(Finished(termed.key, [10, 7, 12], None, None, None, 3))
        assert first.future.done()
        assert [f.tokens for f in await task] == [[10, 7, 12]]
        assert len(backend.submitted) == 2  # the event loop queued nothing more

    asyncio.run(run())


def test_a_row_whose_term_needs_its_span_alone_is_left_to_the_event_loop():
    backend = Backend()
    termed = sentence((SourceTerm(4, 5, (7,)),))
    termed.src_ids = [5, 6, 7, 8, 9, 2]
    decoding = placement.Decoding(backend, [termed], WORDS)
    (first,) = backend.submitted[0]
    att = rows([1, 0, 0, 0, 0, 0], [0, 0.9, 0, 0, 0, 0.1], [0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    draft = Finished(first.key, [10, 16, 12, 13], None, None, att, 5, state=state_of([10, 16, 12, 13]))
    assert first.then(draft) is False and len(backend.submitted) == 1 and not decoding.continued


def test_a_refused_pass_2_is_left_to_the_event_loop_unchanged():
    class Refusing(Backend):
        def submit(self, sentences: list[Sentence]) -> None:
            if self.submitted:
                raise ResourceExhausted("queue full")
            super().submit(sentences)

    backend = Refusing()
    termed = sentence((SourceTerm(1, 2, (7,)),))
    placement.Decoding(backend, [termed], WORDS)
    (first,) = backend.submitted[0]
    att = rows([0, 0, 1, 0, 0, 0], [0, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    draft = Finished(first.key, [10, 11, 12], None, None, att, 4, state=state_of([10, 11, 12]))
    assert first.then(draft) is False
    assert termed.resume is None and termed.terms[0].position == -1 and termed.arriving == termed.beam
    assert draft.state is not None  # the event loop's pass 2 may still go on from it


def test_a_model_whose_rows_mostly_need_their_spans_decodes_them_beside_pass_1():
    """`Anchoring`: after rows whose terms the attention left without a place, the spans go with
    pass 1, and a worker places the terms by them as soon as they are there."""
    anchoring = placement.Anchoring()
    for _ in range(30):
        anchoring.record(True)
    assert anchoring.eager
    backend = Backend()
    termed = sentence((SourceTerm(4, 5, (7,)),))
    termed.src_ids = [5, 6, 7, 8, 9, 2]
    decoding = placement.Decoding(backend, [termed], WORDS, anchoring=anchoring)
    first, alone = backend.submitted[0]
    assert alone.src_ids == [9, 2] and alone.terms == ()
    tokens = [10, 16, 12, 13]
    att = rows([1, 0, 0, 0, 0, 0], [0, 0.9, 0, 0, 0, 0.1], [0, 0, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0])
    draft = Finished(first.key, tokens, None, None, att, 5, state=state_of(tokens))
    assert first.then(draft) is False  # its span alone is not decoded yet: the event loop waits for it
    done(alone, [16, 15])
    again = placement.Decoding(backend, [sentence((SourceTerm(4, 5, (7,)),))], WORDS, anchoring=anchoring)
    again.sentences[0].src_ids = [5, 6, 7, 8, 9, 2]
    first, alone = backend.submitted[-1]
    done(alone, [16, 15])
    draft = Finished(first.key, tokens, None, None, att, 5, state=state_of(tokens))
    assert first.then(draft) is True and again.sentences[0].terms[0].position == 1
    assert decoding.judged == {0} and again.judged == {0}
    for _ in range(60):
        anchoring.record(False)
    assert not anchoring.eager


def test_a_request_of_many_rows_with_terms_keeps_no_states():
    """A state holds a row's keys and values until pass 2 joins a batch: past MAX_RESUMED_ROWS
    rows with terms a request decodes pass 2 from the start."""
    for n, kept in ((placement.MAX_RESUMED_ROWS, True), (placement.MAX_RESUMED_ROWS + 1, False)):
        backend = Backend()
        placement.Decoding(backend, [sentence((SourceTerm(1, 2, (7,)),)) for _ in range(n)], WORDS)
        assert all(first.keep_state is kept for first in backend.submitted[0])
