"""Offline translation (`generate`): source id lists sorted by length into batches, each decoded
by a `DecodeBatch` to its end, finished sentences dropped in bulk; results in input order.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from service.decoding.batch import DecodeBatch
from service.decoding.model import DecoderModel
from service.decoding.results import Hypothesis

# Offline `generate` drops finished sentences from a batch once they are this share of it.
COMPACT_FRACTION = 0.25


def generate(
    model: DecoderModel,
    src_ids_lists: Sequence[Sequence[int]],
    beam: int = 4,
    length_penalty: float = 1.0,
    max_len_a: float = 1.5,
    max_len_b: int = 10,
    batch_size: int = 64,
    want_alignment: bool = False,
    want_scores: bool = True,
    target_prefixes: Sequence[Sequence[int]] | None = None,
    min_len: int = 0,
) -> list[Hypothesis]:
    """Translate source id lists (each ending with </s>) offline: sorted by length into batches of
    at most `batch_size` sentences; results in input order. `want_scores=False`: greedy
    hypotheses come without scores (None), which spares the step its log-softmax.
    `target_prefixes`: each sentence's forced first tokens (a multilingual model's target
    language token), left out of its hypothesis; `min_len`: see `DecodeBatch`."""
    order = sorted(range(len(src_ids_lists)), key=lambda i: len(src_ids_lists[i]))
    out: dict[Hashable, Hypothesis] = {}
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        batch = DecodeBatch.from_sources(
            model,
            [src_ids_lists[i] for i in idx],
            idx,
            beam=beam,
            length_penalty=length_penalty,
            max_len_a=max_len_a,
            max_len_b=max_len_b,
            want_alignment=want_alignment,
            want_scores=want_scores,
            min_lens=min_len,
            target_prefixes=None if target_prefixes is None else [target_prefixes[i] for i in idx],
        )
        while len(batch):
            for f in batch.step(model):
                out[f.key] = f.hypothesis()
            # Finished rows ride along until they are a quarter of the batch (or all of it): each
            # filter copies the cache, so it is done in bulk, as the server's scheduler does.
            active = batch.active_keys()
            if not active:
                break  # nothing left to decode: no need to empty the batch
            if len(active) <= (1 - COMPACT_FRACTION) * batch.n_sentences:
                batch.filter(active)
    return [out[i] for i in range(len(src_ids_lists))]
