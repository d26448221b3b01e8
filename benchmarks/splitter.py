"""Exact-split accuracy of sentence splitters on the hand-made German, French and English cases of
tests/service/engine/data/splitter_cases.json (abbreviations, numbers, ordinals, quotes, ellipses,
sentences without final punctuation, names that stay whole):
the measurement behind the choice of the serving path's splitter (docs/documents.md).

    python -m benchmarks.splitter            # the table, per language
    python -m benchmarks.splitter --failures # and each case a splitter gets wrong
    python -m benchmarks.splitter --corpus   # lines of multi30k that mtserve splits more than the package
    python -m benchmarks.splitter --speed    # ms to split 100 kB texts (the best of 5), as JSON

A case counts when the splitter returns exactly its sentences (each stripped of surrounding
whitespace) for the sentences joined by single spaces. Candidates that are not installed are
reported as such."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

CASES = Path(__file__).resolve().parent.parent / "tests/service/engine/data/splitter_cases.json"
Splitter = Callable[[str, str], list[str]]


def _pysbd() -> Splitter:
    import pysbd

    segmenters = {lang: pysbd.Segmenter(language=lang, clean=False) for lang in ("de", "fr", "en")}
    return lambda lang, text: list(segmenters[lang].segment(text))


def _sentencex() -> Splitter:
    import sentencex

    return lambda lang, text: list(sentencex.segment(lang, text))


def _moses() -> Splitter:
    from sentence_splitter import SentenceSplitter

    splitters = {lang: SentenceSplitter(language=lang) for lang in ("de", "fr", "en")}
    return lambda lang, text: list(splitters[lang].split(text))


def _blingfire() -> Splitter:
    import blingfire

    return lambda lang, text: blingfire.text_to_sentences(text).split("\n")


def _service() -> Splitter:
    from service.engine.documents import sentence_spans

    return lambda lang, text: [text[a:b] for a, b in sentence_spans(text, lang)]


CANDIDATES: dict[str, Callable[[], Splitter]] = {
    "pysbd": _pysbd,
    "sentencex": _sentencex,
    "sentence-splitter (Moses prefixes)": _moses,
    "blingfire": _blingfire,
    "mtserve (service.engine.documents)": _service,
}


def extra_splits(data_dir: Path) -> None:
    """For each of multi30k's train and val lines (captions: single sentences, a few of two or
    three), whether mtserve's splitter finds more sentences than sentence-splitter as shipped: what
    its own prefixes and rules split that the package keeps whole. Prints the count and the lines."""
    from export.data import read_lines, split_path

    mtserve, package = _service(), _moses()
    for lang in ("de", "en", "fr"):
        lines = [t for split in ("train", "val") for t in read_lines(split_path(data_dir, split, lang)) if t.strip()]
        more = [t for t in lines if len(mtserve(lang, t.strip())) > len(package(lang, t.strip()))]
        print(f"{lang}: {len(more)} of {len(lines)} lines split into more sentences than by sentence-splitter")
        for t in more:
            print(f"    {t}")


def speed(runs: int = 5) -> dict[str, dict[str, float]]:
    """Milliseconds (the best of `runs`) that mtserve's splitting (service.engine.documents.
    segment_spans, German) and the package's SentenceSplitter.split take for 100 kB texts: one
    opener after every word, 25,000 short sentences, and prose."""
    from service.engine.documents import SPLIT_SENTENCES, segment_spans

    texts = {
        "openers": ("x Der " * 16667)[:100000],
        "short_sentences": "Ja. " * 25000,
        "prose": ("Ein Mann geht mit seinem Hund im Park spazieren, und die Sonne scheint. " * 1400)[:100000],
    }
    package = _moses()
    out: dict[str, dict[str, float]] = {}
    for name, text in texts.items():
        row = {}
        for who, split in (("mtserve", lambda t: segment_spans(t, SPLIT_SENTENCES, "de")), ("package", None)):
            best = float("inf")
            for _ in range(runs if split else 1):
                start = time.perf_counter()
                if split:
                    split(text)
                else:
                    package("de", text)
                best = min(best, time.perf_counter() - start)
            row[f"{who}_ms"] = round(best * 1000, 1)
        out[name] = {"bytes": len(text.encode()), **row}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--failures", action="store_true", help="print each case a splitter gets wrong")
    parser.add_argument("--corpus", action="store_true", help="count multi30k lines split more than by the package")
    parser.add_argument("--speed", action="store_true", help="time splitting 100 kB texts (JSON)")
    args = parser.parse_args()
    if args.speed:
        print(json.dumps(speed(), indent=2))
        return
    if args.corpus:
        from export.data import DEFAULT_DATA_DIR

        extra_splits(Path(DEFAULT_DATA_DIR))
        return
    cases = json.loads(CASES.read_text(encoding="utf-8"))
    langs = sorted({c["lang"] for c in cases})
    counts = {lang: sum(c["lang"] == lang for c in cases) for lang in langs}
    print(f"{len(cases)} cases ({', '.join(f'{lang}: {n}' for lang, n in counts.items())})")
    print(f"| splitter | {' | '.join(langs)} | all | ms per case |")
    print(f"|---|{'---|' * len(langs)}---|---|")
    for name, make in CANDIDATES.items():
        try:
            split = make()
        except ImportError as e:
            print(f"| {name} | not installed ({e.name}) |")
            continue
        right = dict.fromkeys(langs, 0)
        start = time.perf_counter()
        wrong = []
        for c in cases:
            got = [s.strip() for s in split(c["lang"], " ".join(c["sentences"])) if s.strip()]
            if got == c["sentences"]:
                right[c["lang"]] += 1
            else:
                wrong.append((c["lang"], got))
        ms = (time.perf_counter() - start) * 1000 / len(cases)
        cols = " | ".join(f"{right[lang]}/{counts[lang]}" for lang in langs)
        print(f"| {name} | {cols} | {sum(right.values())}/{len(cases)} | {ms:.2f} |")
        if args.failures:
            for lang, got in wrong:
                print(f"    {lang}: {got}")


if __name__ == "__main__":
    main()
