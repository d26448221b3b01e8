"""The numpy generator over the ONNX graphs: token-for-token parity with the PyTorch reference
(export/generate.py), and continuous-batching surgery (filter / concatenate mid-decode). Every test
runs on both decoder steps: the fused graph (in-place cache, beams through cache_indirection) and
the portable one."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from service.decoding.batch import DecodeBatch
from service.decoding.cache import RowCache
from service.decoding.concat_cache import ConcatCache
from service.decoding.encoder import encode_sources, encoder_chunks
from service.decoding.generator import generate
from service.decoding.in_place_cache import InPlaceCache
from service.decoding.layout import Layout, layouts
from service.decoding.output_rules import max_output_len
from service.decoding.results import Finished, walk
from service.decoding.rows import fill_order, row_moves

N_SENTENCES = 40


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["fused", "portable"])
def tiny_onnx(request, tiny_onnx_dir):
    """The tiny fp32 export with each decoder step (this module's tests run on both)."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph=request.param)


@pytest.fixture(scope="module")
def sources(tiny_onnx, test_split):
    de, _ = test_split
    return tiny_onnx.source_ids(de[:N_SENTENCES])


def reference(tiny_model, src, beam, batch_size=16, **kw):
    from export.generate import beam_search

    out = []
    for i in range(0, len(src), batch_size):
        out += beam_search(tiny_model, src[i : i + batch_size], beam=beam, **kw)
    return out


@pytest.mark.parametrize("beam", [1, 4])
def test_onnx_generator_equals_the_pytorch_reference(tiny_onnx, tiny_model, sources, beam):
    ref = reference(tiny_model, sources, beam)
    got = generate(tiny_onnx, sources, beam=beam, batch_size=16)
    assert [h.tokens for h in got] == [h.tokens for h in ref]
    for g, r in zip(got, ref):
        assert g.score == pytest.approx(r.score, abs=1e-3)
        assert g.log_prob == pytest.approx(r.log_prob, abs=1e-3)


@pytest.mark.parametrize("beam,lp,a,b", [(3, 0.0, 1.5, 10), (2, 2.0, 1.0, 2), (1, 1.0, 0.0, 3), (5, 1.0, 0.5, 1)])
def test_length_rule_and_penalties_match_the_reference(tiny_onnx, tiny_model, sources, beam, lp, a, b):
    src = sources[:12]
    ref = reference(tiny_model, src, beam, length_penalty=lp, a=a, b=b)
    got = generate(tiny_onnx, src, beam=beam, length_penalty=lp, max_len_a=a, max_len_b=b, batch_size=5)
    assert [h.tokens for h in got] == [h.tokens for h in ref]
    for s, h in zip(src, got):
        assert len(h.tokens) + 1 <= max_output_len(len(s), a, b, tiny_onnx.max_positions)


def test_beam_1_is_greedy_and_results_do_not_depend_on_batching(tiny_onnx, sources):
    one_by_one = [generate(tiny_onnx, [s], beam=1)[0].tokens for s in sources[:10]]
    assert [h.tokens for h in generate(tiny_onnx, sources[:10], beam=1, batch_size=64)] == one_by_one
    beams = [generate(tiny_onnx, [s], beam=3)[0].tokens for s in sources[:10]]
    assert [h.tokens for h in generate(tiny_onnx, sources[:10], beam=3, batch_size=4)] == beams


def test_encoder_chunks_sorted_by_length_give_the_one_pass_result(tiny_onnx, sources):
    src = sources[:13]  # mixed lengths, not a multiple of the chunk
    lens, mask, ck, cv = encode_sources(tiny_onnx, src, chunk=len(src), pad_tokens=10**9)  # one pass
    c_lens, c_mask, c_ck, c_cv = encode_sources(tiny_onnx, src, chunk=3, pad_tokens=2)
    assert c_lens.tolist() == lens.tolist() == [len(s) for s in src]
    np.testing.assert_array_equal(c_mask, mask)
    for one, chunked in zip(ck + cv, c_ck + c_cv):
        assert chunked.shape == one.shape == (len(src), tiny_onnx.n_heads, max(lens), tiny_onnx.d_k)
        for r, n in enumerate(lens):
            np.testing.assert_allclose(chunked[r, :, :n], one[r, :, :n], atol=1e-5)  # the rest: src_mask 0
    many = generate(tiny_onnx, src, beam=2, batch_size=13)  # from_sources encodes in chunks
    assert [h.tokens for h in many] == [generate(tiny_onnx, [s], beam=2)[0].tokens for s in src]


def test_encoder_chunks_cut_where_padding_would_cost_more_than_a_call():
    lens = np.array([9, 3, 3, 4, 20, 3, 4, 21, 9])
    chunks = encoder_chunks(lens, chunk=4, pad_tokens=3)
    assert sorted(np.concatenate(chunks).tolist()) == list(range(len(lens)))  # every row once
    got = [lens[c].tolist() for c in chunks]
    # 3,3,3,4 adds 3 padding tokens; the fourth row closes it (chunk=4); 9 after 4,4 would add 10
    assert got == [[3, 3, 3, 4], [4], [9, 9], [20, 21]]
    for c in chunks:
        assert len(c) <= 4 and len(c) * lens[c].max() - lens[c].sum() <= 3
    assert [len(c) for c in encoder_chunks(np.full(40, 7), chunk=32)] == [32, 8]  # no padding: up to `chunk`


def run_to_end(model, batch: DecodeBatch, results: dict) -> None:
    while len(batch):
        for f in batch.step(model):
            results[f.key] = f
        batch.filter(batch.active_keys())


@pytest.mark.parametrize("beam", [1, 3])
def test_filter_and_concatenate_mid_decode_equal_separate_decoding(tiny_onnx, sources, beam):
    want = dict(enumerate(generate(tiny_onnx, sources[:12], beam=beam, want_alignment=True)))
    results: dict[int, Finished] = {}
    a = DecodeBatch.from_sources(tiny_onnx, sources[:5], list(range(5)), beam=beam, want_alignment=True)
    for _ in range(3):
        for f in a.step(tiny_onnx):
            results[f.key] = f
    a.filter([k for k in a.active_keys() if k != 2])  # sentence 2 is cancelled
    b = DecodeBatch.from_sources(tiny_onnx, sources[5:9], [5, 6, 7, 8], beam=beam, want_alignment=True)
    for f in b.step(tiny_onnx):  # one step ahead on its own
        results[f.key] = f
    b.filter(b.active_keys())
    batch = DecodeBatch.concatenate([a, b])
    assert batch.past_len == max(a.past_len, b.past_len) and batch.src_len == max(a.src_len, b.src_len)
    for _ in range(2):
        for f in batch.step(tiny_onnx):
            results[f.key] = f
        batch.filter(batch.active_keys())
    c = DecodeBatch.from_sources(tiny_onnx, sources[9:12], [9, 10, 11], beam=beam, want_alignment=True)
    batch = DecodeBatch.concatenate([batch, c])
    run_to_end(tiny_onnx, batch, results)
    assert 2 not in results or results[2].steps <= 3
    for k in [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11]:
        assert results[k].tokens == want[k].tokens, k
        assert results[k].score == pytest.approx(want[k].score, abs=1e-4)
        np.testing.assert_allclose(results[k].alignment, want[k].alignment, atol=1e-4)


@pytest.mark.parametrize("beam", [1, 3])
def test_finished_rows_may_ride_along_unfiltered_to_the_end_of_the_position_table(tiny_onnx, sources, beam):
    """The scheduler filters in bulk: rows of finished sentences keep being stepped. They must not
    walk off the position table, nor change anyone's result."""
    longest = tiny_onnx.max_positions - 1
    src = sources[:4]
    want = generate(tiny_onnx, src, beam=beam)
    batch = DecodeBatch.from_sources(tiny_onnx, src, [0, 1, 2, 3], beam=beam, max_lens=[1, 2, 3, longest])
    # sentence 3 may run to the last position; 0..2 finish at once and are never filtered out
    results: dict[int, Finished] = {}
    steps = 0
    while batch.active_keys():
        for f in batch.step(tiny_onnx):
            results[f.key] = f
        steps += 1
        assert int(batch.positions.max()) <= longest
        # a finished sentence's rows stay at its last position (< its max_len)
        pos = batch.positions.reshape(-1, beam)
        assert all((pos[i] < batch.max_len[i]).all() for i in np.flatnonzero(batch.done))
    assert sorted(results) == [0, 1, 2, 3] and steps <= longest
    assert [len(results[k].tokens) for k in range(3)] <= [0, 1, 2]
    alone = DecodeBatch.from_sources(tiny_onnx, src[3:], [3], beam=beam, max_lens=[longest])
    run_to_end(tiny_onnx, alone, (solo := {}))
    assert results[3].tokens == solo[3].tokens
    assert results[3].score == pytest.approx(solo[3].score, abs=1e-4)
    if longest >= max_output_len(len(src[3]), 1.5, 10, tiny_onnx.max_positions):
        assert solo[3].tokens == want[3].tokens


@pytest.mark.parametrize("beam", [1, 4])
def test_alignment_rows_cover_each_token_and_the_final_eos(tiny_onnx, sources, beam):
    hyps = generate(tiny_onnx, sources[:6], beam=beam, want_alignment=True)
    for s, h in zip(sources[:6], hyps):
        assert h.alignment.shape == (len(h.tokens) + 1, len(s)) and h.alignment.dtype == np.float32
        np.testing.assert_allclose(h.alignment.sum(axis=1), 1.0, atol=1e-4)
    assert all(h.alignment is None for h in generate(tiny_onnx, sources[:2], beam=beam))


def test_batch_bookkeeping(tiny_onnx, sources):
    batch = DecodeBatch.from_sources(tiny_onnx, sources[:3], ["a", "b", "c"], beam=2)
    assert len(batch) == 6 and batch.n_sentences == 3 and batch.live_rows == 6 and batch.past_len == 0
    assert batch.src_len == max(len(s) for s in sources[:3])
    assert 0.0 <= batch.padding_ratio < 1.0
    batch.step(tiny_onnx)
    assert batch.past_len == 1 and batch.last_tokens() == {}  # beam search streams nothing
    batch.filter(["c", "a", "zzz"])
    assert batch.keys == ["a", "c"] and len(batch) == 4
    assert batch.src_len == max(len(sources[0]), len(sources[2]))
    greedy = DecodeBatch.from_sources(tiny_onnx, sources[:2], [0, 1])
    greedy.step(tiny_onnx)
    assert set(greedy.last_tokens()) == {0, 1}
    with pytest.raises(ValueError, match="beam"):
        DecodeBatch.concatenate([batch, greedy])
    with pytest.raises(ValueError, match="unique"):
        DecodeBatch.from_sources(tiny_onnx, sources[:2], [0, 0])
    empty = DecodeBatch.from_sources(tiny_onnx, [], [], beam=2)
    assert len(empty) == 0 and empty.step(tiny_onnx) == []


def test_max_lens_override_and_forced_eos(tiny_onnx, sources):
    batch = DecodeBatch.from_sources(tiny_onnx, sources[:4], [0, 1, 2, 3], beam=2, max_lens=[1, 2, 3, 1000])
    results: dict = {}
    run_to_end(tiny_onnx, batch, results)
    assert len(results[0].tokens) == 0 and results[0].steps == 1
    assert len(results[1].tokens) <= 1 and len(results[2].tokens) <= 2
    assert len(results[3].tokens) < tiny_onnx.max_positions - 1


def test_filter_drops_cache_entries_and_source_columns_no_row_uses(tiny_onnx, sources):
    want = generate(tiny_onnx, [sources[2]], beam=2)[0]
    a = DecodeBatch.from_sources(tiny_onnx, [sources[0], sources[1]], [0, 1], beam=2)
    for _ in range(4):
        a.step(tiny_onnx)
    b = DecodeBatch.from_sources(tiny_onnx, [sources[2]], [2], beam=2)
    b.step(tiny_onnx)
    batch = DecodeBatch.concatenate([a, b])
    assert batch.past_len == 4 and batch.cache.entries()[2][4:].sum() == 2  # b's rows: 1 real entry, 3 padding
    batch.filter([2])
    assert batch.past_len == 1 and batch.src_len == len(sources[2]) and batch.cache.entries()[2].all()
    results: dict = {}
    run_to_end(tiny_onnx, batch, results)
    assert results[2].tokens == want.tokens and results[2].score == pytest.approx(want.score, abs=1e-4)


def test_one_sentence_at_a_time_equals_the_reference(tiny_onnx, tiny_model, sources):
    """A batch of one sentence takes the list-based beam step (`_beam_one`), as a lone request does."""
    src = sources[:12]
    ref = reference(tiny_model, src, 4)
    got = generate(tiny_onnx, src, beam=4, batch_size=1)
    assert [h.tokens for h in got] == [h.tokens for h in ref]
    np.testing.assert_allclose([h.score for h in got], [h.score for h in ref], atol=1e-4)


@pytest.mark.parametrize("a,b", [(1.5, 10), (0.0, 3)])  # the second forces </s> at the third step
@pytest.mark.parametrize("beam,want_scores", [(1, True), (1, False), (3, True)])
def test_a_lone_sentence_steps_as_a_batched_one(tiny_onnx, sources, a, b, beam, want_scores):
    """A batch of one sentence takes the scalar step (`DecodeBatch._lone_step`), as a lone
    request does: the tokens, scores, alignment, step counts and streamed tokens of the batched step."""
    src = sources[:10]
    kw = {"beam": beam, "max_len_a": a, "max_len_b": b, "want_alignment": True, "want_scores": want_scores}
    batched = DecodeBatch.from_sources(tiny_onnx, src, list(range(len(src))), **kw)
    want: dict = {}
    streamed: dict = {k: [] for k in range(len(src))}
    while batched.active_keys():  # finished rows ride along: no filter
        want |= {f.key: f for f in batched.step(tiny_onnx)}
        for k, t in batched.last_tokens().items():
            streamed[k] += t
    for k, s in enumerate(src):
        lone = DecodeBatch.from_sources(tiny_onnx, [s], [k], **kw)
        got: list[Finished] = []
        tokens: list[int] = []
        while not got:
            got = lone.step(tiny_onnx)
            tokens += lone.last_tokens().get(k, [])
        w = want[k]
        assert (got[0].tokens, got[0].steps, tokens) == (w.tokens, w.steps, streamed[k])
        assert lone.done.tolist() == [True] and lone.positions.tolist() == [w.steps - 1] * beam
        if want_scores:
            # the kernels' sums over rows of other batch sizes may round differently
            assert got[0].score == pytest.approx(w.score, abs=1e-4)
            assert got[0].log_prob == pytest.approx(w.log_prob, abs=1e-4)
        else:
            assert got[0].score is None and w.score is None
        np.testing.assert_allclose(got[0].alignment, w.alignment, atol=1e-5)
        if beam == 1:
            assert tokens[-1] == lone.eos_id and got[0].log_prob == got[0].score


def _one_sentence_state(K: int, S: int, want_alignment: bool, rng) -> DecodeBatch:
    b = DecodeBatch(K, eos_id=2, pad_id=0)
    b.keys = ["s"]
    b.max_len = np.array([30])
    b.length_penalty = np.array([float(rng.choice([0.0, 0.6, 1.0]))])
    b.want_alignment = np.array([want_alignment])
    b.src_lens = np.array([S])
    b.done = np.zeros(1, dtype=bool)
    b.steps = np.zeros(1, dtype=np.int64)
    b.finished = [[]]
    b.target_prefix, b.prefix_len, b.eos_from = [[]], np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64)
    b.output_from, b.num_hypotheses = np.zeros(1, dtype=np.int64), np.ones(1, dtype=np.int64)
    b.terms, b.with_terms = [()], np.zeros(1, dtype=bool)
    b.hist = [None] * K
    b.scores = np.array([0.0] + [float("-inf")] * (K - 1), dtype=np.float32)
    b.tokens = np.full(K, 1, dtype=np.int64)
    return b


