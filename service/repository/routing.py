"""source_language "auto": each text's language is detected (each segment's, with
`detect_per_segment`) among the source languages the served models accept, and the text goes to
the model serving that pair; the answers come back in request order with the detected language,
its probability and the model that translated them (docs/language_detection.md).

Candidates: with no model named, the source languages of the routable versions
(`ModelRegistry.routable`) that translate into the request's target language; with a model named,
every served source language, so that a text the model does not read is refused naming the
language it is in. Codes of one language spelled two ways by two models ("de", "deu_Latn") are one
candidate; codes that differ in script ("zho_Hans", "zho_Hant") stay apart and share the
detector's probability (so neither passes a threshold above 1/2). Languages the detector does not
know are no candidates.

Detection runs on the event loop for DETECT_INLINE_BYTES of text at most (0.25 µs a byte: about
0.25 ms), else on the text threads (service.engine.work); the detector is loaded off the loop on
the first "auto" request (1-2 s). Below `detection_threshold` a text is refused (INVALID_ARGUMENT
naming `source_language`, with its best candidates and their probabilities), never guessed.

Per segment: each text is split (options.split) with the splitter rules of its most likely
language as a whole, each segment is detected, and runs of consecutive segments of one language
are translated as one text with the request's split, then put back where they were (the
whitespace between them kept). A segment below the threshold takes the language of the segment
before it (else after it; else the whole text's, when that is decided) and reports its own
probability of that language; a text none of whose segments, nor the whole, is decided is
refused. The text's detected language is the one of most of its characters.

Each routed model gets one `Engine.translate` call (per language: a multilingual model gets one
call per source language, the language's token on each source) of at most max_texts_per_request
texts; the calls run concurrently, and an INVALID_ARGUMENT from one names the request's own
text (`texts[i]`, `target_prefixes[i]`). Knows nothing of gRPC."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass

from service.engine import documents
from service.engine.languages import LanguagePair, list_languages
from service.engine.requests import Chunk, Segment, TranslateOptions, TranslationResult
from service.engine.streaming import translate_stream
from service.errors import InvalidArgument
from service.repository.detection import Found, detect_texts
from service.repository.registry import ModelRegistry, ServedModel
from service.runtime.language_id import LanguageDetector, Undecided

AUTO = "auto"
# Bytes of text detected on the event loop; more goes to the text threads.
DETECT_INLINE_BYTES = 1024
# The metric's label for a text or segment below the threshold.
UNDECIDED = "undecided"

_SCRIPT = re.compile(r"[a-z]{3}_([A-Z][a-z]{3})")  # NLLB's FLORES-200 codes: deu_Latn
_INDEXED = re.compile(r"(.*)\b(texts|target_prefixes)\[(\d+)\]")


@dataclass(frozen=True)
class Candidates:
    """The languages to detect among: one code per language (the first spelling met) and every
    served spelling of it."""

    spellings: dict[str, tuple[str, ...]]

    @property
    def codes(self) -> list[str]:
        return list(self.spellings)


# -- the calls ----------------------------------------------------------------------------------


async def translate_detected(
    models: ModelRegistry,
    texts: list[str],
    opts: TranslateOptions,
    timeout: float | None,
    pair: LanguagePair,
    threshold: float,
    field_prefix: str = "",
    model: str = "",
    model_field: str = "model",
) -> list[TranslationResult]:
    """The translations of `texts` (source_language "auto": `pair.source` is AUTO), each routed
    by its detected language (or each run of segments, `opts.detect_per_segment`); `model`: the
    model the request names, which must read the detected languages."""
    deadline = None if timeout is None else time.monotonic() + timeout
    detector = await _detector()
    named, candidates = _candidates(detector, models, pair, field_prefix, model, model_field)
    engine = (named or models.routable()[0]).engine
    engine.check_texts(texts)
    if opts.target_prefixes and len(opts.target_prefixes) != len(texts):
        raise InvalidArgument(
            f"{field_prefix}target_prefixes",
            f"{len(opts.target_prefixes)} prefixes for {len(texts)} texts (give none, or one per text)",
        )
    size = engine.check_sizes(
        texts,
        prefixes=opts.target_prefixes or [opts.target_prefix],
        prefix_field=f"{field_prefix}target_prefix{'es' if opts.target_prefixes else ''}",
    )
    per_segment = opts.detect_per_segment and opts.split != documents.SPLIT_NONE
    outcomes = await engine.work.run(
        lambda point: detect_texts(
            detector, texts, candidates.codes, threshold, opts.split if per_segment else "", point
        ),
        size,
        _left(deadline),
        inline_bytes=DETECT_INLINE_BYTES,
    )
    found = _settle(models, outcomes, field_prefix, "texts")
    with ExitStack() as leases:
        routes = _routes(models, leases, found, candidates, pair, named, field_prefix, model_field)
        calls = _calls(texts, opts, found, routes, pair.target, engine.settings.max_texts_per_request)
        done = await _run(calls, opts, _left(deadline), field_prefix)
    codes = {language: code for language, (_, code) in routes.items()}
    return [_assemble(texts[i], found[i], done[i], codes) for i in range(len(texts))]


async def stream_detected(
    models: ModelRegistry,
    text: str,
    opts: TranslateOptions,
    timeout: float | None,
    pair: LanguagePair,
    threshold: float,
    model: str = "",
) -> AsyncIterator[Chunk | TranslationResult]:
    """TranslateStream with source_language "auto": the text's language detected as a whole, then
    its translation streamed from the model serving that pair (the result carries the detection)."""
    if opts.detect_per_segment:
        raise InvalidArgument(
            "options.detect_per_segment",
            "TranslateStream detects the language of the whole text (Translate and TranslateMany detect per segment)",
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    detector = await _detector()
    named, candidates = _candidates(detector, models, pair, "", model, "model")
    engine = (named or models.routable()[0]).engine
    size = engine.check_sizes([text], "text")
    outcomes = await engine.work.run(
        lambda point: detect_texts(detector, [text], candidates.codes, threshold, "", point),
        size,
        _left(deadline),
        inline_bytes=DETECT_INLINE_BYTES,
    )
    found = _settle(models, outcomes, "", "text")[0]
    with ExitStack() as leases:
        route = _routes(models, leases, [found], candidates, pair, named, "", "model", "text")
        served, source = route[found.language]
        events = translate_stream(served.engine, text, opts, _left(deadline), LanguagePair(source, pair.target))
        async for event in events:
            if isinstance(event, TranslationResult):
                event.detected_language, event.detected_confidence = source, found.confidence
            yield event


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


async def _detector() -> LanguageDetector:
    """The process's detector, loaded on a thread the first time (not on the event loop)."""
    loaded = LanguageDetector.loaded()
    return loaded if loaded is not None else await asyncio.to_thread(LanguageDetector.shared)


