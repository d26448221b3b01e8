"""mtserve's torch model against the transformers model it was imported from.

- greedy: our `greedy_search` against transformers' `generate(num_beams=1, do_sample=False)`,
  token for token, both at most `max_new` tokens with </s> forced at the last one (mtserve's
  rule, transformers' forced_eos_token_id) and, for M2M100, the target-language token forced first;
- teacher forcing: log_softmax of both models' logits along transformers' greedy outputs, every
  position and every token of the vocabulary, both clipped at `LOG_PROB_FLOOR` (the export's
  measure, `export.checks.log_prob_diff`): tokens below e^-50 cannot change a search, and their
  log-probs (in the thousands for a trained model's unlikely tokens) are beyond fp32's 1e-4. The
  tokens transformers' generation suppresses (bad_words_ids: -inf there, mtserve's -1e4 logits
  bias here) are below the floor on both sides, so a ban lost in the conversion shows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from export.checks import LOG_PROB_FLOOR
from export.generate import greedy_search, pad_batch
from export.model import Transformer

TOLERANCE = 1e-4  # max |Δ log p| (clipped at LOG_PROB_FLOOR) accepted between the two models


@dataclass
class Parity:
    sentences: int
    identical: int
    max_abs_log_prob_diff: float

    def ok(self) -> bool:
        return self.identical == self.sentences and self.max_abs_log_prob_diff <= TOLERANCE


def _hf_greedy(hf: Any, model: Transformer, src: list[list[int]], forced: int | None, max_new: int) -> list[list[int]]:
    """transformers' greedy outputs: emitted tokens up to </s> (excluded), the forced one dropped."""
    cfg = model.cfg
    ids, mask = pad_batch(src, cfg.pad_id)
    out = hf.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=1,
        do_sample=False,
        max_new_tokens=max_new,
        forced_eos_token_id=cfg.eos_id,
        forced_bos_token_id=forced,
        decoder_start_token_id=cfg.start_id,
    )
    result = []
    for row in out[:, 1 + (forced is not None) :].tolist():
        result.append(row[: row.index(cfg.eos_id)] if cfg.eos_id in row else row)
    return result


def _max_log_prob_diff(
    hf: Any, model: Transformer, src: list[list[int]], tgt: list[list[int]], prefix: list[int], suppressed: list[int]
) -> float:
    """max |Δ log p| over every token and every position of `prefix + tgt` fed as decoder input,
    both sides clipped at LOG_PROB_FLOOR; transformers' `suppressed` tokens get -inf first, as its
    generation gives them."""
    cfg = model.cfg
    ids, mask = pad_batch(src, cfg.pad_id)
    rows = [prefix + t for t in tgt]
    dec = torch.full((len(rows), max(map(len, rows))), cfg.pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        dec[i, : len(r)] = torch.tensor(r)
    ours = torch.log_softmax(model(ids, mask, dec).float(), dim=-1).clamp(min=LOG_PROB_FLOOR)
    logits = hf(input_ids=ids, attention_mask=mask, decoder_input_ids=dec).logits.float()
    logits[..., suppressed] = float("-inf")
    theirs = torch.log_softmax(logits, dim=-1).clamp(min=LOG_PROB_FLOOR)
    worst = 0.0
    for i, r in enumerate(rows):
        worst = max(worst, float((ours[i, : len(r)] - theirs[i, : len(r)]).abs().max()))
    return worst


@torch.no_grad()
def compare(
    hf: Any,
    model: Transformer,
    src: list[list[int]],
    forced: int | None,
    suppressed: list[int],
    max_new: int = 24,
    batch_size: int = 100,
) -> Parity:
    """Greedy outputs and teacher-forced log-probabilities of both models on the sources `src`
    (ids each ending with </s>)."""
    identical, worst = 0, 0.0
    prefix = [model.cfg.start_id] + ([forced] if forced is not None else [])
    for start in range(0, len(src), batch_size):
        batch = src[start : start + batch_size]
        theirs = _hf_greedy(hf, model, batch, forced, max_new)
        ours = greedy_search(model, batch, a=0.0, b=max_new, forced=forced)
        identical += sum(h.tokens == t for h, t in zip(ours, theirs))
        worst = max(worst, _max_log_prob_diff(hf, model, batch, theirs, prefix, suppressed))
    return Parity(len(src), identical, worst)
