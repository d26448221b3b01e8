"""What every benchmark script's figures go through: percentiles of sorted samples, and the one
JSON line it ends with."""

from __future__ import annotations

import json
from pathlib import Path


def percentile(sorted_xs: list[float], q: float) -> float:
    if not sorted_xs:
        return float("nan")
    return sorted_xs[min(len(sorted_xs) - 1, int(q * len(sorted_xs)))]


def print_result(result: dict, json_path: str | None = None) -> None:
    """The benchmark scripts' output: one JSON line on stdout, and in `json_path` when given."""
    line = json.dumps(result)
    if json_path:
        Path(json_path).write_text(line + "\n")
    print(line)
