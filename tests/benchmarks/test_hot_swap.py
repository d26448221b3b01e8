"""Hot swap under load, measured on the shipped model in a real `mtserve serve` process
(benchmarks/hot_swap.py): version 2 loads while version 1 serves closed-loop load, becomes the
default, and version 1 is unloaded. No request may fail, the requests in flight on version 1 finish
on it, and the server's memory returns to one version's footprint (within 10%). The figures go
into the test report (the terminal summary and `--junitxml`'s properties)."""

from __future__ import annotations

import json

from benchmarks import hot_swap
from tests.conftest import SHIPPED_MODEL


def test_hot_swap_under_load_loses_nothing_and_gives_the_memory_back(shipped_int8_export, record_property):
    # The heap keeps growing for about 30 s of steady load (the allocator keeps freed blocks): the
    # one-version figure is taken after 20 s, so that the comparison is of like with like.
    report = hot_swap.run(
        SHIPPED_MODEL, shipped_int8_export, "de-en", concurrency=32, phase_s=6.0, beam=1, warmup_s=20.0
    )
    record_property(
        "figures",
        json.dumps(
            {
                k: report[k]
                for k in (
                    "requests",
                    "failed",
                    "answered_by",
                    "rss_mb",
                    "rss_after_unload_over_one_version",
                    "v1_answered_after_unload_began",
                    "load_v2_s",
                    "unload_v1_s",
                )
            }
        ),
    )
    assert report["failed"] == 0, report["failures"]
    assert report["answered_by"]["de-en:1"] > 0 and report["answered_by"]["de-en:2"] > 0
    # Requests version 1 held when its unload began were answered by it; none started on it once
    # version 2 was the default, and version 2 answered none before it was.
    assert report["v1_answered_after_unload_began"] > 0
    assert report["v1_started_after_switch"] == 0 and report["v2_answered_before_switch"] == 0
    rss = report["rss_mb"]
    assert rss["two_versions"] > rss["one_version"]  # a second copy of the sessions was loaded
    assert report["rss_after_unload_over_one_version"] <= 1.10, rss
    assert [list(row) for row in sorted(report["repository_index"])] == [
        ["de-en", "1", "UNAVAILABLE"],
        ["de-en", "2", "READY"],
        ["de-en-encoder", "1", "UNAVAILABLE"],
        ["de-en-encoder", "2", "READY"],
    ]
