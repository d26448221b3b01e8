"""The language of a text, among the source languages the served models accept (`source_language:
"auto"`): py3langid's naive Bayes model over byte n-grams (its weights ship inside the package,
nothing is downloaded; benchmarks/language_detection.py chose it, docs/language_detection.md).

`LanguageDetector.detect(text, candidates)` ranks the candidates, in the caller's own spelling
(ISO 639-1 "de" for mtserve's own, Marian and M2M100 models; NLLB "deu_Latn"; a region such as
"pt-BR" is read as its language), with probabilities normalized over the candidates. `decide` turns
a ranking and the `detection_threshold` setting into the detected language and its confidence, or
the top candidates for an INVALID_ARGUMENT naming `source_language` (`Undecided.error`).

Codes: `detector_code` maps an mtserve code to the model's label (ISO 639-1, or ISO 639-3 where the
language has no two-letter code, e.g. "ary"); NLLB codes go through their ISO 639-3 part (`ISO639_3`,
which names the NLLB variety of each language the model knows: "arb" for "ar", "zsm" for "ms").
Candidates the model does not know (`detectable` leaves them out) are not ranked: `detect` refuses
them rather than scoring them 0. Candidates that map to one label (zho_Hans and zho_Hant: the model
does not tell scripts apart) share its probability equally, so neither passes a threshold above 1/2.

Text without a letter (empty, whitespace, digits, punctuation) carries no evidence: every candidate
gets the same probability (and `decide` refuses it at any threshold above 1/len(candidates)).

Threads: load once per process (`LanguageDetector.shared()`: 1-2 s and 76 MiB resident; the model
is 100k byte n-gram features x 142 columns in float16 and its byte automaton). `detect` only reads
the loaded arrays and may run from any number of threads at once; the per-candidate-set models (the
model's columns of those languages, 200 KB a language) are built once under a lock and kept (up to
CACHED_SETS sets). A caption takes a median of 40-65 µs, most of it the byte walk, which holds the
GIL."""

from __future__ import annotations

import copy
import math
import re
import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from service.errors import InvalidArgument

# Per-candidate-set models kept; the served models' source sets are few, and a new one beyond
# this drops the oldest (rebuilt in about 1 ms when it comes back).
CACHED_SETS = 64
# Candidates an Undecided message names, best first.
SHOWN_CANDIDATES = 3

