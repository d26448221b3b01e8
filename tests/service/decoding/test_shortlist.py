"""The search over a vocabulary shortlist (`contract.shortlist`): the fused steps rank each batch's
vocab_ids only. A shortlist of the whole vocabulary decodes exactly as the plain steps; a real one
keeps every output token among the batch's candidates, with min_len, forced prefixes, sampling
and n-best lists still applied; a version without a shortlist runs its plain steps."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from contract.manifest import load_manifest
from contract.shortlist import Shortlist
from service.decoding.batch import DecodeBatch
from service.decoding.generator import generate
from service.decoding.results import Finished
from service.decoding.sampling import Sampling
from service.runtime.onnx_model import OnnxSeq2Seq
from tests.near_ties import assert_equal_up_to_a_near_tie, torch_next_log_probs
from tests.service.imported import M2M100, MARIAN

N_SENTENCES = 24
N_PAIRS = 2000
PARAMS = {"always": 0, "derived_from": "parallel"}
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def with_shortlist(root: Path, tiny_model_dir: Path, tiny_model, shortlist: Shortlist) -> Path:
    from export.shortlist import install

    model_dir = root / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    install(tiny_model, model_dir / "onnx", load_manifest(model_dir / "onnx", verify_checksums=False), shortlist)
    return model_dir


@pytest.fixture(scope="module")
def whole_dir(tmp_path_factory, tiny_model_dir, tiny_model, tiny_onnx_dir) -> Path:
    V = load_manifest(tiny_onnx_dir, verify_checksums=False).dims.vocab_size
    whole = Shortlist.from_rows([], range(V), V, {**PARAMS, "per_source": 1, "pairs": 0})
    return with_shortlist(tmp_path_factory.mktemp("whole"), tiny_model_dir, tiny_model, whole)


@pytest.fixture(scope="module")
def real(tmp_path_factory, tiny_model_dir, tiny_model, tiny_onnx_dir, data_dir) -> OnnxSeq2Seq:
    """The tiny model with a shortlist derived from the first training pairs: 5 per source token
    and the specials, a small part of the vocabulary for a batch."""
    from export.data import read_parallel
    from export.shortlist import derive, special_ids

    plain = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32")
    de, en = read_parallel(data_dir, "train")
    pairs = [(plain.tokenizer.encode(s), plain.tokenizer.encode_target(t)) for s, t in zip(de[:N_PAIRS], en[:N_PAIRS])]
    sl = derive(pairs, plain.vocab_size, special_ids(plain.manifest), per_source=5, always=0)
    model_dir = with_shortlist(tmp_path_factory.mktemp("real"), tiny_model_dir, tiny_model, sl)
    return OnnxSeq2Seq(model_dir, precision="fp32")


@pytest.fixture(scope="module")
def sources(tiny_onnx, test_split) -> list[list[int]]:
    de, _ = test_split
    return tiny_onnx.source_ids(de[:N_SENTENCES])


def batch_vocab(model: OnnxSeq2Seq, sources: list[list[int]], forced: list[int] = ()) -> set[int]:
    """The batch's candidates: what the shortlist allows it, without the padding of its vocab_ids."""
    assert model.shortlist is not None
    return set(model.shortlist.batch_candidates([model.shortlist.candidates(s, forced) for s in sources]).tolist())


def decode(model: OnnxSeq2Seq, batch: DecodeBatch) -> dict:
    out: dict = {}
    while len(batch):
        for f in batch.step(model):
            out[f.key] = f
        if not batch.active_keys():
            break
        batch.filter(batch.active_keys())
    return out