@pytest.mark.parametrize("K", [2, 4])
@pytest.mark.parametrize("want_alignment", [False, True])
def test_the_one_sentence_beam_step_selects_as_the_batched_one(K, want_alignment):
    """`_beam_one` against `_beam` on the same states, step by step to the end, with many ties,
    </s> candidates at every rank, -inf candidates and forced last steps."""
    import copy

    rng = np.random.default_rng(K + 10 * want_alignment)
    k_row, S = 2 * K, 5
    levels = np.array([-0.5, -1.0, -1.0, -2.0, -3.5, float("-inf")], dtype=np.float32)
    for _ in range(60):
        a = _one_sentence_state(K, S, want_alignment, rng)
        b = copy.deepcopy(a)
        for step in range(12):
            top_lp = -np.sort(-rng.choice(levels, size=(K, k_row)), axis=1)  # each row's best first
            top_ids = np.stack([rng.choice(np.arange(2, 2 + 3 * k_row), size=k_row, replace=False) for _ in range(K)])
            att = rng.random((K, S), dtype=np.float32)
            force = np.full(K, step == 11 or rng.random() < 0.05)
            fa, rows_a = a._beam(top_lp, top_ids, att, force)
            fb, rows_b = b._beam_one(top_lp, top_ids, att, force)
            assert rows_a.tolist() == rows_b.tolist()
            assert a.scores.dtype == b.scores.dtype and a.tokens.dtype == b.tokens.dtype
            np.testing.assert_array_equal(a.scores, b.scores)
            np.testing.assert_array_equal(a.tokens, b.tokens)
            assert a.done.tolist() == b.done.tolist()
            assert [(f.key, f.tokens, f.score, f.log_prob, f.steps) for f in fa] == [
                (f.key, f.tokens, f.score, f.log_prob, f.steps) for f in fb
            ]
            for x, y in zip(fa, fb):
                assert (x.alignment is None) == (y.alignment is None)
                if x.alignment is not None:
                    np.testing.assert_array_equal(x.alignment, y.alignment)
            assert [[(h[0], h[1], walk(h[2])[0]) for h in f] for f in a.finished] == [
                [(h[0], h[1], walk(h[2])[0]) for h in f] for f in b.finished
            ]
            assert [h and walk(h)[0] for h in a.hist] == [h and walk(h)[0] for h in b.hist]
            if a.done[0]:
                break
            a.steps += 1
            b.steps += 1


