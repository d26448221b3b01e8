"""The plan processes (service.engine.plan_processes): the same plans as on the text threads,
errors as raised there, and the caller answered at its deadline while a worker still splits."""

from __future__ import annotations

import asyncio
import time

import pytest

from contract.manifest import load_manifest
from service.engine import documents
from service.engine.plan_processes import PlanProcesses
from service.errors import DeadlineExceeded, InvalidArgument
from service.runtime.tokenizer import load_tokenizer

PROSE = "Ein Mann mit einem roten Hut spielt. Er singt! „Kommst du mit?“ Sie nickte. "


def _rules(max_rows: int = 2048) -> documents.Rules:
    return documents.Rules(
        split="sentences",
        language="de",
        lead=(),
        eos_id=2,
        limit=16,
        max_text_bytes=100_000,
        max_rows=max_rows,
        rows_bound=f"max_queue_size ({max_rows}), the most one request can queue",
    )


@pytest.fixture(scope="module")
def processes():
    pool = PlanProcesses(1)
    yield pool
    pool.close()


def test_the_plans_are_those_of_the_text_threads(processes, tiny_onnx_dir):
    tokenizer = load_tokenizer(tiny_onnx_dir, load_manifest(tiny_onnx_dir, verify_checksums=False))
    texts = [PROSE * 40, "Hallo Welt.\n\nZweiter Absatz. Ein sehr langer Satz " + "und noch mehr " * 30]
    got = asyncio.run(processes.plans(tiny_onnx_dir, texts, "texts", _rules(), 60))
    assert got == documents.plan_texts(texts, "texts", _rules(), tokenizer)
    assert any(len(rows) > 1 for rows in got[1].rows)  # a sentence cut for length


def test_errors_come_back_as_raised(processes, tiny_onnx_dir):
    with pytest.raises(InvalidArgument) as e:
        asyncio.run(processes.plans(tiny_onnx_dir, ["Ja. " * 30, "Nein. " * 30], "texts", _rules(50), 60))
    assert str(e.value).startswith("texts[1]: texts up to here make 60 sentences, over max_queue_size (50)")
    assert e.value.field == "texts[1]"


def test_a_deadline_answers_in_time(processes, tiny_onnx_dir):
    asyncio.run(processes.plans(tiny_onnx_dir, ["Hallo."], "texts", _rules(), 60))  # a worker started
    start = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        asyncio.run(processes.plans(tiny_onnx_dir, [("x Der " * 16667)[:100000]] * 10, "texts", _rules(10**6), 0.3))
    assert time.monotonic() - start < 1.5
