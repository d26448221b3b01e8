"""The output rules of a decoder step over its candidates (top ids and log-probabilities), without a
model: forced prefix tokens, no </s> before a minimum length, </s> forced at the last step, and
sampling that never draws a banned </s>."""

from __future__ import annotations

import numpy as np

from service.decoding.output_rules import NEG_INF, OutputRules, max_output_len
from service.decoding.sampling import Sampling
from service.decoding.terms import TermStep

EOS, PAD = 2, 0


def rules_at(beam: int, positions: list[int], eos_from: list[int], prefixes: list[list[int]]) -> OutputRules:
    n = len(prefixes)
    return OutputRules.at_step(
        EOS,
        PAD,
        beam,
        np.array(positions, dtype=np.int64),
        np.zeros(n, dtype=bool),
        np.array(eos_from, dtype=np.int64),
        np.array([len(p) for p in prefixes], dtype=np.int64),
        prefixes,
    )


def test_max_output_len_counts_eos_and_stays_within_the_positions() -> None:
    assert max_output_len(10, 1.5, 10, 512) == 25
    assert max_output_len(10, 1.5, 10, 20) == 19
    assert max_output_len(0, 0.0, 0, 512) == 1


def test_rules_do_not_bind_past_every_prefix_and_minimum() -> None:
    rules = rules_at(1, [3, 5], [0, 0], [[], []])
    assert not rules.binding
    ids, lp = np.array([[EOS, 7]]), np.array([[-0.1, -2.0]], dtype=np.float32)
    assert rules.apply(ids, lp) == (ids, lp)  # unchanged, not copied
    assert not rules_at(1, [3, 5], [2, 4], [[], []]).binding  # both past their minimum


def test_a_forced_prefix_token_is_the_only_candidate_at_log_prob_0() -> None:
    rules = rules_at(2, [0, 0, 1, 1], [1, 0], [[9], []])  # sentence 0 forces 9 first; 2 beams each
    assert rules.binding and rules.forced is not None and rules.forced.tolist() == [9, 9, -1, -1]
    ids = np.array([[5, 6], [5, 6], [5, 6], [5, 6]])
    lp = np.full((4, 2), -1.0, dtype=np.float32)
    got_ids, got_lp = rules.apply(ids, lp)
    assert got_ids.tolist() == [[9, PAD], [9, PAD], [5, 6], [5, 6]]
    assert got_lp is not None and got_lp.tolist() == [[0.0, NEG_INF], [0.0, NEG_INF], [-1.0, -1.0], [-1.0, -1.0]]
    assert ids.tolist() == [[5, 6]] * 4 and lp.tolist() == [[-1.0, -1.0]] * 4  # the step's own arrays stay


def test_greedy_takes_the_second_best_where_eos_may_not_end_a_sentence_yet() -> None:
    rules = rules_at(1, [1, 1], [3, 0], [[], []])  # sentence 0 may not end before position 3
    ids = np.array([[EOS, 7], [EOS, 8]])
    lp = np.array([[-0.1, -1.5], [-0.2, -1.0]], dtype=np.float32)
    got_ids, got_lp = rules.apply(ids, lp)
    assert got_ids[:, 0].tolist() == [7, EOS]
    assert got_lp is not None and got_lp[:, 0].tolist() == [np.float32(-1.5), np.float32(-0.2)]


def test_beam_search_drops_the_eos_candidates_of_a_sentence_under_its_minimum() -> None:
    rules = rules_at(2, [1, 1], [4], [[]])
    ids = np.array([[EOS, 7, 8, 9], [5, EOS, 6, 4]])
    lp = np.full((2, 4), -1.0, dtype=np.float32)
    _, got_lp = rules.apply(ids, lp)
    assert got_lp is not None and (got_lp == NEG_INF).tolist() == [
        [True, False, False, False],
        [False, True, False, False],
    ]


def term_step(forced: list[int], no_eos: list[bool], dropped: list[list[bool]] | None = None) -> TermStep:
    step = TermStep(np.array(forced), np.array(no_eos), [()] * len(forced), np.zeros(len(forced), dtype=bool))
    step.dropped = None if dropped is None else np.array(dropped)
    return step


