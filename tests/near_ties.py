"""Comparing token outputs of two different int8 kernels (imported as `tests.near_ties`).

ONNX Runtime picks its int8 kernels by CPU: AVX-512 VNNI on AMD Zen 4 and 5, AMX on Intel Sapphire
Rapids and later, and per operator (DynamicQuantizeMatMul's per-row int8 logits against
MatMulNBits' blocks). Two such kernels agree on log-probabilities within a tolerance, not bit for
bit, so at a near-tie of the two best tokens the search may take either. What holds on every
x86-64 CPU: the two outputs are equal up to their first difference, and there the fp32
reference's log-probabilities of the two tokens are within `INT8_TIE` of each other. Where the
same kernel runs on both sides, tests keep exact equality instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

# The largest gap (nats) between two tokens' fp32 log-probabilities at which two int8 kernels may
# choose differently: their log-probabilities differ by up to 0.1 from each other (an Intel AMX
# against an AMD VNNI run of the one-row steps) and by about as much from fp32's.
INT8_TIE = 0.3

# log_probs(prefix) -> (V,): the fp32 reference's log-probabilities of the next token after the
# output tokens `prefix` (the decoder's start and any forced tokens implied).
NextLogProbs = Callable[[Sequence[int]], np.ndarray]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where a and b differ (the shorter one's end counts), None if equal."""
    for j, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return j
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_equal_up_to_a_near_tie(
    got: Sequence[int], want: Sequence[int], log_probs: NextLogProbs, eos_id: int, tie: float = INT8_TIE
) -> None:
    """got and want (output tokens without </s>) are equal, or first differ where the reference's
    log-probabilities of their two tokens are within `tie` nats."""
    j = first_difference(got, want)
    if j is None:
        return
    lp = log_probs(list(want[:j]))
    a = got[j] if j < len(got) else eos_id
    b = want[j] if j < len(want) else eos_id
    gap = abs(float(lp[a]) - float(lp[b]))
    assert gap <= tie, f"outputs differ at token {j} ({a} against {b}) where fp32's gap is {gap:.3f} > {tie} nats"


def torch_next_log_probs(model, src_ids: Sequence[int]) -> NextLogProbs:
    """NextLogProbs of an `export.model.Transformer` for one source, by teacher forcing."""
    import torch

    src = torch.tensor([list(src_ids)])
    mask = torch.ones_like(src)

    def log_probs(prefix: Sequence[int]) -> np.ndarray:
        tgt = torch.tensor([[model.cfg.start_id, *prefix]])
        with torch.no_grad():
            logits = model(src, mask, tgt)[0, -1]
        return torch.log_softmax(logits.float(), dim=-1).numpy()

    return log_probs


def assert_text_equal_up_to_a_near_tie(
    got_text: str,
    want: Sequence[int],
    log_probs: NextLogProbs,
    eos_id: int,
    detokenize: Callable[[Sequence[int]], str],
    tie: float = INT8_TIE,
) -> None:
    """`assert_equal_up_to_a_near_tie` where one side is known as text only (the command-line
    client's output file): got_text is the detokenized output of some token sequence `got` that
    equals want up to a near-tie. Text does not say where `got` parted from want (a word may be
    split into other tokens), so this asserts what must then hold: at some position j where
    want[:j]'s text still fits got_text, a token t other than want[j] (</s> past want's end) within
    `tie` nats of it in the fp32 reference continues want[:j] into a prefix of got_text (or ends
    it there, if t is </s>). `detokenize(ids)`: the text of ids as the server writes it (stripped)."""

    def fits(ids: Sequence[int]) -> bool:
        # a prefix's text: the bytes of a character cut at its end decode as U+FFFD; drop them
        return got_text.startswith(detokenize(list(ids)).rstrip("\ufffd"))

    if detokenize(list(want)) == got_text:
        return
    parted = []
    for j in range(len(want) + 1):
        lp = log_probs(list(want[:j]))
        w = want[j] if j < len(want) else eos_id
        for t in np.flatnonzero(np.abs(lp - lp[w]) <= tie).tolist():
            if t == w:
                continue
            ends = t == eos_id
            if (detokenize(list(want[:j])) == got_text) if ends else fits([*want[:j], t]):
                return
        parted.append(j)
        if j < len(want) and not fits(want[: j + 1]):
            break  # got_text has left want's text: got parted from want at j or before
    raise AssertionError(
        f"{got_text!r} is not {detokenize(list(want))!r} up to a near-tie: at none of tokens {parted} does a "
        f"token within {tie} nats of want's in fp32 continue into it"
    )
