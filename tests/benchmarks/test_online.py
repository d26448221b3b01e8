"""benchmarks/online.py's load generator against a real server on loopback: every request is
answered, through Translate calls or as items of TranslateMany streams, with the same texts."""

from __future__ import annotations

import pytest

from benchmarks.online import run_level


@pytest.mark.parametrize("api, streams", [("unary", 1), ("many", 1), ("many", 3)])
def test_every_request_is_answered(server, test_split, api, streams):
    texts, refs = test_split[0][:20], test_split[1][:20]
    row = run_level(server.address, texts, refs, concurrency=6, n_requests=24, beam=1, api=api, streams=streams)
    assert row["api"] == api and row["errors"] == {}
    assert row["requests"] == row["ok"] == 24
    assert row["sentences_per_s"] > 0 and row["p50_ms"] <= row["p99_ms"]
    assert row["bleu"] is not None


def test_both_apis_give_the_same_translations(server, test_split):
    import asyncio

    from benchmarks.online import _load

    texts = test_split[0][:12]
    out = {
        api: asyncio.run(_load(server.address, texts, 4, 12, 1, 30.0, api=api, streams=2))["results"]
        for api in ("unary", "many")
    }
    # Request i sends texts[i % 12]; each API's 12 measured requests are those that finished after
    # the loop's first 4, so the two cover mostly the same texts, each once or twice.
    answers: dict[int, set[str]] = {}
    for rows in out.values():
        assert len(rows) == 12 and all(code == "OK" for _, _, code, _ in rows)
        for i, _, _, t in rows:
            answers.setdefault(i % len(texts), set()).add(t.text)
    keys = [{i % len(texts) for i, *_ in rows} for rows in out.values()]
    assert len(keys[0] & keys[1]) >= 6
    assert all(len(seen) == 1 for seen in answers.values())  # one translation of a text, either API