# -- candidates and routes ----------------------------------------------------------------------


def _candidates(
    detector: LanguageDetector, models: ModelRegistry, pair: LanguagePair, prefix: str, model: str, model_field: str
) -> tuple[ServedModel | None, Candidates]:
    """The model the request names (None: routed by pair) and the languages to detect among."""
    named: ServedModel | None = None
    if model:
        named = models.resolve(model, model_field, LanguagePair(target=pair.target))
        served = [named] + [s for s in models.all() if s is not named]
        codes = [c for s in served for c in s.engine.languages.spec.source]
    else:
        if not pair.target:
            raise InvalidArgument(
                f"{prefix}target_language",
                '"auto" needs the target language: the text\'s language is detected among the source '
                "languages of the models that translate into it",
            )
        codes = [
            c
            for s in models.routable()
            for c in s.engine.languages.spec.source
            if s.engine.languages.serves(LanguagePair(c, pair.target))
        ]
        if not codes:  # NOT_FOUND: nobody translates into the target (or UNAVAILABLE: no model)
            models.resolve("", model_field, LanguagePair(target=pair.target))
    found = _merge(codes, _labels(detector, codes))
    if not found.spellings:
        raise InvalidArgument(
            f"{prefix}source_language",
            f'"auto": the language detector knows none of the candidate languages ({list_languages(sorted(set(codes)))}); '
            "name the source language",
        )
    return named, found


def _labels(detector: LanguageDetector, codes: list[str]) -> dict[str, str]:
    """Each code the detector knows and its label."""
    return {c: label for c in dict.fromkeys(codes) if (label := detector.label(c)) is not None}


