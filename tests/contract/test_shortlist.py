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


def test_batch_ids_are_the_union_with_always_padded_with_the_lowest_unused_ids():
    s = small()
    ids = s.batch_ids([s.candidates([0]), s.candidates([2])])
    assert len(ids) == PAD_MULTIPLE
    assert np.all(np.diff(ids) > 0)  # ascending, no duplicates
    assert {0, 1, 2, 3, 5, 9, 40} <= set(ids.tolist())
    assert set(ids.tolist()) - {0, 1, 2, 3, 5, 9, 40} == {4, 6, 7, 8, 10, 11, 12, 13, 14}


def test_batch_ids_never_pass_the_vocabulary():
    s = Shortlist.from_rows([[1]], [0], 5, PARAMS)
    assert s.batch_ids([s.candidates([0])]).tolist() == [0, 1, 2, 3, 4]


def test_ids_outside_the_vocabulary_are_refused():
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        Shortlist.from_rows([[70]], [0], 64, PARAMS)


def test_the_shortlist_step_file_names():
    assert shortlist_file_name("decoder.fused.int8.one-row.onnx") == "decoder.fused.int8.one-row.shortlist.onnx"
