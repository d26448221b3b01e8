"""The batching settings a model version is served with where nobody set them: `max_queue_delay_ms`,
`max_batch_sentences` and `max_batch_tokens` derived from the decoder step's cost, measured on this
machine at load.

Measurement (`measure_step_costs`): greedy decoder steps of the model over batches of 1, 16 and
64 rows (each row the same 16-token source), after `WARM_STEPS` untimed steps at each size; the
median of `TIMED_STEPS` timed ones per size, in milliseconds of the measuring thread's CPU time
(ONNX Runtime runs a step on its caller's thread, its intra-op threads beside it spinning while
they share the work), so that other processes on a busy machine do not inflate it: on the 2 cores
of the development machine at a load average of 5, the real-size model's 16-row step measured
5.9-7.0 ms this way in six runs, and 5.9-14.4 ms in wall time. It runs on one decode worker's
session before the workers start, so nothing else of this model competes with it; about 0.4 s at
real size, 0.1 s for the shipped toy models. One untimed step after each size's timed ones, and
one encoder run of one row at the end, run `releasing_memory`: ONNX Runtime's arenas give back
what the batches of 64 rows grew (about 70 MB at OPUS-MT's size, which the server would
otherwise hold from its load on, whatever its traffic), and the loader hands the freed heap back
to the kernel after.

The rule (`derive`, a pure function of those costs):

- `max_queue_delay_ms` = `DELAY_STEPS` (6) x the step at 16 rows, within 1..100 ms. An idle worker
  waits for the closed-loop clients it has just answered (`Scheduler._wait_for_company`): they
  come back over a spread of milliseconds, and a batch started before they are back runs them in a
  batch of their own later, paying every step's fixed cost twice. The wait pays off while it is
  short beside the batch it fills (30 steps or so), so it scales with the step: a few mid-size
  steps. At the size of OPUS-MT (d512, 6+6 layers, vocabulary 58,101, int8, 1 intra-op thread) a
  16-row step takes about 7 ms on the development machine, so the wait comes out at about 40 ms:
  of hand-set waits of 0, 20, 50 and 100 ms, 50 was the fastest at concurrency 64 greedy
  (docs/performance.md), and against waits of 2, 10, 25 and 50 ms the derived one measured 1.14
  to 1.34 in interleaved pairs on a busy machine whose noise is about as large (docs/models.md,
  "Batching settings"). The shipped toy models step
  16 rows in 1-2 ms, and their wait comes out at about 10 ms, where 0 and 50 ms measured the same.
- `max_batch_sentences`: the most rows, a power of two from 8 up to `MAX_ROWS` (64, the settings'
  default, which every benchmark at both sizes ran with), whose step, on the straight line through the
  measured costs at 1 and 64 rows, stays within `STEP_BUDGET_MS` (150 ms): a sentence that joins
  a batch waits for the batch's steps, so a model whose steps are slow gets smaller batches.
- `max_batch_tokens` = `TOKENS_PER_ROW` (64, the settings' ratio 4096 / 64) x the
  `max_batch_sentences` in force, whoever set it.

Where each value in force comes from (`resolve`): the model's `serving.json` first, then a setting
given explicitly (an `MTSERVE_*` variable or a `mtserve serve` flag: pydantic's
`model_fields_set`), then the measured value; without a measurement (another backend), the
settings' default."""

from __future__ import annotations

import statistics
import time
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from service.decoding.batch import DecodeBatch
from service.decoding.model import DecoderModel
from service.settings import Settings

FIELDS = ("max_queue_delay_ms", "max_batch_sentences", "max_batch_tokens")
MEASURED_ROWS = (1, 16, 64)
SOURCE_TOKENS = 16  # tokens of the measured source, </s> included: a Multi30k sentence's length
WARM_STEPS = 2
TIMED_STEPS = 5

DELAY_STEPS = 6.0  # the wait, in steps of MID_ROWS rows
MID_ROWS = 16
MIN_DELAY_MS, MAX_DELAY_MS = 1.0, 100.0
MIN_ROWS, MAX_ROWS = 8, 64
STEP_BUDGET_MS = 150.0
TOKENS_PER_ROW = 64

# Where a value in force came from (GetModelInfo's ModelInfo.batching.sources).
SERVING_JSON, SETTING, MEASURED, DEFAULT = "serving.json", "setting", "measured", "default"


@dataclass(frozen=True)
class StepCosts:
    """Median milliseconds of one greedy decoder step, by rows in the batch."""

    ms: dict[int, float]

    def at(self, rows: int) -> float:
        """The step at `rows` rows: measured, or on the straight line through the smallest and
        the largest measured batch (a step's fixed cost plus a cost per row)."""
        if rows in self.ms:
            return self.ms[rows]
        lo, hi = min(self.ms), max(self.ms)
        per_row = (self.ms[hi] - self.ms[lo]) / (hi - lo) if hi > lo else 0.0
        return self.ms[lo] + per_row * (rows - lo)