def _merge(codes: list[str], labels: dict[str, str]) -> Candidates:
    """One candidate per label, unless the codes of a label name different scripts."""
    by_label: dict[str, list[str]] = {}
    for c in dict.fromkeys(codes):
        if c in labels:
            by_label.setdefault(labels[c], []).append(c)
    spellings: dict[str, tuple[str, ...]] = {}
    for same in by_label.values():
        scripts = {m[1] for c in same if (m := _SCRIPT.fullmatch(c))}
        if len(scripts) > 1:
            spellings.update({c: (c,) for c in same})
        else:
            spellings[same[0]] = tuple(same)
    return Candidates(spellings)


def _routes(
    models: ModelRegistry,
    leases: ExitStack,
    found: list[Found],
    candidates: Candidates,
    pair: LanguagePair,
    named: ServedModel | None,
    prefix: str,
    model_field: str,
    field: str = "texts",
) -> dict[str, tuple[ServedModel, str]]:
    """Each detected language's model (leased until `leases` closes) and the code that model reads
    it by. A named model that reads none of a language's spellings: INVALID_ARGUMENT."""
    routes: dict[str, tuple[ServedModel, str]] = {}
    for i, f in enumerate(found):
        for part in f.segments or f.groups:
            if part.language in routes:
                continue
            spellings = candidates.spellings[part.language]
            if named is not None:
                read = [c for c in spellings if c in named.engine.languages.spec.source]
                if not read:
                    raise InvalidArgument(
                        f"{prefix}source_language",
                        f'"auto" detected {part.language} ({part.confidence:.3f}) in {_name(field, i)}, which model '
                        f"{named.ref} does not read (it reads {list_languages(named.engine.languages.spec.source)}); "
                        "name a model that does, or no model",
                    )
                target = (named, read[0])
            else:
                target = _by_language(models, spellings, pair.target, model_field)
            served, code = target
            routes[part.language] = (
                leases.enter_context(models.lease(served.ref, model_field, LanguagePair(code, pair.target))),
                code,
            )
    return routes


def _by_language(
    models: ModelRegistry, spellings: Sequence[str], target: str, model_field: str
) -> tuple[ServedModel, str]:
    """The first routable version that translates one of `spellings` into `target`."""
    for served in models.routable():
        for code in spellings:
            if served.engine.languages.serves(LanguagePair(code, target)):
                return served, code
    # The candidates came from these versions: only an unload since could leave none.
    return models.resolve("", model_field, LanguagePair(spellings[0], target)), spellings[0]


def _name(field: str, i: int) -> str:
    """A text's field: texts[i], or TranslateStream's text."""
    return f"{field}[{i}]" if field == "texts" else field


def _settle(models: ModelRegistry, outcomes: list[Found | Undecided], prefix: str, field: str) -> list[Found]:
    """Each detection counted (mtserve_language_detections_total); the first text below the
    threshold refused."""
    counter = models.metrics.language_detections
    for outcome in outcomes:
        if isinstance(outcome, Undecided):
            counter.labels(UNDECIDED).inc()
            continue
        for part in outcome.segments or outcome.groups[:1]:
            counter.labels(part.language if part.decided else UNDECIDED).inc()
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, Undecided):
            raise outcome.error(prefix, _name(field, i))
    return [o for o in outcomes if isinstance(o, Found)]


# -- translation --------------------------------------------------------------------------------


@dataclass
class _Call:
    """One Engine.translate call: texts (whole, or runs of segments) of one language to one model."""

    served: ServedModel
    pair: LanguagePair
    texts: list[str] = dataclasses.field(default_factory=list)
    prefixes: list[str] = dataclasses.field(default_factory=list)
    origins: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (text, group) of each


