"""benchmarks/many_models.py on the tiny model: three versions (hard links of one) under a budget
that holds one, one client round robin over them through a real `mtserve serve`. Every request
is answered OK and every version is loaded, and the report carries the budget, the loads and
evictions, the load times and the server's RSS against the budget."""

from __future__ import annotations

import json
import shutil

from benchmarks import many_models


def test_round_robin_over_more_versions_than_the_budget_holds(tiny_model_dir, tiny_onnx_dir, tmp_path):
    # A copy of the tiny model and its export (tiny_model_dir/onnx): the benchmark hard-links its
    # files, which onnx's checker then refuses in the shared original ("hardlink attack").
    assert tiny_onnx_dir.is_dir()
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    result = many_models.run(model, copies=3, hold=1, clients=1, seconds=4.0, work=tmp_path / "work")
    assert result["statuses"] == {"OK": result["requests"]}
    assert result["requests"] >= 3
    # Every version loaded. How many the budget then holds varies from run to run: the tiny
    # model's sizes are a few MB, measured with as much noise (evictions: test_on_demand.py).
    assert result["loads"] >= 3 and 0 <= result["evictions"] < result["loads"]
    assert result["budget_mb"] == int(1.5 * result["version_size_mb"])
    rss = result["rss_mb"]
    assert 0 < rss["baseline"] <= rss["peak"] and rss["samples"] > 0
    json.dumps(result)
