"""Each text's language, or its segments' (`detect_texts`), for source_language "auto"
(service.repository.routing): the detector's rankings among the candidates, the threshold's
decision, and per segment the runs of one language to translate together. A segment below the
threshold takes the language of the segment before it (else after it; else the whole text's,
when that is decided); a text none of whose segments, nor the whole, is decided is Undecided.
The text's language is the one of most of its characters."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from service.engine import documents
from service.engine.work import Checkpoint
from service.runtime.language_id import Detected, LanguageDetector, Undecided, decide

# Texts (or segments) ranked between two checks of the request's deadline and cancellation.
DETECT_EVERY = 256


@dataclass(frozen=True)
class Part:
    """A span of a text (code points, end exclusive) and the language it is translated as, with
    the detector's probability of that language for the span; `decided`: that probability reached
    the threshold (else the span took a neighbour's language)."""

    start: int
    end: int
    language: str
    confidence: float
    decided: bool = True


@dataclass(frozen=True)
class Found:
    """A text's detection: its language (of most of its characters) and probability, the runs of
    one language to translate (`groups`) and, per segment, the segments' own detections."""

    language: str
    confidence: float
    groups: tuple[Part, ...]
    segments: tuple[Part, ...] = ()


def detect_texts(
    detector: LanguageDetector,
    texts: Sequence[str],
    candidates: list[str],
    threshold: float,
    split: str = "",
    point: Checkpoint | None = None,
) -> list[Found | Undecided]:
    """Each text's detection, or its Undecided; `split` (a documents split mode): per segment."""
    point = point or Checkpoint()
    whole = _ranked(detector, texts, candidates, point)
    if not split:
        out: list[Found | Undecided] = []
        for text, ranking in zip(texts, whole):
            d = decide(ranking, threshold)
            if isinstance(d, Undecided):
                out.append(d)
            else:
                out.append(Found(d.language, d.confidence, (Part(0, len(text), d.language, d.confidence),)))
        return out
    spans = []
    for text, ranking in zip(texts, whole):
        point.check()
        spans.append(documents.segment_spans(text, split, ranking[0][0]))
    flat = [text[a:b] for text, s in zip(texts, spans) for a, b in s]
    ranked = iter(_ranked(detector, flat, candidates, point))
    return [
        _per_segment(text, s, [next(ranked) for _ in s], ranking, threshold)
        for text, s, ranking in zip(texts, spans, whole)
    ]


def _ranked(
    detector: LanguageDetector, texts: Sequence[str], candidates: list[str], point: Checkpoint
) -> list[list[tuple[str, float]]]:
    out: list[list[tuple[str, float]]] = []
    for at in range(0, len(texts), DETECT_EVERY):
        point.check()
        out += detector.detect_batch(texts[at : at + DETECT_EVERY], candidates)
    return out


def _per_segment(
    text: str,
    spans: list[tuple[int, int]],
    rankings: list[list[tuple[str, float]]],
    whole: list[tuple[str, float]],
    threshold: float,
) -> Found | Undecided:
    """A text's detection from its segments': undecided segments take a neighbour's language."""
    decisions = [decide(r, threshold) for r in rankings]
    known = [d.language if isinstance(d, Detected) else None for d in decisions]
    overall = decide(whole, threshold)
    if not any(known):
        if isinstance(overall, Undecided):
            return overall
        known = [overall.language] * len(spans)
    else:
        last = next(lang for lang in known if lang)  # leading undecided segments: the first decided one's
        for k, lang in enumerate(known):
            last = known[k] = lang or last
    segments = tuple(
        Part(a, b, lang, dict(r)[lang], isinstance(d, Detected) and d.language == lang)
        for (a, b), lang, r, d in zip(spans, known, rankings, decisions)
        if lang
    )
    if not segments:  # no segment at all (blank text): the whole text's decision
        if isinstance(overall, Undecided):
            return overall
        return Found(overall.language, overall.confidence, (Part(0, len(text), overall.language, overall.confidence),))
    chars: dict[str, int] = {}
    for s in segments:
        chars[s.language] = chars.get(s.language, 0) + s.end - s.start
    language = max(chars, key=lambda lang: chars[lang])  # the first of the most: dicts keep order
    mine = [s for s in segments if s.language == language]
    confidence = sum(s.confidence * (s.end - s.start) for s in mine) / max(1, sum(s.end - s.start for s in mine))
    if len(chars) == 1:
        groups: tuple[Part, ...] = (Part(0, len(text), language, confidence),)
    else:
        runs: list[Part] = []
        for s in segments:
            if runs and runs[-1].language == s.language:
                runs[-1] = dataclasses.replace(runs[-1], end=s.end)
            else:
                runs.append(dataclasses.replace(s))
        groups = tuple(runs)
    return Found(language, confidence, groups, segments)
