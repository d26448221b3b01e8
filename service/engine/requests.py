"""What the engine's callers pass in and get back: request options, TranslateMany items and the
results of Translate, TranslateStream and Encode. Plain data, no gRPC."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass
class Alignment:
    source_tokens: list[str]
    target_tokens: list[str]
    weights: np.ndarray  # (len(target_tokens), len(source_tokens))


@dataclass
class TranslationResult:
    text: str
    score: float | None  # None unless return_scores (greedy search then skips the log-softmax)
    tokens: list[str]
    token_ids: list[int]
    input_tokens: int
    output_tokens: int
    alignment: Alignment | None = None


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
