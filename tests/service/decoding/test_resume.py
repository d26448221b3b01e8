"""A decode that goes on from another's first tokens (service.decoding.resume): a greedy row's
decoder state, kept where asked, and sentences resumed from it decode as the same sentences from
scratch with those tokens as their kept prefix, greedy and beam, alone and in a running batch, on
both decoder steps; without an encoder pass."""

from __future__ import annotations

import numpy as np
import pytest

from service.decoding.batch import DecodeBatch
from service.decoding.results import Finished
from service.decoding.resume import Resume

N_SENTENCES = 5
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["fused", "portable"])
def model(request, tiny_onnx_dir):
    from service.runtime.onnx_model import OnnxSeq2Seq

    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph=request.param)


@pytest.fixture(scope="module")
def sources(tiny_onnx, test_split):
    de, _ = test_split
    return tiny_onnx.source_ids(de[:N_SENTENCES])


def decode(model, sources, keys=None, **kw) -> list[Finished]:
    keys = list(range(len(sources))) if keys is None else keys
    return run(model, DecodeBatch.from_sources(model, sources, keys, **kw), keys)


def run(model, batch: DecodeBatch, keys) -> list[Finished]:
    got: dict = {}
    while batch.active_keys():
        for f in batch.step(model):
            got[f.key] = f
    return [got[k] for k in keys]


@pytest.fixture(scope="module")
def drafts(model, sources) -> list[Finished]:
    """Greedy decodes that keep their state, in one batch."""
    return decode(model, sources, beam=1, keep_states=True, want_alignment=True)


def test_a_state_is_kept_where_asked_and_holds_every_input(model, sources, drafts):
    assert all(f.state is None for f in decode(model, sources[:2], beam=1))
    for f, src in zip(drafts, sources):
        st = f.state
        assert st is not None and st.tokens == [*f.tokens, model.eos_id]
        assert st.inputs == len(st.tokens) and len(st.self_k) == len(st.self_v) == model.n_layers
        assert st.self_k[0].shape == (model.n_heads, st.inputs, model.d_k)
        assert st.src_len == len(src) and st.cross_k[0].shape == (model.n_heads, len(src), model.d_k)
    with pytest.raises(ValueError, match="beam 1"):
        DecodeBatch.from_sources(model, sources[:1], [0], beam=2, keep_states=True)


@pytest.mark.parametrize("beam", [1, 4])
def test_a_resumed_sentence_decodes_as_from_scratch_with_the_tokens_as_its_kept_prefix(model, sources, drafts, beam):
    for upto in (0, 1, 3):
        resumes = [Resume(f.state, min(upto, len(f.tokens))) for f in drafts]
        prefixes = [r.tokens for r in resumes]
        want = decode(model, sources, beam=beam, kept_prefixes=prefixes, max_lens=[40] * len(sources))
        got = decode(model, sources, beam=beam, resume=resumes, max_lens=[40] * len(sources))
        for g, w in zip(got, want):
            assert g.tokens == w.tokens
            assert g.score == pytest.approx(w.score, abs=1e-4)
        lone = decode(model, sources[:1], beam=beam, resume=resumes[:1], max_lens=[40])
        assert lone[0].tokens == want[0].tokens


def test_a_resumed_sentence_joins_a_running_batch_and_keeps_its_alignment(model, sources, drafts):
    upto = 2
    resume = Resume(drafts[0].state, upto, drafts[0].alignment[:upto])
    want = decode(model, sources[:1], beam=4, kept_prefixes=[resume.tokens], want_alignment=True, max_lens=[40])[0]
    running = DecodeBatch.from_sources(model, sources[1:], [1, 2, 3, 4], beam=4, want_alignment=True)
    for _ in range(3):
        assert not running.step(model)
    joined = DecodeBatch.from_sources(
        model, sources[:1], [0], beam=4, resume=[resume], want_alignment=True, max_lens=[40]
    )
    got = run(model, DecodeBatch.concatenate([running, joined]), [0, 1, 2, 3, 4])[0]
    assert got.tokens == want.tokens
    assert got.alignment is not None and got.alignment.shape == want.alignment.shape
    np.testing.assert_allclose(got.alignment, want.alignment, atol=1e-4)


def test_bad_resumes_are_refused(model, sources, drafts):
    state = drafts[0].state
    with pytest.raises(ValueError, match="resume"):
        Resume(state, len(state.tokens))  # its </s> is no prefix
    with pytest.raises(ValueError, match="kept prefix"):
        DecodeBatch.from_sources(model, sources[:1], [0], resume=[Resume(state, 1)], kept_prefixes=[[5]])
    with pytest.raises(ValueError, match="target prefix"):
        DecodeBatch.from_sources(
            model, sources[:1], [0], resume=[Resume(state, 1)], target_prefixes=[[state.tokens[0] + 1]]
        )
    with pytest.raises(ValueError, match="attention rows"):
        DecodeBatch.from_sources(model, sources[:1], [0], resume=[Resume(state, 1)], want_alignment=True)
    with pytest.raises(ValueError, match="max_len"):
        DecodeBatch.from_sources(model, sources[:1], [0], resume=[Resume(state, 2)], max_lens=[2])
