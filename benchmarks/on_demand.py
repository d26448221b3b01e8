"""Models loaded on demand under a memory budget: which versions a server loads at start, and for
requests that alternate between two models, each request's wait for a load (a cold start, 0 when
the model is loaded), what each load measured (RSS after less before) and the evictions.

    python -m benchmarks.on_demand --repository models --budget-mb 150 --precision fp32

Prints JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from service.engine.requests import TranslateOptions
from service.server import Server
from service.settings import Settings


async def measure(repository: Path, budget_mb: int, precision: str, names: list[str]) -> dict:
    st = Settings.model_validate(
        {
            "address": "127.0.0.1:0",
            "model_repository": repository,
            "metrics_port": 0,
            "memory_budget_mb": budget_mb,
            "decode_workers": 1,
            "engine_process": False,
            "precision": precision,
        }
    )
    srv = Server(st)
    await srv.start()
    reg = srv.models
    out: dict = {
        "budget_mb": budget_mb,
        "loaded_at_start": sorted(f"{n}:{v}" for n, v in reg.served),
        "available_at_start": sorted(f"{n}:{v}" for n, v in reg.available),
    }
    rows = []
    for name in names:
        t0 = time.perf_counter()
        async with reg.use(name) as s:
            waited = time.perf_counter() - t0
            await s.engine.translate(["Ein Hund ."], TranslateOptions(beam_size=1, max_output_tokens=8))
        rows.append(
            {
                "request_to": name,
                "wait_for_load_s": round(waited, 3),
                "resident_mb": round(s.resident_bytes / 2**20, 1),
                "loaded_after": sorted(f"{n}:{v}" for n, v in reg.served),
            }
        )
    out["requests"] = rows
    sample = reg.metrics.registry.get_sample_value
    out["evictions"] = {
        e.name: sample("mtserve_model_evictions_total", {"model": e.name, "version": e.version}) or 0
        for e in reg.index()
    }
    await srv.drain()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, default=Path("models"))
    p.add_argument("--budget-mb", type=int, default=150)
    p.add_argument("--precision", default="int8")
    p.add_argument("--requests", default="fr-en,de-en,fr-en,de-en", help="the models asked, in order")
    a = p.parse_args()
    print(json.dumps(asyncio.run(measure(a.repository, a.budget_mb, a.precision, a.requests.split(","))), indent=1))


if __name__ == "__main__":
    main()