def assert_fields_fit(batch: DecodeBatch, n_layers: int) -> None:
    """Every declared per-sentence and per-row field has one entry per sentence or row, and every
    padded axis runs to the batch's longest source or output (greedy: its longest `max_len`,
    beams: none); the cache has every row, `past_len` entries each."""
    n, R = batch.n_sentences, len(batch)
    longest = {"source": batch.src_len, "output": int(batch.max_len.max()) if batch.beam == 1 and n else 0}
    for name, layout in layouts(type(batch)):
        if layout.axis == "batch":
            continue
        value = getattr(batch, name)
        want = n if layout.axis == "sentence" else R
        if isinstance(value, dict):
            assert set(value) <= set(batch.keys), name
            continue
        if isinstance(value, RowCache):
            keys, values, own = value.entries()
            assert len(value) == want and own.shape == (want, batch.past_len), name
            assert all(a.shape[0] == want and a.shape[2] == batch.past_len for a in keys + values), name
            continue
        arrays = value if layout.layers else [value]
        if layout.layers:
            assert len(arrays) == n_layers, name
        for a in arrays:
            assert len(a) == want, name
            if layout.padded:
                assert a.shape[1 if a.ndim == 2 else 2] == longest[layout.padded], name


def assert_same_fields(got: DecodeBatch, want: DecodeBatch) -> None:
    for name, _ in layouts(type(want)):
        x, y = getattr(got, name), getattr(want, name)
        if isinstance(y, RowCache):  # the same entries, whatever the buffers' layout
            for a, b in zip(x.entries(), y.entries()):
                for u, w in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                    np.testing.assert_array_equal(u, w, err_msg=name)
            continue
        if isinstance(y, np.ndarray) or (isinstance(y, list) and y and isinstance(y[0], np.ndarray)):
            xs, ys = (x, y) if isinstance(y, list) else ([x], [y])
            assert len(xs) == len(ys), name
            for a, b in zip(xs, ys):
                assert a.dtype == b.dtype and a.shape == b.shape, name
                np.testing.assert_array_equal(a, b, err_msg=name)
        else:
            assert x == y, name