@pytest.mark.parametrize(("precision", "beams"), [("fp32", (1, 4)), ("int8", (4,))])
def test_a_shortlist_of_the_whole_vocabulary_decodes_as_the_plain_steps(
    whole_dir, tiny_model, sources, precision, beams
):
    """Batched, the shortlist step runs the plain step's operator over the same columns: equal
    tokens. A lone sentence's int8 steps differ in kernel (the shortlist's per-row int8 logits
    against the one-row step's MatMulNBits blocks): equal up to a near-tie (tests.near_ties)."""
    on = OnnxSeq2Seq(whole_dir, precision=precision)
    off = OnnxSeq2Seq(whole_dir, precision=precision, shortlist=False)
    assert on.shortlist is not None and off.shortlist is None
    for beam in beams:
        got = generate(on, sources, beam=beam, batch_size=8)
        want = generate(off, sources, beam=beam, batch_size=8)
        assert [h.tokens for h in got] == [h.tokens for h in want]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in want], atol=1e-4)
    lone = generate(on, sources[:3], beam=1, batch_size=1, want_scores=False)
    plain = generate(off, sources[:3], beam=1, batch_size=1)
    if precision == "fp32":
        assert [h.tokens for h in lone] == [h.tokens for h in plain]
    for src, got_one, want_one in zip(sources[:3], lone, plain):
        reference = torch_next_log_probs(tiny_model, src)
        assert_equal_up_to_a_near_tie(got_one.tokens, want_one.tokens, reference, on.eos_id)


@pytest.mark.parametrize("beam", [1, 4])
def test_every_output_token_is_among_the_batchs_candidates(real, sources, beam):
    sources = sources[:8]
    vocab = batch_vocab(real, sources)
    assert len(vocab) < real.vocab_size // 3  # a real restriction
    got = generate(real, sources, beam=beam, batch_size=len(sources), max_len_b=30)
    assert all(set(h.tokens) <= vocab for h in got)
    assert sum(len(h.tokens) for h in got) > 2 * len(got)  # it translates, not only ends
    for s in sources[:2]:  # a lone sentence ranks its own candidates only
        (h,) = generate(real, [s], beam=beam)
        assert set(h.tokens) <= batch_vocab(real, [s])


def test_min_len_and_a_forced_prefix_outside_the_shortlist(real, sources):
    outside = next(i for i in range(real.vocab_size - 1, 0, -1) if i not in batch_vocab(real, sources))
    n = 12
    got = generate(real, sources, beam=1, min_len=n, want_scores=False, max_len_b=40)
    assert all(len(h.tokens) >= n for h in got)
    batch = DecodeBatch.from_sources(
        real, sources, list(range(len(sources))), beam=2, kept_prefixes=[[outside]] * len(sources)
    )
    done = decode(real, batch)
    vocab = batch_vocab(real, sources, [outside])
    for f in done.values():
        assert f.tokens[0] == outside and set(f.tokens) <= vocab


def test_sampling_and_n_best_lists_draw_from_the_candidates(real, sources):
    vocab = batch_vocab(real, sources)
    rng = np.random.default_rng(7)
    how = [Sampling(topk=0, topp=1.0, temperature=1.5, rng=rng) for _ in sources]
    sampled = decode(real, DecodeBatch.from_sources(real, sources, list(range(len(sources))), sampling=how))
    greedy = generate(real, sources, beam=1, want_scores=False)
    assert all(set(f.tokens) <= vocab for f in sampled.values())
    assert [sampled[i].tokens for i in range(len(sources))] != [h.tokens for h in greedy]
    nbest = decode(real, DecodeBatch.from_sources(real, sources, list(range(len(sources))), beam=4, num_hypotheses=3))
    for f in nbest.values():
        assert isinstance(f, Finished) and len(f.hypotheses) == 3
        assert len({tuple(h.tokens) for h in f.hypotheses}) == 3
        assert all(set(h.tokens) <= vocab for h in f.hypotheses)


