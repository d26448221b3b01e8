"""The batching settings derived from the decoder step's cost (service/batching/calibration.py):
the rule as a function of measured costs, its bounds, the order in which serving.json, explicit
settings and the measurement win, and a measurement on a real model."""

from __future__ import annotations

import pytest

from service.batching import calibration
from service.batching.calibration import StepCosts, derive, in_force, measure_step_costs, resolve
from service.settings import Settings


def test_the_wait_is_a_few_mid_size_steps():
    costs = StepCosts({1: 2.0, 16: 6.0, 64: 16.0})
    assert derive(costs) == {
        "max_queue_delay_ms": calibration.DELAY_STEPS * 6.0,
        "max_batch_sentences": 64,
        "max_batch_tokens": 64 * calibration.TOKENS_PER_ROW,
    }
    # Twice the step, twice the wait.
    slower = derive(StepCosts({1: 4.0, 16: 12.0, 64: 32.0}))
    assert slower["max_queue_delay_ms"] == 2 * derive(costs)["max_queue_delay_ms"]


@pytest.mark.parametrize(
    "ms, delay",
    [
        ({1: 0.01, 16: 0.02, 64: 0.05}, calibration.MIN_DELAY_MS),  # a step of microseconds: 1 ms
        ({1: 20.0, 16: 60.0, 64: 140.0}, calibration.MAX_DELAY_MS),  # 6 steps of 60 ms: 100 ms
    ],
)
def test_the_wait_is_bounded(ms, delay):
    assert derive(StepCosts(ms))["max_queue_delay_ms"] == delay


def test_slow_steps_make_smaller_batches():
    """The batch stops where a step on the line through 1 and 64 rows passes the budget."""
    budget = calibration.STEP_BUDGET_MS
    # 10 ms fixed + 2 ms a row: 32 rows 74 ms, 64 rows 138 ms, both within 150 ms.
    assert derive(StepCosts({1: 12.0, 16: 42.0, 64: 138.0}))["max_batch_sentences"] == 64
    # 10 ms fixed + 4 ms a row: 32 rows 138 ms, 64 rows 266 ms.
    at = StepCosts({1: 14.0, 16: 74.0, 64: 266.0})
    assert at.at(32) <= budget < at.at(64)
    assert derive(at) | {"max_queue_delay_ms": 0} == {
        "max_queue_delay_ms": 0,
        "max_batch_sentences": 32,
        "max_batch_tokens": 32 * calibration.TOKENS_PER_ROW,
    }
    # A step of a second even at one row: the smallest batch, never fewer rows.
    assert derive(StepCosts({1: 1000.0, 16: 2000.0, 64: 5000.0}))["max_batch_sentences"] == calibration.MIN_ROWS


def test_serving_json_then_explicit_settings_then_the_measurement_then_defaults():
    costs = StepCosts({1: 2.0, 16: 6.0, 64: 16.0})
    defaults = {"max_queue_delay_ms": 0.0, "max_batch_sentences": 64, "max_batch_tokens": 4096}
    b = resolve(defaults, {"max_queue_delay_ms": 50.0, "max_batch_sentences": 16}, {"max_queue_delay_ms": 5.0}, costs)
    assert b.values == {"max_queue_delay_ms": 5.0, "max_batch_sentences": 16, "max_batch_tokens": 16 * 64}
    assert b.sources == {
        "max_queue_delay_ms": "serving.json",
        "max_batch_sentences": "setting",
        "max_batch_tokens": "measured",
    }
    nothing_measured = resolve(defaults, {"max_batch_tokens": 1000}, {}, None)
    assert nothing_measured.values == {**defaults, "max_batch_tokens": 1000}
    assert nothing_measured.sources == {
        "max_queue_delay_ms": "default",
        "max_batch_sentences": "default",
        "max_batch_tokens": "setting",
    }


class Unmeasurable:
    """A model whose steps must not run: in_force measures only when something is left to it."""

    def __getattr__(self, name):
        raise AssertionError(f"measured although every batching value was given ({name})")


def test_nothing_is_measured_when_everything_is_given():
    st = Settings(max_queue_delay_ms=3, max_batch_sentences=8, max_batch_tokens=100)
    same, b = in_force(st, {"max_queue_delay_ms", "max_batch_sentences"}, {"max_batch_tokens"}, Unmeasurable())
    assert same is st and b.costs is None
    assert b.sources == {
        "max_queue_delay_ms": "setting",
        "max_batch_sentences": "setting",
        "max_batch_tokens": "serving.json",
    }


def test_a_real_model_is_measured_and_its_values_are_in_force(tiny_onnx_dir):
    from service.runtime.loading import load_models

    st = Settings(model_dir=tiny_onnx_dir.parent, onnx_dir=tiny_onnx_dir, precision="fp32", decode_workers=1)
    model = load_models(st)[0]
    costs = measure_step_costs(model)
    assert sorted(costs.ms) == list(calibration.MEASURED_ROWS) and all(ms > 0 for ms in costs.ms.values())
    served, b = in_force(st, {"max_batch_sentences"}, set(), model)
    assert b.sources == {
        "max_queue_delay_ms": "measured",
        "max_batch_sentences": "setting",
        "max_batch_tokens": "measured",
    }
    assert b.costs is not None and sorted(b.costs.ms) == list(calibration.MEASURED_ROWS)
    assert served.max_queue_delay_ms == derive(b.costs)["max_queue_delay_ms"]
    assert calibration.MIN_DELAY_MS <= served.max_queue_delay_ms <= calibration.MAX_DELAY_MS
    assert served.max_batch_tokens == calibration.TOKENS_PER_ROW * st.max_batch_sentences
    assert served.model_dir == st.model_dir and served.precision == "fp32"  # the rest unchanged


def test_the_measurement_gives_back_what_its_batches_grew(tiny_onnx_dir, monkeypatch):
    """The timed steps run with ONNX Runtime's defaults; after each size's, one more step, and at
    the end one encoder run of one row, shrink the sessions' arenas (`releasing_memory`), so that
    the server does not hold what the batches of 64 rows grew from its load on."""
    import onnxruntime as ort

    from service.runtime.loading import load_models

    model = load_models(Settings(model_dir=tiny_onnx_dir.parent, onnx_dir=tiny_onnx_dir, precision="fp32"))[0]
    runs: list[tuple[bool, bool]] = []  # (the encoder's run, shrinking its arena)

    def record(session, options) -> None:
        entry = options.get_run_config_entry("memory.enable_memory_arena_shrinkage") if options else ""
        runs.append((session is model.encoder, entry == "cpu:0"))

    run, run_bound = ort.InferenceSession.run, ort.InferenceSession.run_with_iobinding
    monkeypatch.setattr(
        ort.InferenceSession,
        "run",
        lambda s, names, feed, options=None: (record(s, options), run(s, names, feed, options))[1],
    )
    monkeypatch.setattr(
        ort.InferenceSession,
        "run_with_iobinding",
        lambda s, io, options=None: (record(s, options), run_bound(s, io, options))[1],
    )
    measure_step_costs(model)
    steps = calibration.WARM_STEPS + calibration.TIMED_STEPS
    assert [shrink for encoder, shrink in runs if not encoder] == ([False] * steps + [True]) * len(
        calibration.MEASURED_ROWS
    )
    encoder = [shrink for encoder, shrink in runs if encoder]
    assert (
        len(encoder) > len(calibration.MEASURED_ROWS)
        and encoder[-1]
        and not any(encoder[:-1])
        and runs[-1] == (True, True)
    )
    assert model.run_options is None
