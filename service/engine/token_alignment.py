"""The decoder's alignment of a translated row as spans and links, for placing markup
(service.engine.markup_text): the source tokens' spans in the text, the target tokens' spans in
the translation, and each target token's source token."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.runtime.tokenizer import WORD_STARTS, TextTokenizer


def source_span(
    at: int, size: int, starts: Sequence[int], ends: Sequence[int], start: int, end: int
) -> tuple[int, int]:
    """A token's span of a segment's normalised text as a span of the block's text (the segment
    starts at `at` and holds `size` characters; `starts`, `ends`: normalize_with_offsets')."""
    first = starts[start] if start < len(starts) else size
    return at + first, at + (ends[end - 1] if end > start else first)


def target_spans(
    tokenizer: TextTokenizer, ids: list[int], text: str
) -> tuple[tuple[tuple[int, int], ...], tuple[bool, ...]]:
    """Each token's span of `text` (the decoded `ids`, stripped), found by decoding one more token
    at a time (a token that ends inside a character, as byte-level BPE's may, gets an empty span:
    the character goes to the token that completes it), and whether it begins a word."""
    prefixes = tokenizer.decode_prefixes(ids)
    full = prefixes[-1] if prefixes else tokenizer.decode(ids)
    shift = len(full) - len(full.lstrip())
    spans: list[tuple[int, int]] = []
    done = 0
    size, limit = len(full), len(text)
    for part in prefixes:
        end = len(part)
        if not full.startswith(part):  # a character this token only begins, or a decoding that moved
            while end > done and part[end - 1] == "\ufffd" and (end > size or full[end - 1] != "\ufffd"):
                end -= 1
            if not full.startswith(part[done:end], done):
                end = done
        end = min(max(end, done), size)
        start = max(done - shift, 0)
        stop = min(max(end - shift, start), limit)
        start = min(start, stop)
        while start < stop and text[start].isspace():
            start += 1  # a token's span starts at its first character (only spaces: empty, at its end)
        spans.append((start, stop))
        done = end
    starts = [(tokenizer.id_to_token(i) or "").startswith(WORD_STARTS) for i in ids]
    return tuple(spans), tuple(starts)


def links(matrix: np.ndarray | None, targets: int, lead: int, sources: int) -> tuple[int, ...]:
    """Each target token's source token, from its attention over the source's own tokens (after
    the `lead` language tokens, before </s>); -1: none. Attention rows alone link an article to the
    noun it precedes (the step that writes "a" already looks at "Gitarre"), so the links are one
    to one, strongest first (competitive linking, as word aligners do): a token links to the
    source token it holds the largest remaining weight on, once that token is not taken. A token
    left over keeps its row's argmax where the token before it took that source token (the rest
    of a word's translation: "ice" "cream" for "Eis"), else it links to none (a word with no
    counterpart in the source, which the projection places by its neighbours)."""
    if matrix is None or not sources or not targets:
        return (-1,) * targets
    weights = np.asarray(matrix, dtype=np.float32)[:targets, lead : lead + sources]
    if weights.shape != (targets, sources):
        weights = np.pad(weights, ((0, targets - weights.shape[0]), (0, sources - weights.shape[1])))
    row = weights.argmax(axis=1).tolist()
    # One to one, strongest first (competitive linking).
    negated = -weights.ravel()
    order = negated.argsort(kind="stable").tolist()
    flat_weights = (-negated).tolist()
    won: dict[int, int] = {}  # source -> target
    link = [-1] * targets
    for flat in order:
        if flat_weights[flat] <= 0:
            break
        t, s = divmod(flat, sources)
        if link[t] < 0 and s not in won:
            link[t], won[s] = s, t
            if len(won) == sources or len(won) == targets:  # every source or every target token linked
                break
    links = []
    for t in range(targets):
        s = row[t]
        if link[t] >= 0:
            links.append(link[t])
        elif flat_weights[t * sources + s] > 0 and won.get(s) == t - 1:
            links.append(s)  # the rest of the translation of a word the token before it won
        else:
            links.append(-1)
    return tuple(links)