# ISO 639-3 (and the language part of NLLB's FLORES-200 codes) -> the model's label, for the
# languages the model knows. Where NLLB has a variety of a macrolanguage the model's label covers,
# the variety maps ("arb" Modern Standard Arabic -> "ar"; the Arabic dialects it has no label for
# stay undetectable); "ary", "arz", "yue" and others are the model's own three-letter labels.
ISO639_3 = {
    "afr": "af", "amh": "am", "ara": "ar", "arb": "ar", "asm": "as", "aze": "az", "azj": "az",
    "bel": "be", "bul": "bg", "ben": "bn", "bre": "br", "bos": "bs", "cat": "ca", "ces": "cs",
    "cze": "cs", "cym": "cy", "wel": "cy", "dan": "da", "deu": "de", "ger": "de", "ell": "el",
    "gre": "el", "eng": "en", "epo": "eo", "spa": "es", "est": "et", "ekk": "et", "eus": "eu",
    "baq": "eu", "fas": "fa", "per": "fa", "pes": "fa", "fin": "fi", "fra": "fr", "fre": "fr",
    "fry": "fy", "gle": "ga", "gla": "gd", "glg": "gl", "guj": "gu", "hau": "ha", "heb": "he",
    "hin": "hi", "hrv": "hr", "hat": "ht", "hun": "hu", "hye": "hy", "arm": "hy", "ind": "id",
    "ibo": "ig", "isl": "is", "ice": "is", "ita": "it", "jpn": "ja", "jav": "jv", "kat": "ka",
    "geo": "ka", "kaz": "kk", "khm": "km", "kan": "kn", "kor": "ko", "kur": "ku", "kmr": "ku",
    "kir": "ky", "lat": "la", "lug": "lg", "lin": "ln", "lao": "lo", "lit": "lt", "lav": "lv",
    "lvs": "lv", "mlg": "mg", "plt": "mg", "mkd": "mk", "mac": "mk", "mal": "ml", "mon": "mn",
    "khk": "mn", "mar": "mr", "msa": "ms", "may": "ms", "zsm": "ms", "mya": "my", "bur": "my",
    "nep": "ne", "npi": "ne", "nld": "nl", "dut": "nl", "nor": "no", "nob": "no", "nno": "nn",
    "orm": "om", "gaz": "om", "ori": "or", "ory": "or", "pan": "pa", "pus": "ps", "pbt": "ps",
    "pol": "pl", "por": "pt", "que": "qu", "quy": "qu", "ron": "ro", "rum": "ro", "rus": "ru",
    "san": "sa", "sin": "si", "slk": "sk", "slo": "sk", "slv": "sl", "som": "so", "sqi": "sq",
    "alb": "sq", "als": "sq", "srp": "sr", "swe": "sv", "swa": "sw", "swh": "sw", "tam": "ta",
    "tel": "te", "tha": "th", "tgl": "tl", "tur": "tr", "uig": "ug", "ukr": "uk", "urd": "ur",
    "uzb": "uz", "uzn": "uz", "vie": "vi", "xho": "xh", "yor": "yo", "zho": "zh", "chi": "zh",
    "zul": "zu", "dzo": "dz", "kin": "rw", "sme": "se", "sna": "sn", "sot": "st", "arg": "an",
    "fao": "fo", "ltz": "lb", "bak": "ba", "mlt": "mt", "oci": "oc", "tgk": "tg", "tuk": "tk",
    "tat": "tt", "vol": "vo", "wln": "wa", "grn": "gug",
}  # fmt: skip
# Two-letter codes the model spells otherwise: Norwegian Bokmål, and the old ISO 639-1 codes.
ALIASES = {"nb": "no", "iw": "he", "in": "id", "ji": "yi", "jw": "jv"}
# The model's labels that are no language: "no linguistic content".
NOT_LANGUAGES = frozenset({"zxx"})

_NLLB = re.compile(r"([a-z]{3})_[A-Z][a-z]{3}")  # FLORES-200: deu_Latn, zho_Hans
_LETTER = re.compile(r"[^\W\d_]")  # a letter of any script


def detector_code(code: str, labels: Collection[str]) -> str | None:
    """The model's label for an mtserve language code ("de", "de-DE", "deu", "deu_Latn", "__de__"),
    None when the model does not know the language."""
    code = code.strip().strip("_")
    nllb = _NLLB.fullmatch(code)
    base = nllb[1] if nllb else re.split(r"[-_]", code, maxsplit=1)[0].lower()
    base = ALIASES.get(base, base)
    if base in labels and base not in NOT_LANGUAGES:
        return base
    label = ISO639_3.get(base)
    return label if label in labels else None


@dataclass(frozen=True)
class Detected:
    """A text's language, as the request's candidates spell it, and its probability among them."""

    language: str
    confidence: float


@dataclass(frozen=True)
class Undecided:
    """No candidate reached the threshold: the best ones and their probabilities, best first."""

    candidates: tuple[tuple[str, float], ...]
    threshold: float

    def problem(self) -> str:
        shown = ", ".join(f"{lang} {p:.3f}" for lang, p in self.candidates)
        return (
            f'"auto": no language reached the detection threshold {self.threshold:g} '
            f"(best: {shown}); name the source language"
        )

    def error(self, prefix: str = "", where: str = "") -> InvalidArgument:
        """The INVALID_ARGUMENT naming `prefix` + source_language; `where`: the text it is about
        ("texts[2]"), said first."""
        return InvalidArgument(f"{prefix}source_language", f"{where}: {self.problem()}" if where else self.problem())


def decide(
    ranked: Sequence[tuple[str, float]], threshold: float, shown: int = SHOWN_CANDIDATES
) -> Detected | Undecided:
    """The best of `ranked` (a `detect` answer) when its probability is at least `threshold`, else
    the best `shown` candidates for the error message. Never a guess below the threshold."""
    if not ranked:
        raise ValueError("no candidate languages to decide among")
    language, confidence = ranked[0]
    if confidence >= threshold:
        return Detected(language, confidence)
    return Undecided(tuple(ranked[:shown]), threshold)