@pytest.mark.parametrize("beam", [1, 2])
def test_every_declared_field_follows_filter_and_concatenate(tiny_onnx, sources, beam):
    """filter and concatenate carry the fields by their declared layout: after each, every field
    fits the batch, and concatenating then filtering back gives each part's fields unchanged."""
    assert {layout.axis for _, layout in layouts(DecodeBatch)} == {"batch", "sentence", "row"}
    a = DecodeBatch.from_sources(tiny_onnx, sources[:3], ["a0", "a1", "a2"], beam=beam, want_alignment=True)
    for _ in range(3):
        a.step(tiny_onnx)
    b = DecodeBatch.from_sources(tiny_onnx, sources[3:5], ["b0", "b1"], beam=beam)
    b.step(tiny_onnx)
    assert a.past_len == 3 and b.past_len == 1 and a.src_len != b.src_len
    for part in (a, b):
        assert_fields_fit(part, tiny_onnx.n_layers)
    both = DecodeBatch.concatenate([a, b])
    assert_fields_fit(both, tiny_onnx.n_layers)
    assert both.n_sentences == 5 and len(both) == 5 * beam
    for part in (a, b):
        back = DecodeBatch.concatenate([a, b]).filter(part.keys)
        assert_fields_fit(back, tiny_onnx.n_layers)
        assert_same_fields(back, part)
    dropped = both.active_keys()[0]
    both.filter([k for k in both.keys if k != dropped])
    assert_fields_fit(both, tiny_onnx.n_layers)
    assert dropped not in both.keys and dropped not in both.last_emitted
    with pytest.raises(AttributeError):
        both.undeclared = 1  # the slots admit declared fields only


