"""What a request adds to the search: a forced target prefix (a multilingual model's target
language token, against the PyTorch reference's `forced`) and a minimum output length, in batches
and for a lone sentence, on both decoder steps."""

from __future__ import annotations

import pytest

from service.decoding.batch import DecodeBatch
from service.decoding.generator import generate

N_SENTENCES = 24
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module", params=["fused", "portable"])
def tiny_onnx(request, tiny_onnx_dir):
    from service.runtime.onnx_model import OnnxSeq2Seq

    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph=request.param)


@pytest.fixture(scope="module")
def sources(tiny_onnx, test_split):
    de, _ = test_split
    return tiny_onnx.source_ids(de[:N_SENTENCES])


def forced_token(tiny_onnx) -> int:
    """A frequent English word, as a language token would be: any id but the special ones does."""
    token = tiny_onnx.tokenizer.token_to_id("Ġthe") or tiny_onnx.tokenizer.token_to_id("the")
    assert token is not None
    return token


@pytest.mark.parametrize("beam", [1, 3])
def test_a_forced_prefix_decodes_as_the_reference(tiny_onnx, tiny_model, sources, beam):
    from export.generate import beam_search

    t = forced_token(tiny_onnx)
    want = beam_search(tiny_model, sources, beam=beam, forced=t)
    got = generate(tiny_onnx, sources, beam=beam, target_prefixes=[[t]] * len(sources), batch_size=8)
    assert [h.tokens for h in got] == [h.tokens for h in want]
    assert [h.tokens for h in got] != [h.tokens for h in generate(tiny_onnx, sources, beam=beam)]
    # Alone, with the alignment: the forced token has no row of its own.
    (lone,) = generate(tiny_onnx, sources[:1], beam=beam, target_prefixes=[[t]], want_alignment=True)
    assert lone.tokens == want[0].tokens
    assert lone.alignment is not None and lone.alignment.shape == (len(lone.tokens) + 1, len(sources[0]))


@pytest.mark.parametrize("beam", [1, 3])
def test_min_len_keeps_eos_back(tiny_onnx, sources, beam):
    free = generate(tiny_onnx, sources, beam=beam, max_len_b=40, want_scores=False)
    n = sorted(len(h.tokens) for h in free)[len(free) // 2] + 2  # more than half of them are shorter
    got = generate(tiny_onnx, sources, beam=beam, min_len=n, max_len_b=40, want_scores=False)
    assert all(len(h.tokens) >= n for h in got)
    for f, g in zip(free, got):
        if beam == 1 and len(f.tokens) >= n:  # greedy: a sentence long enough anyway is unchanged
            assert g.tokens == f.tokens
        assert g.tokens[: len(f.tokens)] == f.tokens or beam > 1
    # One sentence alone (its own bookkeeping) ends no earlier either.
    short = min(range(len(free)), key=lambda i: len(free[i].tokens))
    (lone,) = generate(tiny_onnx, [sources[short]], beam=beam, min_len=n, max_len_b=40)
    assert len(lone.tokens) >= n > len(free[short].tokens)


def test_prefix_and_min_len_in_a_running_batch(tiny_onnx, sources):
    """Sentences with and without the rules share greedy steps: each decodes as it would alone."""
    t = forced_token(tiny_onnx)
    batch = DecodeBatch.from_sources(
        tiny_onnx, sources[:4], list(range(4)), beam=1, min_lens=[0, 6, 0, 6], target_prefixes=[[], [t], [t], []]
    )
    got: dict = {}
    while batch.active_keys():
        for f in batch.step(tiny_onnx):
            got[f.key] = f.tokens
    for i, (m, p) in enumerate([(0, []), (6, [t]), (0, [t]), (6, [])]):
        (alone,) = generate(tiny_onnx, [sources[i]], beam=1, min_len=m, target_prefixes=[p])
        assert got[i] == alone.tokens
        assert len(got[i]) >= m


def test_min_len_runs_the_unscored_step_where_it_bans_eos(tiny_onnx_dir, test_split, monkeypatch):
    """Greedy rows under their minimum run the fused unscored step with </s> banned by eos_bias: no
    step is scored, and the tokens are the portable graph's, whose rows under the minimum run the
    scored step and take the second best instead of </s> (as an export without eos_bias does)."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    fused = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="fused")
    portable = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="portable")
    assert fused.unscored_bans_eos and not portable.unscored_bans_eos
    sources = fused.source_ids(test_split[0][:N_SENTENCES])
    free = generate(fused, sources, beam=1, max_len_b=40, want_scores=False)
    n = sorted(len(h.tokens) for h in free)[len(free) // 2] + 2
    bound: list[bool] = []
    bind_step = fused.bind_step
    monkeypatch.setattr(
        fused,
        "bind_step",
        lambda i, o, scored=True, values=None: bound.append(scored) or bind_step(i, o, scored, values),
    )

    def decode(model: OnnxSeq2Seq) -> list[list[int]]:
        got = generate(model, sources, beam=1, min_len=n, max_len_b=40, want_scores=False, batch_size=8)
        got += generate(model, sources[:1], beam=1, min_len=n, max_len_b=40, want_scores=False)
        return [h.tokens for h in got]

    banned = decode(fused)
    assert bound and not any(bound)
    assert banned == decode(portable)
    assert all(len(t) >= n for t in banned) and banned[: len(free)] != [h.tokens for h in free]
