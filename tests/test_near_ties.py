"""tests/near_ties.py's assertions on made-up log-probabilities: what they accept (equal outputs,
outputs that part at a near-tie, also where only one side's text is known and its words are split
into other tokens) and what they refuse (outputs that part where the reference is sure)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from tests.near_ties import (
    INT8_TIE,
    assert_equal_up_to_a_near_tie,
    assert_text_equal_up_to_a_near_tie,
    first_difference,
)

EOS = 0
# A byte-level vocabulary in miniature: "Ġ" a leading space; "Ã" and "¼" the two bytes of "ü".
PIECES = ["</s>", "ĠA", "Ġdog", "Ġruns", "Ġwalks", "Ġdo", "gs", "Ġr", "uns", "ĠgrÃ", "¼n", "Ġ."]
ID = {p: i for i, p in enumerate(PIECES)}


def ids(*pieces: str) -> list[int]:
    return [ID[p] for p in pieces]


def detokenize(tokens: Sequence[int]) -> str:
    """As a byte-level decoder with the server's strip: "ü" cut after its first byte is U+FFFD."""
    text = "".join(PIECES[t] for t in tokens if t != EOS).replace("Ġ", " ")
    return text.replace("Ã¼", "ü").replace("Ã", "\ufffd").replace("¼", "\ufffd").strip()


def reference(want: Sequence[int], near: dict[tuple[int, ...], dict[str, float]]):
    """log_probs(prefix): -0.1 for want's next token after its own prefixes (</s> after want), -10
    for every other token, but for those that `near` gives for that prefix."""

    def log_probs(prefix: Sequence[int]) -> np.ndarray:
        lp = np.full(len(PIECES), -10.0)
        j = len(prefix)
        if list(prefix) == list(want[:j]):
            lp[want[j] if j < len(want) else EOS] = -0.1
        for piece, value in near.get(tuple(prefix), {}).items():
            lp[ID[piece]] = value
        return lp

    return log_probs


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_tokens_equal_up_to_a_near_tie():
    want = ids("ĠA", "Ġdog", "Ġruns")
    close = reference(want, {tuple(ids("ĠA", "Ġdog")): {"Ġruns": -1.0, "Ġwalks": -1.0 - INT8_TIE / 2}})
    assert_equal_up_to_a_near_tie(want, want, close, EOS)
    assert_equal_up_to_a_near_tie(ids("ĠA", "Ġdog", "Ġwalks", "Ġ."), want, close, EOS)
    sure = reference(want, {tuple(ids("ĠA", "Ġdog")): {"Ġruns": -0.1, "Ġwalks": -3.0}})
    with pytest.raises(AssertionError, match="differ at token 2"):
        assert_equal_up_to_a_near_tie(ids("ĠA", "Ġdog", "Ġwalks"), want, sure, EOS)


def test_text_equal_up_to_a_near_tie_where_the_words_differ():
    want = ids("ĠA", "Ġdog", "Ġruns")
    close = reference(want, {tuple(ids("ĠA", "Ġdog")): {"Ġruns": -1.0, "Ġwalks": -1.2}})
    assert_text_equal_up_to_a_near_tie("A dog runs", want, close, EOS, detokenize)
    assert_text_equal_up_to_a_near_tie("A dog walks .", want, close, EOS, detokenize)
    sure = reference(want, {tuple(ids("ĠA", "Ġdog")): {"Ġruns": -0.1, "Ġwalks": -3.0}})
    with pytest.raises(AssertionError, match="up to a near-tie"):
        assert_text_equal_up_to_a_near_tie("A dog walks .", want, sure, EOS, detokenize)
    with pytest.raises(AssertionError, match="up to a near-tie"):  # another sentence altogether
        assert_text_equal_up_to_a_near_tie("Two men sit", want, close, EOS, detokenize)


def test_text_equal_up_to_a_near_tie_where_a_word_is_split_otherwise():
    """want's "Ġdog" fits "A dogs" as text, but the other side took "Ġdo" "gs" there: it parted
    at token 1, where the near-tie is, not at token 2."""
    want = ids("ĠA", "Ġdog", "Ġruns")
    split = reference(want, {tuple(ids("ĠA")): {"Ġdog": -0.5, "Ġdo": -0.6}})
    assert_text_equal_up_to_a_near_tie("A dogs", want, split, EOS, detokenize)
    sure = reference(want, {tuple(ids("ĠA")): {"Ġdog": -0.1, "Ġdo": -4.0}})
    with pytest.raises(AssertionError, match=r"tokens \[0, 1, 2\]"):
        assert_text_equal_up_to_a_near_tie("A dogs", want, sure, EOS, detokenize)


def test_text_equal_up_to_a_near_tie_at_the_end_and_within_a_character():
    want = ids("ĠA", "Ġdog")
    # the other side ended one token early, or went on past want's </s>
    early = reference(want, {tuple(ids("ĠA")): {"Ġdog": -0.8, "</s>": -0.9}})
    assert_text_equal_up_to_a_near_tie("A", want, early, EOS, detokenize)
    on = reference(want, {tuple(want): {"</s>": -0.5, "Ġruns": -0.6}})
    assert_text_equal_up_to_a_near_tie("A dog runs", want, on, EOS, detokenize)
    with pytest.raises(AssertionError):
        assert_text_equal_up_to_a_near_tie(
            "A dog runs", want, reference(want, {tuple(want): {"</s>": -0.1}}), EOS, detokenize
        )
    # the token that parts cuts "ü" after its first byte: its text ends with U+FFFD, still a prefix
    grun = reference(want, {tuple(want): {"</s>": -0.5, "ĠgrÃ": -0.6}})
    assert_text_equal_up_to_a_near_tie("A dog grün", want, grun, EOS, detokenize)
