"""A version with a vocabulary shortlist serves with it (GetModelInfo's notes say so), and the
per-model setting turns it off."""

from __future__ import annotations

import shutil

import pytest

from contract.manifest import load_manifest
from contract.shortlist import Shortlist

TEXTS = ["Ein Mann fährt Fahrrad .", "Zwei Hunde spielen im Schnee ."]


@pytest.fixture(scope="module")
def shortlisted(tmp_path_factory, tiny_model_dir, tiny_onnx_dir, tiny_model):
    from export.shortlist import install

    model_dir = tmp_path_factory.mktemp("served") / "model"
    shutil.copytree(tiny_model_dir, model_dir)
    manifest = load_manifest(model_dir / "onnx", verify_checksums=False)
    V = manifest.dims.vocab_size
    params = {"per_source": 3, "always": 200, "derived_from": "parallel", "pairs": 0}
    install(tiny_model, model_dir / "onnx", manifest, Shortlist.from_rows([], range(200), V, params))
    return model_dir


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
