"""One decoded row as a TranslationResult: its text, token strings, score, alignment and n-best
list, as the request's options ask."""

from __future__ import annotations

import numpy as np

from service.decoding.results import Finished
from service.engine.requests import Alignment, Alternative, TranslateOptions, TranslationResult
from service.errors import Internal
from service.runtime.tokenizer import TextTokenizer


def token_strings(tokenizer: TextTokenizer, vocab_size: int, ids: list[int]) -> list[str]:
    """The token strings of `ids`: each one's vocabulary entry, `<unk>` for an id of the model
    that no entry names (service.runtime.tokenizer). Every id comes from this tokenizer or from
    the model exported with it, so one past the model's vocabulary means they disagree."""
    for i in ids:
        if not 0 <= i < vocab_size:
            raise Internal(f"token id {i} is outside the model's vocabulary of {vocab_size}")
    token = tokenizer.token
    return [token(i) for i in ids]


def row_result(
    tokenizer: TextTokenizer, vocab_size: int, src: list[int], finished: Finished, opts: TranslateOptions
) -> TranslationResult:
    ids = list(finished.tokens)
    # Token strings only when the caller asked for them: this runs for every sentence.
    tokens = token_strings(tokenizer, vocab_size, ids) if opts.return_tokens or opts.return_alignment else []
    result = TranslationResult(
        text=tokenizer.decode(ids).strip(),
        score=None if finished.score is None else float(finished.score),
        tokens=tokens,
        token_ids=ids,
        input_tokens=len(src),
        output_tokens=len(ids) + 1,
    )
    if opts.return_alignment and finished.alignment is not None:
        result.alignment = Alignment(
            source_tokens=token_strings(tokenizer, vocab_size, src),
            target_tokens=tokens + ["</s>"],
            weights=np.asarray(finished.alignment, dtype=np.float32)[: len(ids) + 1, : len(src)],
        )
    result.hypotheses = [
        Alternative(
            text=tokenizer.decode(h.tokens).strip(),
            score=float("-inf") if h.score is None else float(h.score),
            tokens=token_strings(tokenizer, vocab_size, h.tokens) if opts.return_tokens else [],
            token_ids=list(h.tokens),
        )
        for h in finished.hypotheses
    ]
    return result
