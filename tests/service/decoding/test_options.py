"""The decoding options of a request at the search level: n-best lists (`num_hypotheses`), a
requested target prefix kept in the output (`kept_prefixes`) and random sampling, in batches and
for a lone sentence."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding.batch import DecodeBatch
from service.decoding.generator import generate
from service.decoding.results import Finished
from service.decoding.sampling import Sampling, sampling_rng

N_SENTENCES = 6
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["fused", "portable"])
def model(request, tiny_onnx_dir):
    """The model each test decodes with, on both decoder steps."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph=request.param)


@pytest.fixture(scope="module")
def sources(tiny_onnx, test_split):
    de, _ = test_split
    return tiny_onnx.source_ids(de[:N_SENTENCES])


def decode(model, sources, **kw) -> list[Finished]:
    """Every sentence of one DecodeBatch driven through its step loop, in input order."""
    batch = DecodeBatch.from_sources(model, sources, list(range(len(sources))), **kw)
    got: dict = {}
    while batch.active_keys():
        for f in batch.step(model):
            got[f.key] = f
    return [got[i] for i in range(len(sources))]


def forced_by_hand(model, src: list[int], prefix: list[int], max_len: int) -> list[int]:
    """Greedy decoding of one sentence through the portable decoder step (`tiny_onnx`) by hand:
    the prefix's tokens fed as the choices of the first steps, then the best token of each step."""
    ids = np.array([src], dtype=np.int64)
    mask = np.ones_like(ids)
    _, ck, cv = model.encode(ids, mask)
    pk, pv, pm = model.empty_past(1)
    tok, out = model.start_id, []
    for pos in range(max_len):
        o = model.step(np.array([tok]), np.array([pos]), pk, pv, pm, list(ck), list(cv), mask, top_k=1)
        pk, pv = list(o.present_k), list(o.present_v)
        pm = np.concatenate([pm, np.ones((1, 1), dtype=np.float32)], axis=1)
        tok = prefix[pos] if pos < len(prefix) else int(o.top_ids[0, 0])
        if tok == model.eos_id or pos == max_len - 1:
            break
        out.append(tok)
    return out


@pytest.mark.parametrize("lone", [False, True])
def test_the_best_of_an_n_best_list_is_the_beam_search_result(model, sources, lone):
    srcs = sources[:1] if lone else sources
    plain = generate(model, srcs, beam=4)
    got = decode(model, srcs, beam=4, num_hypotheses=3)
    for f, p in zip(got, plain):
        assert f.tokens == p.tokens and f.score == pytest.approx(p.score)
        assert len(f.hypotheses) == 3
        assert f.hypotheses[0].tokens == f.tokens
        scores = [h.score for h in f.hypotheses]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in f.hypotheses}) == 3  # distinct hypotheses
    assert all(f.hypotheses == [] for f in decode(model, srcs, beam=4))  # none unless asked


def test_a_kept_prefix_is_forced_decoding_by_hand(model, tiny_onnx, sources):
    free = generate(model, sources, beam=1)
    # A prefix the model would not choose: another sentence's first tokens.
    prefixes = [free[(i + 1) % len(free)].tokens[:3] for i in range(len(sources))]
    max_lens = [40] * len(sources)
    got = decode(model, sources, beam=1, kept_prefixes=prefixes, max_lens=max_lens)
    for src, p, f in zip(sources, prefixes, got):
        assert f.tokens[: len(p)] == p
        assert f.tokens == forced_by_hand(tiny_onnx, src, p, 40)
    assert [f.tokens for f in got] != [f.tokens for f in free]
    # Alone, and under a language token that is left out of the output.
    (lone,) = decode(model, sources[:1], beam=1, kept_prefixes=prefixes[:1], max_lens=[40])
    assert lone.tokens == got[0].tokens
    lang = free[0].tokens[0]
    (under,) = decode(model, sources[:1], beam=1, target_prefixes=[[lang]], kept_prefixes=prefixes[:1])
    assert under.tokens[:3] == prefixes[0]


@pytest.mark.parametrize("lone", [False, True])
def test_beam_search_output_begins_with_a_kept_prefix(model, sources, lone):
    srcs = sources[:1] if lone else sources
    free = generate(model, srcs, beam=3)
    prefixes = [free[-1 - i].tokens[:2] for i in range(len(srcs))]
    got = decode(model, srcs, beam=3, kept_prefixes=prefixes, num_hypotheses=2)
    for p, f in zip(prefixes, got):
        assert f.tokens[:2] == p
        assert all(h.tokens[:2] == p for h in f.hypotheses)


def samplers(seed: int, n: int, topk: int = 20, topp: float = 1.0, temperature: float = 1.0) -> list:
    return [Sampling(topk, topp, temperature, sampling_rng(seed, i)) for i in range(n)]


@pytest.mark.parametrize("lone", [False, True])
def test_sampling_is_reproducible_varied_and_greedy_at_topk_1(model, sources, lone):
    srcs = sources[:1] if lone else sources
    n = len(srcs)

    def sample(seed: int, **kw) -> list[list[int]]:
        return [f.tokens for f in decode(model, srcs, beam=1, sampling=samplers(seed, n, **kw))]

    first = sample(7)
    assert sample(7) == first
    assert len({tuple(sample(seed)[0]) for seed in range(1, 101 if lone else 21)}) > 1
    greedy = [h.tokens for h in generate(model, srcs, beam=1)]
    assert sample(3, topk=1) == greedy
    assert sample(3, topk=0, topp=1e-6) == greedy  # the nucleus of one token is the best one
    assert sample(3, topk=50, temperature=1e-4) == greedy


def test_sampling_rows_share_a_batch_with_greedy_rows(model, sources):
    how = samplers(5, len(sources), topk=0, topp=0.9)
    mixed = [h if i % 2 else None for i, h in enumerate(how)]
    got = decode(model, sources, beam=1, sampling=mixed, min_lens=2)
    greedy = generate(model, sources, beam=1, min_len=2)
    for i, (f, g) in enumerate(zip(got, greedy)):
        assert len(f.tokens) >= 2
        if i % 2 == 0:
            assert f.tokens == g.tokens
    alone = decode(model, sources[1:2], beam=1, sampling=[samplers(5, len(sources), topk=0, topp=0.9)[1]], min_lens=2)
    assert alone[0].tokens == got[1].tokens  # the same generator draws the same tokens in any batch