def test_no_slot_of_the_padding_is_ever_drawn(tmp_path, tiny_model_dir, tiny_model, tiny_onnx_dir, sources):
    """A batch's vocab_ids are padded to a multiple of 16; sampling at temperature 100 over a
    shortlist of the tokens the model likes least (1,000 seeds, every candidate of the step)
    draws only among the real candidates, and the padding's repeats of <pad> add no weight."""
    plain = OnnxSeq2Seq(tiny_onnx_dir, precision="fp32")
    src = sources[0]
    step0 = torch_next_log_probs(tiny_model, src)([])
    specials = {plain.pad_id, plain.eos_id, plain.bos_id, plain.unk_id}
    worst = [int(i) for i in np.argsort(step0) if int(i) not in specials][:20]  # far below the rest
    low = Shortlist.from_rows(
        [], sorted({*worst, *specials}), plain.vocab_size, {**PARAMS, "per_source": 1, "pairs": 0}
    )
    model = OnnxSeq2Seq(with_shortlist(tmp_path, tiny_model_dir, tiny_model, low), precision="fp32")
    allowed = set(low.batch_candidates([]).tolist())
    assert len(model.shortlist.batch_ids([], fill=model.pad_id)) - len(allowed) >= 8  # padded
    n = 1000
    how = [Sampling(topk=0, topp=1.0, temperature=100.0, rng=np.random.default_rng(seed)) for seed in range(n)]
    batch = DecodeBatch.from_sources(model, [src] * n, list(range(n)), sampling=how)
    drawn: list[int] = []
    for _ in range(3):
        batch.step(model)
        drawn += [t for ts in batch.last_emitted.values() for t in ts]
    assert set(drawn) <= allowed
    counts = np.bincount(drawn, minlength=model.vocab_size)[sorted(allowed)]
    # Near-uniform over the candidates: <pad> drawn about as often as the others, not 9 times as
    # often, as it would be if the padding's repeats of it could be drawn.
    assert counts[sorted(allowed).index(model.pad_id)] < 3 * len(drawn) / len(allowed)


def test_a_version_without_a_shortlist_runs_its_plain_steps(tiny_onnx_dir, sources):
    model = OnnxSeq2Seq(tiny_onnx_dir, precision="int8")
    assert model.shortlist is None and "shortlist" not in repr(model)
    variant = model.manifest.variant("int8", "fused")
    assert not variant.shortlist_steps
    assert "vocab_ids" not in {i.name for i in model.decoder.get_inputs()}
    assert [h.tokens for h in generate(model, sources[:4], beam=2)] == [
        h.tokens for h in generate(OnnxSeq2Seq(tiny_onnx_dir, precision="int8", shortlist=False), sources[:4], beam=2)
    ]


@pytest.mark.parametrize("name", [MARIAN, M2M100])
def test_imported_models_decode_with_a_shortlist(tmp_path, imported_models, test_split, name):
    """The tiny Marian (separate vocabularies) and M2M100 (a forced target language token): a
    shortlist of the whole vocabulary decodes as the plain steps, one derived from the model's own
    translations (`mtserve shortlist --monolingual`) keeps the outputs among the candidates."""
    from export.checkpoint import load_model
    from export.shortlist import derive, install, special_ids
    from mtserve.shortlist import translated_pairs

    version = tmp_path / "1"
    shutil.copytree(imported_models / name / "1", version)
    onnx_dir = version / "onnx"
    manifest = load_manifest(onnx_dir, verify_checksums=False)
    V = manifest.dims.vocab_size
    whole = Shortlist.from_rows([], range(V), V, {**PARAMS, "per_source": 1, "pairs": 0})
    install(load_model(version), onnx_dir, manifest, whole)
    on, off = OnnxSeq2Seq(version, precision="fp32"), OnnxSeq2Seq(version, precision="fp32", shortlist=False)
    de, _ = test_split
    src = on.source_ids(de[:8])
    prefixes = [on.prefixes()[1]] * len(src)
    for beam in (1, 2):
        got = generate(on, src, beam=beam, target_prefixes=prefixes, max_len_b=12)
        assert [h.tokens for h in got] == [
            h.tokens for h in generate(off, src, beam=beam, target_prefixes=prefixes, max_len_b=12)
        ]

    pairs = translated_pairs(onnx_dir, manifest, de[:30])
    sl = derive(pairs, V, special_ids(manifest), per_source=3, always=0, derived_from="monolingual")
    install(load_model(version), onnx_dir, load_manifest(onnx_dir, verify_checksums=False), sl)
    real = OnnxSeq2Seq(version, precision="fp32")
    vocab = batch_vocab(real, src, prefixes[0])
    assert len(vocab) < V and set(prefixes[0]) <= vocab
    assert all(set(h.tokens) <= vocab for h in generate(real, src, beam=2, target_prefixes=prefixes, batch_size=8))