def test_a_field_added_later_is_carried_or_fails_loudly(tiny_onnx, sources):
    @dataclass(eq=False, repr=False)
    class Tagged(DecodeBatch):
        row_tag: np.ndarray = field(
            default_factory=lambda: np.zeros(0, dtype=np.int64), metadata={"layout": Layout("row")}
        )
        sentence_tag: list = field(default_factory=list, metadata={"layout": Layout("sentence")})

    a = Tagged.from_sources(tiny_onnx, sources[:2], [0, 1], beam=2)
    a.row_tag, a.sentence_tag = np.arange(4), ["x", "y"]
    b = Tagged.from_sources(tiny_onnx, sources[2:3], [2], beam=2)
    b.row_tag, b.sentence_tag = np.arange(10, 12), ["z"]
    both = Tagged.concatenate([a, b])
    assert both.row_tag.tolist() == [0, 1, 2, 3, 10, 11] and both.sentence_tag == ["x", "y", "z"]
    both.filter([0, 2])
    assert both.row_tag.tolist() == [0, 1, 10, 11] and both.sentence_tag == ["x", "z"]

    @dataclass(eq=False, repr=False)
    class Undeclared(DecodeBatch):
        extra: list = field(default_factory=list)

    with pytest.raises(TypeError, match="extra"):
        layouts(Undeclared)
    c = Undeclared.from_sources(tiny_onnx, sources[:2], [0, 1])
    with pytest.raises(TypeError, match="extra"):
        c.filter([0])