def _calls(
    texts: list[str],
    opts: TranslateOptions,
    found: list[Found],
    routes: dict[str, tuple[ServedModel, str]],
    target: str,
    most: int,
) -> list[_Call]:
    """The engine calls: per route, the groups in request order, at most `most` texts a call; a
    text's target prefix goes to its first group."""
    open_calls: dict[str, _Call] = {}
    calls: list[_Call] = []
    for i, (text, f) in enumerate(zip(texts, found)):
        prefix = opts.target_prefixes[i] if opts.target_prefixes else opts.target_prefix
        for g, part in enumerate(f.groups):
            call = open_calls.get(part.language)
            if call is None or len(call.texts) >= most:
                served, code = routes[part.language]
                call = open_calls[part.language] = _Call(served, LanguagePair(code, target))
                calls.append(call)
            whole = part.start == 0 and part.end == len(text)
            call.texts.append(text if whole else text[part.start : part.end])
            call.prefixes.append(prefix if g == 0 else "")
            call.origins.append((i, g))
    return calls


async def _run(
    calls: list[_Call], opts: TranslateOptions, timeout: float | None, prefix: str
) -> list[list[TranslationResult]]:
    """The calls run concurrently; each text's groups' results, in order. One call failing cancels
    the others."""
    tasks = [asyncio.ensure_future(_translate(call, opts, timeout, prefix)) for call in calls]
    try:
        answers = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    out: dict[int, dict[int, TranslationResult]] = {}
    for call, results in zip(calls, answers):
        for (i, g), r in zip(call.origins, results):
            out.setdefault(i, {})[g] = r
    return [[groups[g] for g in sorted(groups)] for _, groups in sorted(out.items())]


async def _translate(
    call: _Call, opts: TranslateOptions, timeout: float | None, prefix: str
) -> list[TranslationResult]:
    """One call; an INVALID_ARGUMENT naming one of its texts names the request's text instead."""
    if opts.target_prefix or any(opts.target_prefixes):
        opts = dataclasses.replace(opts, target_prefix="", target_prefixes=call.prefixes)
    try:
        return await call.served.engine.translate(call.texts, opts, timeout, call.pair, prefix)
    except InvalidArgument as e:
        m = _INDEXED.fullmatch(e.field)
        if m is None:
            raise
        field = f"{m[1]}{m[2]}[{call.origins[int(m[3])][0]}]"
        raise InvalidArgument(field, e.message[len(e.field) + 2 :]) from None


# -- the answers --------------------------------------------------------------------------------


def _assemble(text: str, found: Found, results: list[TranslationResult], codes: dict[str, str]) -> TranslationResult:
    """A text's translation from its groups' (in order, a group covering the whole text when it is
    one), with its detection, each language spelled as its model reads it (`codes`)."""
    if len(found.groups) == 1:
        out = results[0]
    else:
        spans = [(g.start, g.end) for g in found.groups]
        at, starts = 0, []  # where each group's translation starts in the joined text
        length = 0
        for (a, b), r in zip(spans, results):
            length += a - at
            starts.append(length)
            length += len(r.text)
            at = b
        out = TranslationResult(
            text=documents.join(text, spans, [r.text for r in results]),
            score=documents.mean_score(results),
            tokens=[t for r in results for t in r.tokens],
            token_ids=[t for r in results for t in r.token_ids],
            input_tokens=sum(r.input_tokens for r in results),
            output_tokens=sum(r.output_tokens for r in results),
            segments=[
                Segment(s.start + g.start, s.end + g.start, s.translation)
                for g, r in zip(found.groups, results)
                for s in r.segments
            ],
            applied_terms=[
                dataclasses.replace(
                    t,
                    source_start=t.source_start + g.start,
                    source_end=t.source_end + g.start,
                    start=t.start + o if t.start >= 0 else t.start,
                    end=t.end + o if t.end >= 0 else t.end,
                )
                for g, o, r in zip(found.groups, starts, results)
                for t in r.applied_terms
            ],
            model=results[0].model,
        )
    for seg in out.segments if found.segments else ():
        # The detected segment it overlaps most, within its group: the engine split the group
        # with the group's language's rules, the detection with the whole text's.
        group = max((g for g in found.groups if g.start <= seg.start), key=lambda g: g.start, default=found.groups[0])
        inside = [p for p in found.segments if group.start <= p.start and p.end <= group.end] or list(found.segments)
        best = max(inside, key=lambda p: min(p.end, seg.end) - max(p.start, seg.start))
        seg.translation.detected_language = codes[best.language]
        seg.translation.detected_confidence = best.confidence
    out.detected_language, out.detected_confidence = codes[found.language], found.confidence
    return out