class LanguageDetector:
    """py3langid's model, loaded once; ranks a text's candidate languages (see the module's notes
    on codes and threads)."""

    _shared: ClassVar[LanguageDetector | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        import py3langid.langid as lid

        self._full = lid.LanguageIdentifier.from_model_file(lid.MODEL_FILE, norm_probs=True)
        self.languages: tuple[str, ...] = tuple(x for x in self._full.labels if x not in NOT_LANGUAGES)
        self._labels = frozenset(self.languages)
        self._by_set: dict[frozenset[str], Any] = {}
        self._lock = threading.Lock()

    @classmethod
    def loaded(cls) -> LanguageDetector | None:
        """The process's detector when `shared` has loaded it, else None (nothing is loaded)."""
        return cls._shared

    @classmethod
    def shared(cls) -> LanguageDetector:
        """The process's detector, loaded on the first call (every thread gets the same one)."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def label(self, code: str) -> str | None:
        """The model's label for an mtserve code, None when it does not know the language."""
        return detector_code(code, self._labels)

    def detectable(self, candidates: Collection[str]) -> list[str]:
        """The candidates the model knows, in their order: what `detect` may be asked about."""
        return [c for c in candidates if self.label(c) is not None]

    def detect(self, text: str, candidates: Collection[str]) -> list[tuple[str, float]]:
        """Every candidate and its probability that `text` is in it (summing to 1 over the
        candidates), best first; ties keep the candidates' order. ValueError for no candidates or
        one the model does not know (`detectable`)."""
        return self.detect_batch([text], candidates)[0]

    def detect_batch(self, texts: Sequence[str], candidates: Collection[str]) -> list[list[tuple[str, float]]]:
        """`detect` of each text, against one candidate set."""
        labels = self._candidate_labels(candidates)
        identifier = self._identifier(frozenset(labels.values()))
        return [_ranked(self._probabilities(identifier, text), labels) for text in texts]

    def _candidate_labels(self, candidates: Collection[str]) -> dict[str, str]:
        labels = {c: self.label(c) for c in dict.fromkeys(candidates)}
        unknown = [c for c, label in labels.items() if label is None]
        if unknown or not labels:
            raise ValueError(f"no language detection for {unknown or 'an empty candidate set'}")
        return {c: label for c, label in labels.items() if label is not None}

    def _identifier(self, labels: frozenset[str]) -> Any:
        """The model restricted to `labels`, built once per set: a shallow copy of the loaded one
        whose set_languages takes those columns (a copy of them; the full model is left as it is)."""
        found = self._by_set.get(labels)
        if found is not None:
            return found
        with self._lock:
            found = self._by_set.get(labels)
            if found is None:
                found = copy.copy(self._full)  # shares the loaded arrays; set_languages replaces its own
                found.set_languages(sorted(labels))
                if len(self._by_set) >= CACHED_SETS:
                    self._by_set.pop(next(iter(self._by_set)))
                self._by_set[labels] = found
            return found

    @staticmethod
    def _probabilities(identifier: Any, text: str) -> dict[str, float] | None:
        """Each label's probability; None for a text with no letter in it (no evidence)."""
        if not _LETTER.search(text):
            return None
        return {label: float(p) for label, p in identifier.rank(text)}


def _ranked(probabilities: dict[str, float] | None, labels: dict[str, str]) -> list[tuple[str, float]]:
    """The candidates by probability, best first: a label's probability split equally among the
    candidates that map to it, then normalized to sum to 1 (float rounding). No probabilities:
    every candidate the same."""
    if probabilities is None:
        return [(c, 1 / len(labels)) for c in labels]
    sharing: dict[str, int] = {}
    for label in labels.values():
        sharing[label] = sharing.get(label, 0) + 1
    scores = [(c, probabilities.get(label, 0.0) / sharing[label]) for c, label in labels.items()]
    total = math.fsum(p for _, p in scores)
    if total <= 0:
        scores = [(c, 1 / len(scores)) for c, _ in scores]
    else:
        scores = [(c, p / total) for c, p in scores]
    return sorted(scores, key=lambda cp: -cp[1])
