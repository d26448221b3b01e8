"""The vocabulary shortlist's format and how a batch's candidate ids are made of it."""

from __future__ import annotations

import numpy as np
import pytest

from contract.shortlist import PAD_MULTIPLE, Shortlist, shortlist_file_name

PARAMS = {"per_source": 2, "always": 2, "derived_from": "parallel", "pairs": 3}


def small() -> Shortlist:
    # source 0 -> {5, 9}, source 1 -> {}, source 2 -> {3, 40}; always {0, 1, 2}; 64 target ids
    return Shortlist.from_rows([[9, 5, 5], [], [40, 3]], [2, 1, 0], 64, PARAMS)


def test_rows_are_sorted_and_unique_and_survive_a_round_trip(tmp_path):
    s = small()
    assert s.row(0).tolist() == [5, 9]
    assert s.row(1).tolist() == []
    assert s.row(2).tolist() == [3, 40]
    assert s.row(7).tolist() == []  # a source id past the table has no row
    s.save(tmp_path / "s.npz")
    back = Shortlist.load(tmp_path / "s.npz")
    assert back.row(2).tolist() == [3, 40]
    assert back.always.tolist() == [0, 1, 2]
    assert back.vocab_size == 64 and back.params == PARAMS


def test_candidates_hold_the_rows_of_the_source_and_the_forced_ids():
    assert small().candidates([2, 0, 2], forced=[63]).tolist() == [3, 5, 9, 40, 63]


def test_batch_ids_are_the_union_with_always_padded_with_repeats_of_the_fill_id():
    s = small()
    cands = [s.candidates([0]), s.candidates([2])]
    assert s.batch_candidates(cands).tolist() == [0, 1, 2, 3, 5, 9, 40]
    ids = s.batch_ids(cands, fill=1)
    assert len(ids) == PAD_MULTIPLE
    assert np.all(np.diff(ids) >= 0)  # non-decreasing: each repeat right after its first place
    assert set(ids.tolist()) == {0, 1, 2, 3, 5, 9, 40}  # no id outside the candidates
    assert ids.tolist().count(1) == PAD_MULTIPLE - 6


def test_the_fill_id_is_a_candidate_even_where_always_lacks_it():
    s = Shortlist.from_rows([[1]], [0], 64, PARAMS)
    ids = s.batch_ids([s.candidates([0])], fill=63)
    assert set(ids.tolist()) == {0, 1, 63} and len(ids) == PAD_MULTIPLE


def test_a_full_batch_needs_no_padding():
    s = Shortlist.from_rows([[1]], range(PAD_MULTIPLE), 64, PARAMS)
    assert s.batch_ids([s.candidates([0])], fill=0).tolist() == list(range(PAD_MULTIPLE))


def test_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        Shortlist.from_rows([[70]], [0], 64, PARAMS)


def test_the_shortlist_step_file_names():
    assert shortlist_file_name("decoder.fused.int8.one-row.onnx") == "decoder.fused.int8.one-row.shortlist.onnx"
