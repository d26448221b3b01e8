"""A version with a vocabulary shortlist serves with it (GetModelInfo's notes say so), and the
per-model setting turns it off."""

from __future__ import annotations

import pytest

TEXTS = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee ."]


@pytest.fixture(scope="module")
def shortlisted(shortlisted_copy):
    params = {"per_source": 3, "always": 200, "derived_from": "parallel", "pairs": 0}
    return shortlisted_copy([], range(200), params)


@pytest.mark.parametrize("on", [True, False])
def test_a_version_with_a_shortlist_serves_with_it(make_server, shortlisted, on):
    server = make_server(model_dir=shortlisted, onnx_dir=shortlisted / "onnx", shortlist=on)
    (model,) = {id(m): m for m in server.server.scheduler.models}.values()
    assert (model.shortlist is not None) == on
    with server.client(timeout=30) as c:
        got = c.translate(TEXTS, beam_size=2, return_tokens=True)
        notes = list(c.model_info().notes)
    assert all(t.text for t in got)
    if on:  # every token among the first 200 ids, which the shortlist holds
        assert all(i < 200 for t in got for i in t.token_ids)
        assert any(n.startswith("vocabulary shortlist:") for n in notes)
    else:
        assert any("shortlist is not used (shortlist=false)" in n for n in notes)