@dataclass(frozen=True)
class Batching:
    """The batching values a model version is served with, where each came from, and the step
    costs measured at load (None where nothing was measured)."""

    values: dict[str, float | int]
    sources: dict[str, str]
    costs: StepCosts | None

    def describe(self) -> str:
        """One line for the load log."""
        parts = [f"{f} {self.values[f]:g} ({self.sources[f]})" for f in FIELDS]
        if self.costs is not None:
            steps = ", ".join(f"{rows} rows {ms:.2f} ms" for rows, ms in sorted(self.costs.ms.items()))
            parts.append(f"decoder step {steps}")
        return "; ".join(parts)


def derive(costs: StepCosts) -> dict[str, float | int]:
    """The batching settings for a model whose decoder steps cost `costs` (the module doc's rule)."""
    delay = min(MAX_DELAY_MS, max(MIN_DELAY_MS, DELAY_STEPS * costs.at(MID_ROWS)))
    rows = MIN_ROWS
    while rows * 2 <= MAX_ROWS and costs.at(rows * 2) <= STEP_BUDGET_MS:
        rows *= 2
    return {
        "max_queue_delay_ms": round(delay, 1),
        "max_batch_sentences": rows,
        "max_batch_tokens": TOKENS_PER_ROW * rows,
    }


def resolve(
    defaults: dict[str, float | int],
    explicit: dict[str, float | int],
    serving: dict[str, float | int],
    costs: StepCosts | None,
) -> Batching:
    """The values in force: `serving` (the model's serving.json) over `explicit` (settings set
    explicitly) over the values derived from `costs` over `defaults` (the settings' values)."""
    derived = derive(costs) if costs is not None else {}
    values: dict[str, float | int] = {}
    sources: dict[str, str] = {}
    for f in FIELDS:
        if f == "max_batch_tokens" and derived:  # in proportion to the rows in force, whoever set them
            derived[f] = TOKENS_PER_ROW * int(values["max_batch_sentences"])
        for source, given in ((SERVING_JSON, serving), (SETTING, explicit), (MEASURED, derived), (DEFAULT, defaults)):
            if f in given:
                values[f], sources[f] = given[f], source
                break
    return Batching(values, sources, costs)


def in_force(
    st: Settings, explicit: Collection[str], serving: Collection[str], model: DecoderModel | None
) -> tuple[Settings, Batching]:
    """`st` (a version's settings, its serving.json merged in) with the batching values in force,
    and where each came from. `explicit`: the fields the server's settings were given explicitly
    (`Settings.model_fields_set`); `serving`: those the model's serving.json sets; `model`: the
    decoder to measure when some field is left to the measurement (None: nothing is measured)."""
    given = [f for f in FIELDS if f in serving or f in explicit]
    costs = measure_step_costs(model) if model is not None and len(given) < len(FIELDS) else None
    current = {f: getattr(st, f) for f in FIELDS}
    batching = resolve(
        current,
        {f: current[f] for f in FIELDS if f in explicit},
        {f: current[f] for f in FIELDS if f in serving},
        costs,
    )
    if batching.values == current:
        return st, batching
    return Settings.model_validate({**st.model_dump(), **batching.values}), batching


def measure_step_costs(model: DecoderModel, rows: tuple[int, ...] = MEASURED_ROWS) -> StepCosts:
    """Time greedy decoder steps of `model` at each batch size of `rows` (the module doc)."""
    specials = {model.pad_id, model.eos_id, model.bos_id, model.start_id}
    ids = [i for i in range(4, 4 + 2 * SOURCE_TOKENS) if i < model.vocab_size and i not in specials]
    source = [*ids[: SOURCE_TOKENS - 1], model.eos_id]
    ms = {n: _step_ms(model, source, n) for n in rows}
    # The batches are gone, their encoder outputs with them: one more encoder run gives back the
    # encoder's arena.
    with model.releasing_memory():
        model.encode(np.array([source], dtype=np.int64), np.ones((1, len(source)), dtype=np.int64))
    return StepCosts(ms)


def _step_ms(model: DecoderModel, source: list[int], n: int) -> float:
    """The median thread CPU milliseconds of TIMED_STEPS greedy steps over n rows of `source`,
    after WARM_STEPS; then one step more, untimed, that gives back what the steps grew."""
    steps = WARM_STEPS + TIMED_STEPS
    batch = DecodeBatch.from_sources(model, [source] * n, list(range(n)), max_lens=[steps + 2] * n, want_scores=False)
    times = []
    for i in range(steps):
        t0 = time.thread_time()
        batch.step(model)
        if i >= WARM_STEPS:
            times.append(1000 * (time.thread_time() - t0))
    with model.releasing_memory():
        batch.step(model)
    return statistics.median(times)