def test_greedy_takes_the_best_candidate_neither_dropped_nor_a_forbidden_eos() -> None:
    ids = np.array([[7, EOS, 8], [7, EOS, 8], [6, 5, 8]])
    rules = rules_at(1, [1, 1, 1], [3, 3, 0], [[], [], []]).with_terms(  # rows 0 and 1 under their minimum
        term_step([-1, -1, -1], [False] * 3, (ids == np.array([[7], [-1], [5]])).tolist())
    )
    assert rules.binding
    lp = np.array([[-0.1, -0.5, -1.5], [-0.1, -0.5, -1.5], [-0.1, -0.5, -1.5]], dtype=np.float32)
    got_ids, got_lp = rules.apply(ids, lp)
    assert got_ids[:, 0].tolist() == [8, 7, 6]  # 7 banned and </s> forbidden; nothing banned; 5 not first
    assert got_lp is not None and got_lp[:, 0].tolist() == [np.float32(-1.5), np.float32(-0.1), np.float32(-0.1)]


def test_beam_search_drops_a_rows_dropped_candidate() -> None:
    ids = np.array([[7, 5, 6, 8], [7, 5, 6, 8]])
    rules = rules_at(2, [1, 1], [0], [[]]).with_terms(
        term_step([-1, -1], [False, False], (ids == [[7], [-1]]).tolist())
    )
    _, got_lp = rules.apply(ids, np.full((2, 4), -1.0, dtype=np.float32))
    assert got_lp is not None and (got_lp == NEG_INF).tolist() == [[True, False, False, False], [False] * 4]


def test_dropped_candidates_are_passed_over_greedy_and_beam() -> None:
    step = term_step(
        [-1, -1], [False, False], [[True, True, False], [False, False, False]]
    )  # row 0: its first two are glue
    greedy = rules_at(1, [1, 1], [0, 0], [[], []]).with_terms(step)
    ids = np.array([[7, 5, 6], [7, 5, 6]])
    lp = np.array([[-0.1, -0.5, -1.5], [-0.1, -0.5, -1.5]], dtype=np.float32)
    got_ids, _ = greedy.apply(ids, lp)
    assert got_ids[:, 0].tolist() == [6, 7]
    beam = rules_at(2, [1, 1], [0], [[]]).with_terms(step)
    _, got_lp = beam.apply(ids, lp)
    assert got_lp is not None and (got_lp == NEG_INF).tolist() == [[True, True, False], [False] * 3]


def test_the_last_allowed_step_leaves_only_eos_at_its_own_log_prob() -> None:
    rules = OutputRules(EOS, PAD, 1)
    ids = np.array([[5, 6], [7, 8]])
    lp = np.array([[-0.5, -1.0], [-0.3, -2.0]], dtype=np.float32)
    eos_lp = np.array([-3.0, -4.0], dtype=np.float32)
    got_ids, got_lp = rules.force_eos(ids, lp, eos_lp, np.array([False, True]))
    assert got_ids.tolist() == [[5, 6], [EOS, PAD]]
    assert got_lp is not None and got_lp.tolist() == [[-0.5, -1.0], [-4.0, NEG_INF]]
    got_ids, got_lp = rules.force_eos(ids, None, None, slice(None))  # an unscored step: ids only
    assert got_ids[:, 0].tolist() == [EOS, EOS] and got_lp is None


def test_sampling_draws_into_column_0_and_never_a_banned_eos() -> None:
    rules = rules_at(1, [0, 0], [2, 0], [[], []])  # sentence 0 may not end yet
    ids = np.array([[EOS, 7, 8], [EOS, 7, 8]])
    lp = np.log(np.array([[0.98, 0.01, 0.01], [0.98, 0.01, 0.01]], dtype=np.float32))
    how = [Sampling(0, 1.0, 1.0, np.random.default_rng(s)) for s in (1, 2)]
    for _ in range(20):
        got_ids, got_lp = rules.sample(how, [0], ids, lp)  # sentence 1 does not sample
        assert got_ids[0, 0] in (7, 8) and got_lp[0, 0] == lp[0, list(ids[0]).index(got_ids[0, 0])]
        assert got_ids[1].tolist() == [EOS, 7, 8]
    best = [Sampling(1, 1.0, 1.0, np.random.default_rng(3))] * 2  # topk 1: the best, as greedy search
    assert rules_at(1, [5, 5], [0, 0], [[], []]).sample(best, [0, 1], ids, lp)[0][:, 0].tolist() == [EOS, EOS]
