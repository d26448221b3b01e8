"""Interleaved pairs of two source trees on one machine: the translation service's costs
(benchmarks/translation_service.py: a call with a glossary, or an HTML call, against the plain
call of its text) on a server of a base revision and on a server of the working tree, each case
called on both in turn, so that the machine's drift falls on both alike.

    python -m benchmarks.ab_trees --base REV [--part glossary|html] [--models REPO] [--rounds 3]

The base revision is checked out into a temporary git worktree (removed at the end) and served
from there by the same interpreter and packages. `glossary` sends `glossary_cost`'s German
sentences, each with its one-entry glossary; `html` the HTML part's 300 sentences. Per case, per
tree: the median over the rounds of each call's time. Prints one JSON line: per tree the median
of the cases' ratios (with a glossary or as HTML, against plain) and its upper quartile, and the
median over cases of the working tree's time over the base's, for the plain calls and the others
(1.0: as fast)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.machine import machine
from benchmarks.processes import REPO, Server
from benchmarks.translation_service import Client, build_html_cases, corpus, glossary_candidates
from export.data import DEFAULT_DATA_DIR

SIDES = ("base", "work")


def quantile(values: Sequence[float], q: float) -> float:
    """The value at rank q of the sorted values (nearest rank below)."""
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def summary(times: dict[str, list[list[float]]]) -> dict[str, Any]:
    """From each call kind's times per case (`{side}.x` and `{side}.plain` for both sides, a list
    of rounds per case): per side the median and upper quartile of the per-case ratios x / plain,
    and across sides the median of the per-case ratios work / base."""
    med = {k: [statistics.median(t) for t in v] for k, v in times.items()}
    out: dict[str, Any] = {"n": len(med["base.x"])}
    for side in SIDES:
        ratios = [x / p for x, p in zip(med[f"{side}.x"], med[f"{side}.plain"])]
        out[side] = {"median_of_ratios": round(statistics.median(ratios), 3), "p75": round(quantile(ratios, 0.75), 3)}
    for kind in ("plain", "x"):
        out[f"work_over_base.{kind}"] = round(
            statistics.median(w / b for w, b in zip(med[f"work.{kind}"], med[f"base.{kind}"])), 3
        )
    return out


def calls(part: str, data: Path, sentences: int) -> tuple[list[Any], Callable[[Client, Any], Any], Callable]:
    """The part's cases, its call and the plain call of a case's text."""
    if part == "glossary":
        cases: list[Any] = glossary_candidates(corpus(data, "de"), "de")[:sentences]

        def x(c: Client, case: Any) -> Any:
            return c.one(case.text, "de", glossary=[c.pb.GlossaryEntry(source=case.term, target=case.target)])
    else:
        cases = build_html_cases(corpus(data, "de"), sentences)

        def x(c: Client, case: Any) -> Any:
            return c.one(case.markup, "de", text_type=c.pb.TEXT_TYPE_HTML)

    return cases, x, lambda c, case: c.one(case.text, "de")


def interleave(clients: dict[str, Client], cases: list[Any], x: Callable, plain: Callable, rounds: int) -> dict:
    """Each case's calls on both sides, in an order that alternates by case and round (which side
    first, and x or plain first)."""
    times: dict[str, list[list[float]]] = {f"{s}.{k}": [[] for _ in cases] for s in SIDES for k in ("x", "plain")}
    for r in range(rounds):
        for i, case in enumerate(cases):
            sides = SIDES if (r + i) % 2 == 0 else SIDES[::-1]
            kinds = (("x", x), ("plain", plain)) if (r + i) % 4 < 2 else (("plain", plain), ("x", x))
            for side in sides:
                for kind, call in kinds:
                    start = time.perf_counter()
                    call(clients[side], case)
                    times[f"{side}.{kind}"][i].append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    ap.add_argument("--part", choices=("glossary", "html"), default="glossary")
    ap.add_argument("--models", default=str(REPO / "models"), help="model repository (NAME/VERSION/)")
    ap.add_argument("--model-names", default="de-en,fr-en")
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_DATA_DIR))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sentences", type=int, default=0, help="cases (0: 200 for glossary, 300 for html)")
    ap.add_argument("--beam", type=int, default=4)
    args = ap.parse_args(argv)
    base = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{args.base}^{{commit}}"],
        capture_output=True,
        text=True,
    )
    if base.returncode != 0:
        ap.error(f"--base: {args.base!r} is not a revision of this repository")
    commit = base.stdout.strip()
    cases, x, plain = calls(args.part, args.data, args.sentences or (200 if args.part == "glossary" else 300))
    names = args.model_names.split(",")
    with tempfile.TemporaryDirectory(prefix="mtserve-ab-") as tmp:
        tree = Path(tmp) / "base"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(tree), commit], check=True)
        try:
            with (
                Server(args.models, models=names, tree=tree, log_prefix="mtserve-ab-base-") as a,
                Server(args.models, models=names, log_prefix="mtserve-ab-work-") as b,
            ):
                clients = {"base": Client(a.address, args.beam), "work": Client(b.address, args.beam)}
                for c in clients.values():  # warm both
                    for case in cases[:20]:
                        plain(c, case)
                times = interleave(clients, cases, x, plain, args.rounds)
                for c in clients.values():
                    c.close()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)
    result = {
        "benchmark": "ab_trees",
        "machine": machine(),
        "base_commit": commit,
        "part": args.part,
        "rounds": args.rounds,
        **summary(times),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
