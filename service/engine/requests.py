"""What the engine's callers pass in and get back: request options, TranslateMany items and the
results of Translate, TranslateStream and Encode. Plain data, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.engine.languages import LanguagePair

TEXT = "text"  # TranslateOptions.text_type of plain text
TEXT_TYPES = (TEXT, "html", "xml")  # TranslateOptions.text_type


@dataclass(frozen=True)
class GlossaryEntry:
    """A request's glossary term: `source` (or one of its `forms`) is translated as `target`."""

    source: str
    target: str
    forms: tuple[str, ...] = ()


@dataclass
class TranslateOptions:
    beam_size: int = 0  # 0 = default
    max_output_tokens: int = 0  # 0 = the model's length rule only
    length_penalty: float | None = None
    return_scores: bool = False
    return_tokens: bool = False
    return_alignment: bool = False
    min_output_tokens: int = 0  # 0 = no minimum; else at least this many tokens before </s>
    num_hypotheses: int = 0  # 0 = 1; n > 1: TranslationResult.hypotheses, the n best
    sampling_topk: int = 0  # 0 or 1 = greedy; k > 1 samples among the k most likely tokens
    sampling_topp: float | None = None  # None = 1 (no nucleus cut); else in (0, 1]
    sampling_temperature: float | None = None  # None = 1; else > 0
    seed: int = 0  # 0 = random; else each text's generator derives from (seed, its index)
    # Forced start of each translation, part of it: one for every text (KServe's parameter,
    # TranslateStream's field) unless `target_prefixes` gives one per text (Translate's field).
    target_prefix: str = ""
    target_prefixes: list[str] = field(default_factory=list)
    # How each text is cut into rows (service.engine.documents): "sentences", "newlines" or "none".
    split: str = "sentences"
    # What the texts are (service.engine.markup): "text", "html" or "xml".
    text_type: str = "text"
    # Terms forced by the search (service.engine.terms, service.decoding.terms), and the named
    # glossary of the model version whose terms come first.
    glossary: list[GlossaryEntry] = field(default_factory=list)
    do_not_translate: list[str] = field(default_factory=list)
    glossary_id: str = ""
    # source_language "auto": detect (and route) each segment instead of each text.
    detect_per_segment: bool = False


@dataclass
class Alignment:
    source_tokens: list[str]
    target_tokens: list[str]
    weights: np.ndarray  # (len(target_tokens), len(source_tokens))


@dataclass
class Alternative:
    """One hypothesis of an n-best list (options.num_hypotheses)."""

    text: str
    score: float
    tokens: list[str]
    token_ids: list[int]


@dataclass
class AppliedTerm:
    """A glossary term or do-not-translate phrase matched in a text: the matched source text and
    its span in the text as sent, what the translation carries for it and where it landed in the
    translation's text (code points; -1, -1: it did not), and where the term came from
    ("glossary", "do_not_translate", "markup" or a named glossary's id)."""

    source: str
    target: str
    source_start: int
    source_end: int
    start: int
    end: int
    origin: str


@dataclass
class TranslationResult:
    text: str
    score: float | None  # None unless return_scores (greedy search then skips the log-softmax)
    tokens: list[str]
    token_ids: list[int]
    input_tokens: int
    output_tokens: int
    alignment: Alignment | None = None
    hypotheses: list[Alternative] = field(default_factory=list)  # num_hypotheses > 1: best first
    segments: list[Segment] = field(default_factory=list)  # the text's segments, in order
    applied_terms: list[AppliedTerm] = field(default_factory=list)  # in source order
    # source_language "auto": the detected language and its probability; the model that translated.
    detected_language: str = ""
    detected_confidence: float | None = None
    model: str = ""


@dataclass
class Segment:
    """One segment of a text (a sentence, or a line): its span in the text as sent, in code points
    (`text[start:end]`), and its translation (no segments of its own)."""

    start: int
    end: int
    translation: TranslationResult


@dataclass
class Chunk:
    text: str
    token_ids: list[int]


@dataclass
class StreamItem:
    """One item of a TranslateMany stream: a Translate call of its own."""

    id: str
    texts: list[str]
    options: TranslateOptions
    timeout: float | None = None  # seconds from arrival; None = only the stream's deadline
    model: str = ""  # NAME or NAME:VERSION; empty: the default model
    pair: LanguagePair = LanguagePair()  # the request's source_language / target_language


@dataclass
class EncodingResult:
    pooled: np.ndarray  # (d_model,)
    tokens: list[str]
    token_embeddings: np.ndarray | None  # (tokens, d_model)