@pytest.mark.parametrize("beam", [1, 3])
def test_a_full_in_place_cache_grows_and_decoding_goes_on(tiny_onnx_dir, sources, beam):
    """The fused graph's buffers start with room for two steps only: each time they are full the
    batch copies them into larger ones, and the outputs are those of a batch with room enough."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    want = generate(model, sources[:6], beam=beam, batch_size=6)
    batch = DecodeBatch.from_sources(model, sources[:6], list(range(6)), beam=beam)
    batch.cache = InPlaceCache.empty(model, len(batch), beam, capacity=2)
    results: dict = {}
    capacities = set()
    while len(batch):
        for f in batch.step(model):
            results[f.key] = f
        capacities.add(batch.cache.capacity)
        batch.filter(batch.active_keys())
    assert len(capacities) > 2  # it grew more than once
    assert [results[i].tokens for i in range(6)] == [h.tokens for h in want]
    assert [results[i].score for i in range(6)] == pytest.approx([h.score for h in want], abs=1e-5)


def test_a_step_that_ranks_more_candidates_rebinds_its_ranked_outputs_only(tiny_onnx_dir, sources):
    """A step that ranks more candidates (a glossary row's, after its term) keeps the cache's
    binding and binds outputs of that width (and the top_k input's value) in place of the ranked
    ones; it ranks as a step bound for it does, and so does the step after it, back at 2K."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    batch = DecodeBatch.from_sources(model, sources[:2], [0, 1], beam=2)
    batch.step(model)  # a batch's first step runs unbound
    batch.step(model)  # bound, at 2K candidates a row
    cache = batch.cache
    args = (model, batch.tokens, batch.positions, batch.cross_k, batch.cross_v, batch.src_mask)
    few = cache.step(*args, top_k=4)  # the same step three times: at 4, 9 and 4 candidates a row
    many, again = cache.step(*args, top_k=9), cache.step(*args, top_k=4)
    assert list(cache._bindings) == [True] and cache._bindings[True].top_k == 4
    assert (many.top_ids[:, :4] == few.top_ids).all() and (again.top_ids == few.top_ids).all()
    np.testing.assert_allclose(many.top_log_probs[:, :4], few.top_log_probs, atol=1e-6)
    np.testing.assert_array_equal(again.top_log_probs, few.top_log_probs)
    alone = InPlaceCache._packed([cache], [np.arange(len(cache.mask))], [np.arange(cache.P)], cache.capacity)
    fresh = alone.step(*args, top_k=9)  # a cache of its own, bound at 9 from the start
    np.testing.assert_array_equal(fresh.top_ids, many.top_ids)
    np.testing.assert_allclose(fresh.top_log_probs, many.top_log_probs, atol=1e-6)
    cache._grow(cache.capacity * 2)  # new buffers: their bindings and OrtValues go
    assert not cache._bindings and not cache._values


def test_beams_reorder_through_the_indirection_without_moving_the_cache(tiny_onnx_dir, sources):
    """A beam step of the fused graph leaves the buffers where they are: only cache_indirection
    follows the parents; what each row attends to is what the portable graph's gathered cache holds."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    fused = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    portable = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="portable")
    a = DecodeBatch.from_sources(fused, sources[:3], [0, 1, 2], beam=4)
    b = DecodeBatch.from_sources(portable, sources[:3], [0, 1, 2], beam=4)
    buffers = [k.ctypes.data for k in a.cache.k]
    reordered = False
    for _ in range(5):
        a.step(fused)
        b.step(portable)
        assert [k.ctypes.data for k in a.cache.k] == buffers
        ind = a.cache.indirection[:, :, : a.cache.P]
        reordered |= bool((ind != np.arange(4)[None, :, None]).any())
        ka, va, own_a = a.cache.entries()
        kb, vb, own_b = b.cache.entries()
        np.testing.assert_array_equal(own_a, own_b)
        for x, y in zip(ka + va, kb + vb):
            np.testing.assert_allclose(x, y, atol=1e-5)
    assert reordered


@pytest.mark.parametrize("beam", [1, 4])
def test_a_batch_first_beam_step_runs_one_row_per_sentence(tiny_onnx, sources, beam, monkeypatch):
    """Before the first step a sentence's beams are identical: in a batch of several sentences the
    decoder runs each one's first row only, and every later step runs all rows. Greedy batches have
    one row per sentence anyway."""
    rows_per_call: list[int] = []
    if tiny_onnx.graph == "fused":
        bind = type(tiny_onnx).bind_step

        def counting_bind(self, inputs, outputs, *args):
            bound = bind(self, inputs, outputs, *args)
            run = bound.run

            def counted():
                rows_per_call.append(len(inputs["tokens"]))
                run()

            bound.run = counted
            return bound

        run_fused = type(tiny_onnx).run_fused

        def counting_run(self, inputs, names):
            rows_per_call.append(len(inputs["tokens"]))
            return run_fused(self, inputs, names)

        monkeypatch.setattr(type(tiny_onnx), "bind_step", counting_bind)
        monkeypatch.setattr(type(tiny_onnx), "run_fused", counting_run)
    else:
        step = type(tiny_onnx).step

        def counting_step(self, tokens, *args, **kw):
            rows_per_call.append(len(tokens))
            return step(self, tokens, *args, **kw)

        monkeypatch.setattr(type(tiny_onnx), "step", counting_step)
    batch = DecodeBatch.from_sources(tiny_onnx, sources[:5], list(range(5)), beam=beam)
    for _ in range(3):
        batch.step(tiny_onnx)
    assert rows_per_call == [5, 5 * beam, 5 * beam]
    # a lone sentence runs its K rows from the start: one row would save less than the extra call costs
    rows_per_call.clear()
    lone = DecodeBatch.from_sources(tiny_onnx, sources[:1], [0], beam=beam)
    lone.step(tiny_onnx)
    assert rows_per_call == [beam]


def test_filtering_a_static_batch_keeps_the_fused_cache_in_its_buffers(tiny_onnx_dir, sources):
    """Rows that started together keep every slot in use: `filter` moves the kept rows to the front
    of the same buffers instead of copying the cache into new ones (the encoder's keys and values
    too, while the longest source stays), and decoding goes on as if the dropped sentences had
    never been there."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    longest = max(range(4), key=lambda i: len(sources[i]))
    keep = [i for i in range(4) if i != (longest + 1) % 4]  # the source axis keeps its length
    want = generate(model, [sources[i] for i in keep], beam=4, batch_size=3)
    batch = DecodeBatch.from_sources(model, sources[:4], list(range(4)), beam=4)
    for _ in range(2):
        batch.step(model)
    buffers = [k.ctypes.data for k in batch.cache.k + batch.cache.v]
    cross = [a.ctypes.data for a in batch.cross_k + batch.cross_v]
    batch.filter(keep)
    assert [k.ctypes.data for k in batch.cache.k + batch.cache.v] == buffers  # views of the same memory
    assert [a.ctypes.data for a in batch.cross_k + batch.cross_v] == cross
    assert all(a.flags.c_contiguous and len(a) == 3 for a in batch.cross_k + batch.cross_v)
    assert len(batch.cache) == 12 and batch.past_len == 2
    results: dict = {}
    while len(batch):
        for f in batch.step(model):
            results[f.key] = f
        batch.filter(batch.active_keys())
    assert [results[i].tokens for i in keep] == [h.tokens for h in want]
    assert [results[i].score for i in keep] == pytest.approx([h.score for h in want], abs=1e-5)


@pytest.mark.parametrize(
    "kept,order",
    [
        ([0, 1, 2], [0, 1, 2]),  # nothing dropped: nothing moves
        ([0, 2, 3, 4, 5], [0, 5, 2, 3, 4]),  # one gap, filled by the last
        ([1, 3, 5, 6], [5, 1, 6, 3]),  # gaps at 0 and 2, filled in order
        ([1, 4, 5, 6], [4, 1, 5, 6]),  # the one just behind the new end fills a gap too
        ([3, 4], [3, 4]),  # every kept one lies behind the new end
        ([], []),
    ],
)
def test_fill_order_moves_one_sentence_per_gap(kept, order):
    assert fill_order(kept) == order
    rows = np.array(order, dtype=np.int64)
    a = np.arange(10) * 10
    for dst, src, n in row_moves(rows):
        a[dst : dst + n] = a[src : src + n]
    assert a[: len(order)].tolist() == [10 * i for i in order]
    assert sum(n for _, _, n in row_moves(rows)) == sum(i != j for j, i in enumerate(order))


def test_row_moves_groups_runs_and_keeps_rows_in_place():
    assert row_moves(np.array([0, 1, 2])) == []
    assert row_moves(np.array([0, 8, 9, 3, 6, 7])) == [(1, 8, 2), (4, 6, 2)]
    assert row_moves(np.array([0, 2, 3, 5])) == [(1, 2, 2), (3, 5, 1)]  # ascending: down, in order
    a = np.arange(6)
    for dst, src, n in row_moves(np.array([0, 2, 3, 5])):
        a[dst : dst + n] = a[src : src + n]
    assert a[:4].tolist() == [0, 2, 3, 5]


@pytest.mark.parametrize("beam", [1, 2])
def test_filter_fills_the_gaps_from_the_end_and_decodes_on(tiny_onnx, sources, beam):
    """`filter` keeps each sentence where it is unless it lies behind the new end; those fill the
    gaps. Every field follows (keys, the encoder's keys and values, the cache), and decoding goes
    on to the results of a batch that never held the dropped sentences."""
    kept = [0, 2, 3, 4, 5]
    want = dict(zip(kept, generate(tiny_onnx, [sources[i] for i in kept], beam=beam)))
    batch = DecodeBatch.from_sources(tiny_onnx, sources[:6], list(range(6)), beam=beam)
    results: dict = {}
    for _ in range(2):
        results |= {f.key: f for f in batch.step(tiny_onnx)}
    cross = {k: batch.cross_k[0][i, :, : len(sources[k])].copy() for i, k in enumerate(batch.keys)}
    batch.filter([0, 2, 3, 4, 5])
    assert batch.keys == [0, 5, 2, 3, 4]
    for i, k in enumerate(batch.keys):
        np.testing.assert_array_equal(batch.cross_k[0][i, :, : len(sources[k])], cross[k])
    results: dict = {}
    run_to_end(tiny_onnx, batch, results)
    assert {k: results[k].tokens for k in want} == {k: h.tokens for k, h in want.items()}
    assert [results[k].score for k in want] == pytest.approx([h.score for h in want.values()], abs=1e-5)


def _record_scored(monkeypatch, model) -> list[bool]:
    """The `scored` flag of every decoder step the generator asks its cache for."""
    asked: list[bool] = []
    cls = InPlaceCache if model.graph == "fused" else ConcatCache
    step = cls.step

    def recording(self, *args, scored: bool = True, **kw):
        asked.append(scored)
        return step(self, *args, scored=scored, **kw)

    monkeypatch.setattr(cls, "step", recording)
    return asked


@pytest.mark.parametrize("a,b", [(1.5, 10), (0.0, 3)])  # the second forces </s> at the third step
def test_greedy_without_scores_decodes_the_same_tokens(tiny_onnx, sources, monkeypatch, a, b):
    """Greedy search ranks by the logits alone while no sentence asks for its score (the fused
    graph's unscored step: an ArgMax, no log-softmax). The tokens are those of the scored search,
    the scores None; beam search always scores."""
    want = generate(tiny_onnx, sources, beam=1, batch_size=16, max_len_a=a, max_len_b=b)
    asked = _record_scored(monkeypatch, tiny_onnx)
    got = generate(tiny_onnx, sources, beam=1, batch_size=16, max_len_a=a, max_len_b=b, want_scores=False)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert all(h.score is None and h.log_prob is None for h in got)
    assert asked and not any(asked)
    asked.clear()
    beams = generate(tiny_onnx, sources[:8], beam=3, batch_size=8, want_scores=False)
    assert all(scored for scored in asked) and all(h.score is not None for h in beams)


def test_a_greedy_batch_scores_its_steps_while_a_live_sentence_wants_its_score(tiny_onnx, sources, monkeypatch):
    """Scores are per sentence: a batch's step is scored while any live sentence wants its score,
    unscored once those have finished, and scored again when one joins; every score asked for is
    the one of a scored decode, and the tokens are the same either way."""
    want = generate(tiny_onnx, sources[:8], beam=1, batch_size=8)
    first = min(range(4), key=lambda k: len(want[k].tokens))  # the sentence of the batch that ends first
    asked = _record_scored(monkeypatch, tiny_onnx)
    batch = DecodeBatch.from_sources(tiny_onnx, sources[:4], list(range(4)), want_scores=[k == first for k in range(4)])
    results: dict = {}
    while first not in results:
        results |= {f.key: f for f in batch.step(tiny_onnx)}
    assert all(asked) and len(asked) == len(want[first].tokens) + 1
    batch.filter(batch.active_keys())
    if len(batch):
        results |= {f.key: f for f in batch.step(tiny_onnx)}
        assert asked[-1] is False
        if tiny_onnx.graph == "fused":
            unscored = [b.bound for scored, b in batch.cache._bindings.items() if not scored]
            assert [b.session for b in unscored] == [tiny_onnx.decoder_unscored]
        batch.filter(batch.active_keys())
    late = DecodeBatch.from_sources(tiny_onnx, sources[4:8], [4, 5, 6, 7], want_scores=[False, True, False, False])
    batch = DecodeBatch.concatenate([batch, late])
    asked.clear()
    run_to_end(tiny_onnx, batch, results)
    assert asked[0] is True
    assert [results[k].tokens for k in range(8)] == [h.tokens for h in want]
    for k in range(8):
        if k in (first, 5):
            assert results[k].score == pytest.approx(want[k].score, abs=1e-4)
        else:
            assert results[k].score is None


@pytest.mark.parametrize("beam", [1, 4])
def test_the_fused_cache_never_reads_a_slot_before_writing_it(tiny_onnx_dir, sources, beam, monkeypatch):
    """`InPlaceCache.empty` leaves its buffers unzeroed: with NaN in every slot of a new cache (and
    filters moving rows down the same buffers), the outputs are those of the zeroed buffers."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    model = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    want = generate(model, sources, beam=beam, batch_size=16)
    empty = InPlaceCache.empty.__func__

    def poisoned(cls, *args, **kw):
        cache = empty(cls, *args, **kw)
        for buf in cache.k + cache.v:
            buf.fill(np.nan)
        return cache

    monkeypatch.setattr(InPlaceCache, "empty", classmethod(poisoned))
    got = generate(model, sources, beam=beam, batch_size=16)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)
