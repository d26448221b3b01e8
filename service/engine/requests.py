"""What the engine's callers pass in and get back: request options, TranslateMany items and the
results of Translate, TranslateStream and Encode. Plain data, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from service.engine.languages import LanguagePair


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
