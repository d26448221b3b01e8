"""Reference greedy and beam search in PyTorch over `Transformer.decode_step` (key/value cache).

Semantics that every other generator of this project must reproduce exactly:
- the source is `ids + [</s>]` (after the source-language token, where the model has one);
  decoding starts from the model's decoder start token (`cfg.start_id`, `<s>` for mtserve's own
  models) at position 0;
- `forced`, the target-language token of a multilingual model, is forced as the first emitted
  token with log p = 0 (as transformers' forced_bos_token_id does): it counts as an emitted token
  (for max_len and the length penalty) but is not part of the output;
- a row may emit at most `max_len = min(floor(a * src_len + b), max_positions - 1)` tokens, the
  final `</s>` included (`src_len` counts the source tokens with `</s>`); at its last allowed step
  `</s>` is forced;
- beam search ranks finished hypotheses by `sum(log p) / len ** length_penalty`, with `len` the
  number of emitted tokens including `</s>`; a sentence stops once `beam` hypotheses have
  finished; at each step the `2 * beam` best candidates are taken, those ending in `</s>` finish
  (when ranked within the first `beam`), the best `beam` of the rest go on;
- `beam == 1` is greedy search.

`use_cache=False` is the textbook loop: each step runs `Transformer.decode` over the whole prefix
(`<s>` + everything emitted) and keeps the last position, instead of one `decode_step` with the
key/value cache. Same results, quadratic work; the benchmarks time it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from export.model import ModelConfig, Transformer


@dataclass
class Hypothesis:
    tokens: list[int]  # emitted ids without the final </s>
    score: float  # length-normalised log-probability (greedy: plain sum)
    log_prob: float  # sum of log-probabilities, </s> included


def max_output_len(src_len: int, a: float, b: int, max_positions: int) -> int:
    return max(1, min(int(a * src_len + b), max_positions - 1))


def pad_batch(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    S = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), S), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    mask = (ids != pad_id).to(torch.long)
    return ids.to(device), mask.to(device)


def _prefix_log_probs(model: Transformer, emitted: torch.Tensor, memory, src_mask) -> torch.Tensor:
    """No cache: decode `<s> + emitted` (B, t+1) in full; log-probabilities of the next token (B, V)."""
    bos = torch.full((emitted.shape[0], 1), model.cfg.start_id, dtype=torch.long, device=emitted.device)
    logits, _ = model.decode(torch.cat([bos, emitted], dim=1), memory, src_mask)
    return torch.log_softmax(logits[:, -1].float(), dim=-1)


def _empty_cache(model: Transformer, B: int, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    cfg = model.cfg
    z = torch.zeros(B, cfg.n_heads, 0, cfg.d_k, device=device)
    return [(z, z) for _ in range(cfg.n_decoder_layers)]


@torch.no_grad()
def greedy_search(
    model: Transformer,
    src: list[list[int]],
    a: float = 1.5,
    b: int = 10,
    use_cache: bool = True,
    forced: int | None = None,
) -> list[Hypothesis]:
    """src: source ids each ending with </s>."""
    cfg, device = model.cfg, next(model.parameters()).device
    src_ids, src_mask = pad_batch(src, cfg.pad_id, device)
    B = len(src)
    memory = model.encode(src_ids, src_mask)
    cross = model.cross_kv(memory)
    max_len = torch.tensor([max_output_len(len(s), a, b, cfg.max_positions) for s in src], device=device)
    past = _empty_cache(model, B, device)
    past_mask = torch.zeros(B, 0, device=device)
    tokens = torch.full((B, 1), cfg.start_id, dtype=torch.long, device=device)
    out = torch.zeros(B, 0, dtype=torch.long, device=device)
    log_prob = torch.zeros(B, device=device)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(int(max_len.max())):
        if use_cache:
            positions = torch.full((B,), step, dtype=torch.long, device=device)
            lp, new_kv, _ = model.decode_step(tokens, positions, past, past_mask, cross, src_mask)
        else:
            lp = _prefix_log_probs(model, out, memory, src_mask)
        force = step >= max_len - 1  # (B,) last allowed step: </s>
        lp = torch.where(force[:, None], _eos_only(lp, cfg.eos_id), lp)
        if step == 0 and forced is not None:
            lp = _force_token(lp, forced)
        best_lp, nxt = lp.max(dim=-1)
        nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
        log_prob += torch.where(done, torch.zeros_like(best_lp), best_lp)
        out = torch.cat([out, nxt[:, None]], dim=1)
        done |= nxt == cfg.eos_id
        if bool(done.all()):
            break
        if use_cache:
            past = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(past, new_kv)]
            past_mask = torch.cat([past_mask, torch.ones(B, 1, device=device)], dim=1)
            tokens = nxt[:, None]
    hyps, skip = [], int(forced is not None)
    for i in range(B):
        toks = [t for t in out[i].tolist()[skip:] if t not in (cfg.eos_id, cfg.pad_id)]
        hyps.append(Hypothesis(toks, float(log_prob[i]), float(log_prob[i])))
    return hyps


def _force_token(lp: torch.Tensor, token: int) -> torch.Tensor:
    """`token` with log p = 0, every other token impossible (lp: (..., V))."""
    forced = torch.full_like(lp, float("-inf"))
    forced[..., token] = 0.0
    return forced


def _eos_only(lp: torch.Tensor, eos_id: int) -> torch.Tensor:
    forced = torch.full_like(lp, float("-inf"))
    forced[:, eos_id] = lp[:, eos_id]
    return forced


def _split_candidates(
    ranked: list[tuple[float, int, int]], K: int, eos_id: int
) -> tuple[list[tuple[float, int]], list[tuple[float, int, int]]]:
    """One sentence's 2K best candidates (score, beam, token), best first: those ending in </s>
    within the first K finish (score, beam); the K best of the others go on (score, beam, token).
    Candidates scored -inf (from dead beams) are dropped."""
    finishing: list[tuple[float, int]] = []
    going_on: list[tuple[float, int, int]] = []
    for rank, (s, beam, tok) in enumerate(ranked):
        if s == float("-inf"):
            break
        if tok == eos_id:
            if rank < K:
                finishing.append((s, beam))
            continue
        if len(going_on) < K:
            going_on.append((s, beam, tok))
    return finishing, going_on


def _next_beams(
    cand: torch.Tensor,
    K: int,
    history: torch.Tensor,
    finished: list[list[Hypothesis]],
    active: list[bool],
    last_step: list[bool],
    length_penalty: float,
    cfg: ModelConfig,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the candidates' scores `cand` (B, K*V), add the hypotheses that finish to `finished`,
    retire the sentences that are done from `active`, and return the next beams: their scores,
    the beam each continues and its new token, each (B, K) (dead beams: -inf, 0, pad)."""
    B, V, device = cand.shape[0], cand.shape[1] // K, cand.device
    top_scores, top_idx = cand.topk(2 * K, dim=1)  # (B, 2K)
    new_scores = torch.full((B, K), float("-inf"), device=device)
    new_src = torch.zeros(B, K, dtype=torch.long, device=device)
    new_tok = torch.full((B, K), cfg.pad_id, dtype=torch.long, device=device)
    ts, bi, ti = top_scores.tolist(), (top_idx // V).tolist(), (top_idx % V).tolist()
    for i in range(B):
        if not active[i]:
            continue
        finishing, going_on = _split_candidates(list(zip(ts[i], bi[i], ti[i])), K, cfg.eos_id)
        for s, beam in finishing:
            toks = history[i * K + beam].tolist()
            finished[i].append(Hypothesis(toks, s / (len(toks) + 1) ** length_penalty, s))
        for k, (s, beam, tok) in enumerate(going_on):
            new_scores[i, k], new_src[i, k], new_tok[i, k] = s, beam, tok
        if len(finished[i]) >= K or last_step[i] or not going_on:
            active[i] = False
            new_scores[i] = float("-inf")
    return new_scores, new_src, new_tok


@torch.no_grad()
def beam_search(
    model: Transformer,
    src: list[list[int]],
    beam: int = 4,
    length_penalty: float = 1.0,
    a: float = 1.5,
    b: int = 10,
    use_cache: bool = True,
    forced: int | None = None,
) -> list[Hypothesis]:
    if beam == 1:
        return greedy_search(model, src, a, b, use_cache, forced)
    cfg, device = model.cfg, next(model.parameters()).device
    B, K, V = len(src), beam, cfg.vocab_size
    src_ids, src_mask = pad_batch(src, cfg.pad_id, device)
    memory = model.encode(src_ids, src_mask)
    # Row b*K + k is beam k of sentence b. The cached step takes the cross-attention keys/values
    # once per sentence (decode_step folds the beams into the query); the textbook loop repeats
    # the memory for every beam.
    if use_cache:
        cross = model.cross_kv(memory)
    else:
        memory = memory.repeat_interleave(K, dim=0)
        src_mask = src_mask.repeat_interleave(K, dim=0)
    max_len = [max_output_len(len(s), a, b, cfg.max_positions) for s in src]
    past = _empty_cache(model, B * K, device)
    tokens = torch.full((B * K, 1), cfg.start_id, dtype=torch.long, device=device)
    history = torch.zeros(B * K, 0, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), device=device)
    scores[:, 0] = 0.0  # all beams start identical: only the first one is live
    finished: list[list[Hypothesis]] = [[] for _ in range(B)]
    active = [True] * B
    for step in range(max(max_len)):
        if use_cache:
            positions = torch.full((B * K,), step, dtype=torch.long, device=device)
            past_mask = torch.ones(B * K, step, device=device)
            lp, new_kv, _ = model.decode_step(tokens, positions, past, past_mask, cross, src_mask)
        else:
            lp = _prefix_log_probs(model, history, memory, src_mask)
        lp = lp.view(B, K, V)
        if step == 0 and forced is not None:
            lp = _force_token(lp, forced)
        last_step = [step >= n - 1 for n in max_len]
        for i in range(B):
            if last_step[i]:
                lp[i] = _eos_only(lp[i], cfg.eos_id)
        cand = (scores[:, :, None] + lp).view(B, K * V)
        scores, new_src, new_tok = _next_beams(cand, K, history, finished, active, last_step, length_penalty, cfg)
        if not any(active):
            break
        rows = (torch.arange(B, device=device)[:, None] * K + new_src).view(-1)  # (B*K,)
        history = torch.cat([history[rows], new_tok.view(-1, 1)], dim=1)
        if use_cache:
            past = [
                (torch.cat([pk[rows], k[rows]], 2), torch.cat([pv[rows], v[rows]], 2))
                for (pk, pv), (k, v) in zip(past, new_kv)
            ]
            tokens = new_tok.view(-1, 1)
    best = [max(f, key=lambda h: h.score) for f in finished]
    skip = int(forced is not None)  # the forced target-language token is not part of the output
    return [Hypothesis(h.tokens[skip:], h.score, h.log_prob) for h in best]
