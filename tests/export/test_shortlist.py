"""`export.shortlist`: the derivation (IBM model 1), CTranslate2's vocabulary map, and the shortlist
steps stored with an export (kept by `mtserve export` of the same weights)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from contract.graphs import VOCAB_IDS, fused_decoder_io
from contract.manifest import load_manifest
from contract.shortlist import Shortlist
from export.shortlist import derive, ibm1, write_vmap

# each source token translates to one target token; every pair has two of them
PAIRS = [([10, 11], [20, 21]), ([10, 12], [20, 22]), ([11, 12], [21, 22]), ([10], [20])]


def test_ibm1_learns_the_word_pairs():
    s, t, p = ibm1(PAIRS, iterations=10)
    best = {int(src): int(t[s == src][np.argmax(p[s == src])]) for src in (10, 11, 12)}
    assert best == {10: 20, 11: 21, 12: 22}
    for src in (10, 11, 12):
        assert p[s == src].sum() == pytest.approx(1.0)


def test_derive_keeps_the_best_per_source_and_the_frequent_and_special_tokens():
    sl = derive(PAIRS, vocab_size=30, specials=[0, 2], per_source=1, always=1, iterations=10)
    assert [sl.row(s).tolist() for s in (10, 11, 12)] == [[20], [21], [22]]
    assert sl.row(3).tolist() == []
    assert sl.always.tolist() == [0, 2, 20]  # the specials and the most frequent target token
    assert sl.params["per_source"] == 1 and sl.params["pairs"] == len(PAIRS)
    wider = derive(PAIRS, vocab_size=30, specials=[0], per_source=3, always=0, iterations=1)
    assert wider.row(10).tolist() == [20, 21, 22]


def test_the_vocabulary_map_is_ctranslate2s_text_format(tmp_path):
    sl = Shortlist.from_rows([[], [4, 5]], [0, 1], 6, {})
    src = {0: "▁a", 1: "▁b"}
    tgt = {0: "<pad>", 1: "</s>", 4: "▁x", 5: "y"}
    write_vmap(sl, src, tgt, tmp_path / "vmap.txt")
    assert (tmp_path / "vmap.txt").read_text(encoding="utf-8").splitlines() == ["\t<pad> </s>", "▁b\t▁x y"]


@pytest.fixture(scope="module")
def shortlisted(shortlisted_copy):
    """A copy of the tiny model and its export with a shortlist of a few rows."""
    params = {"per_source": 2, "always": 4, "derived_from": "parallel", "pairs": 2}
    return shortlisted_copy([[5, 6], [7]], [0, 1, 2, 3], params)


def test_the_shortlist_steps_are_stored_with_the_export(shortlisted):
    manifest = load_manifest(shortlisted / "onnx")  # checksums of the .npz and the new graphs included
    assert manifest.shortlist is not None and manifest.shortlist.per_source == 2
    for key in ("fp32-fused", "int8-fused"):
        v = manifest.variants[key]
        assert set(v.shortlist_steps) == set(v.decoder_steps())
        for field, spec in v.shortlist_steps.items():
            assert spec.file.endswith(".shortlist.onnx")
            scored = "unscored" not in field
            assert spec.inputs == fused_decoder_io(manifest.dims, scored, shortlist=True)[0]
            session = ort.InferenceSession(str(shortlisted / "onnx" / spec.file), providers=["CPUExecutionProvider"])
            assert VOCAB_IDS in {i.name for i in session.get_inputs()}
    assert not manifest.variants["fp32"].shortlist_steps  # the portable graph never has one


def test_export_of_the_same_weights_keeps_the_shortlist(shortlisted):
    from export.to_onnx import export_model

    before = load_manifest(shortlisted / "onnx")
    after = export_model(shortlisted, shortlisted / "onnx", ["fp32"], check=False)
    assert after.shortlist == before.shortlist
    assert set(after.variants["fp32-fused"].shortlist_steps) == set(before.variants["fp32-fused"].shortlist_steps)
    assert after.variants["int8-fused"].shortlist_steps  # the reused variant's too
    load_manifest(shortlisted / "onnx")  # every listed file there and intact


def test_excluded_ids_are_in_no_row_and_never_always():
    """An imported model's unmapped ids (docs/models.md) are left out, however often they occur."""
    pairs = [([5, 6], [7, 9, 9]), ([5], [9, 8]), ([6], [7, 9])] * 10
    full = derive(pairs, 12, [0, 1], per_source=5, always=3)
    assert 9 in full.row(5).tolist() and 9 in full.always.tolist()
    kept = derive(pairs, 12, [0, 1], per_source=5, always=3, exclude=[9])
    assert all(9 not in kept.row(s).tolist() for s in range(kept.source_size)) and 9 not in kept.always.tolist()
    assert 7 in kept.row(5).tolist() and {0, 1} <= set(kept.always.tolist())
