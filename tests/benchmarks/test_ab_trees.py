"""benchmarks/ab_trees.py: the interleaving of two servers' calls and its figures."""

from __future__ import annotations

import pytest

from benchmarks.ab_trees import interleave, main, quantile, summary


def test_calls_alternate_the_side_and_the_kind_that_go_first_and_every_call_is_timed():
    seen: list[tuple[str, str, int]] = []

    def call(kind):
        return lambda client, case: seen.append((client, kind, case))

    times = interleave({"base": "base", "work": "work"}, [0, 1, 2, 3], call("x"), call("plain"), rounds=2)
    assert all(len(t) == 4 and all(len(r) == 2 for r in t) for t in times.values())
    firsts = [seen[k][0] for k in range(0, len(seen), 4)]  # the side that went first, per case and round
    assert firsts == ["base", "work", "base", "work", "work", "base", "work", "base"]
    kinds = [seen[k][1] for k in range(0, len(seen), 2)]
    assert kinds.count("x") == kinds.count("plain")


def test_the_figures_are_medians_of_the_cases_ratios_within_and_across_the_trees():
    times = {
        "base.x": [[3.0, 3.2], [6.0, 6.0]],
        "base.plain": [[2.0, 2.0], [4.0, 4.0]],
        "work.x": [[2.4, 2.6], [5.0, 5.0]],
        "work.plain": [[2.0, 2.0], [4.0, 4.0]],
    }
    out = summary(times)
    assert out["n"] == 2
    assert out["base"]["median_of_ratios"] == pytest.approx(1.525)  # 3.1 / 2 and 6 / 4
    assert out["work"]["median_of_ratios"] == pytest.approx(1.25)  # 2.5 / 2 and 5 / 4
    assert out["work_over_base.plain"] == 1.0
    assert out["work_over_base.x"] == pytest.approx(round((2.5 / 3.1 + 5 / 6) / 2, 3))
    assert quantile([4, 1, 3, 2, 5], 0.75) == 4


def test_a_base_that_is_no_revision_is_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--base", "no-such-revision-of-mtserve"])
    assert e.value.code == 2 and "is not a revision of this repository" in capsys.readouterr().err
