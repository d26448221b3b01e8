"""A model's own settings (NAME/serving.json in the repository, like Triton's config.pbtxt):
its limits and batching apply to its requests alone, and a file that sets what cannot be set per
model, or values that do not hold together, stops the load with a message naming the file."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest

from service.errors import ModelLoadError
from service.settings import Settings

TEXTS = ["Ein Hund rennt.", "Ein Kind lacht.", "Zwei Männer sitzen auf einer Bank."]


def repository(root: Path, model_dir: Path, serving: dict[str, dict]) -> Path:
    for name in ("tiny-a", "tiny-b"):
        (root / name).mkdir(parents=True)
        (root / name / "1").symlink_to(model_dir, target_is_directory=True)
        if name in serving:
            (root / name / "serving.json").write_text(json.dumps(serving[name]))
    return root


def test_each_model_has_its_own_limits(make_server, tiny_onnx_dir, tmp_path):
    repo = repository(tmp_path, tiny_onnx_dir.parent, {"tiny-a": {"max_texts_per_request": 2, "default_beam_size": 1}})
    srv = make_server(model_dir=None, onnx_dir=None, model_repository=repo, max_texts_per_request=8)
    with srv.client(timeout=60) as c:
        a, b = c.model_info(model="tiny-a"), c.model_info(model="tiny-b")
        assert (a.limits.max_texts_per_request, a.limits.default_beam_size) == (2, 1)
        assert (b.limits.max_texts_per_request, b.limits.default_beam_size) == (8, 4)
        with pytest.raises(grpc.RpcError) as e:
            c.translate(TEXTS, model="tiny-a")
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details() == "texts: 3 texts exceed max_texts_per_request (2)"
        assert len(c.translate(TEXTS, model="tiny-b")) == 3
    # The model's queue holds its own max_queue_size; the server's setting is the other's.
    assert srv.server.models.resolve("tiny-a").engine.settings.max_texts_per_request == 2
    assert srv.server.models.resolve("tiny-b").engine.settings.max_texts_per_request == 8


@pytest.mark.parametrize(
    "serving, message",
    [
        ({"address": "0.0.0.0:1"}, "address cannot be set per model"),
        ({"default_beam_size": 9, "max_beam_size": 4}, "default_beam_size (9) exceeds max_beam_size (4)"),
        ({"max_queue_size": 0}, "max_queue_size"),
        (["not", "an", "object"], "must hold a JSON object"),
    ],
)
def test_a_bad_serving_file_stops_the_load_and_names_it(tiny_onnx_dir, tmp_path, serving, message):
    import asyncio

    from service.server import Server

    repo = repository(tmp_path, tiny_onnx_dir.parent, {"tiny-a": serving})
    server = Server(Settings(model_repository=repo, address="127.0.0.1:0", metrics_port=0, precision="fp32"))
    with pytest.raises(ModelLoadError) as e:
        asyncio.run(server.start())
    assert "tiny-a/serving.json" in str(e.value) and message in str(e.value), str(e.value)


def test_the_batching_values_in_force_and_their_sources(make_server, tiny_onnx_dir, tmp_path):
    """GetModelInfo and the model's info metric say which batching values each model runs with and
    where each came from: the model's serving.json, the server's explicit settings (make_server sets
    max_queue_delay_ms), or the measurement at load; the scheduler runs with them."""
    repo = repository(tmp_path, tiny_onnx_dir.parent, {"tiny-a": {"max_queue_delay_ms": 7, "max_batch_sentences": 16}})
    srv = make_server(model_dir=None, onnx_dir=None, model_repository=repo, max_batch_tokens=2000)
    with srv.client(timeout=60) as c:
        a, b = c.model_info(model="tiny-a").batching, c.model_info(model="tiny-b").batching
    assert (a.max_queue_delay_ms, a.max_batch_sentences, a.max_batch_tokens) == (7, 16, 2000)
    assert dict(a.sources) == {
        "max_queue_delay_ms": "serving.json",
        "max_batch_sentences": "serving.json",
        "max_batch_tokens": "setting",
    }
    assert dict(b.sources) == {
        "max_queue_delay_ms": "setting",
        "max_batch_sentences": "measured",
        "max_batch_tokens": "setting",
    }
    assert (b.max_queue_delay_ms, b.max_batch_tokens) == (2.0, 2000)
    # The rows measured, from the step costs it reports (a tiny model steps 64 rows well within budget).
    assert sorted(b.step_ms, key=int) == ["1", "16", "64"] and all(ms > 0 for ms in b.step_ms.values())
    assert b.max_batch_sentences == 64
    for name, info in (("tiny-a", a), ("tiny-b", b)):
        engine = srv.server.models.resolve(name).engine
        ran = engine.scheduler.settings  # the scheduler batches with the values reported
        assert (ran.max_queue_delay_ms, ran.max_batch_sentences, ran.max_batch_tokens) == (
            info.max_queue_delay_ms,
            info.max_batch_sentences,
            info.max_batch_tokens,
        )
        labels = next(
            s.labels
            for m in srv.server.metrics.registry.collect()
            if m.name == "mtserve_model"
            for s in m.samples
            if s.labels.get("model") == name
        )
        assert labels["max_batch_sentences"] == str(info.max_batch_sentences)
        assert labels["max_batch_sentences_source"] == info.sources["max_batch_sentences"]
        assert labels["max_queue_delay_ms_source"] == info.sources["max_queue_delay_ms"]
