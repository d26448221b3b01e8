"""The Transformer: shapes, masks, causality, the incremental decoder and the reference searches."""

import pytest
import torch

from export.generate import beam_search, greedy_search, pad_batch
from export.model import ModelConfig, Transformer, count_parameters

CFG = ModelConfig(
    vocab_size=50, d_model=32, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, d_ff=64, dropout=0.0, max_positions=64
)


@pytest.fixture(params=[True, False], ids=["pre_norm", "post_norm"])
def model(request):
    torch.manual_seed(0)
    cfg = ModelConfig(**{**CFG.to_dict(), "pre_norm": request.param})
    return Transformer(cfg).eval()


def random_batch(B=3, S=7, T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, CFG.vocab_size, (B, S), generator=g)
    tgt = torch.randint(4, CFG.vocab_size, (B, T), generator=g)
    tgt[:, 0] = CFG.bos_id
    return src, torch.ones(B, S, dtype=torch.long), tgt


def test_shapes(model):
    src, mask, tgt = random_batch()
    memory = model.encode(src, mask)
    assert memory.shape == (3, 7, CFG.d_model)
    logits, weights = model.decode(tgt, memory, mask, need_weights=True)
    assert logits.shape == (3, 5, CFG.vocab_size)
    assert weights.shape == (3, 5, 7)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 5))
    for k, v in model.cross_kv(memory):
        assert k.shape == v.shape == (3, CFG.n_heads, 7, CFG.d_k)


def test_tied_embeddings_share_one_matrix():
    model = Transformer(CFG)
    assert model.generator is None
    untied = Transformer(ModelConfig(**{**CFG.to_dict(), "tie_embeddings": False}))
    assert count_parameters(untied) == count_parameters(model) + CFG.vocab_size * CFG.d_model


def test_padding_does_not_change_real_positions(model):
    src, mask, tgt = random_batch(B=1, S=6)
    padded = torch.cat([src, torch.full((1, 4), CFG.pad_id)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    with torch.no_grad():
        mem = model.encode(src, mask)
        mem_p = model.encode(padded, padded_mask)
        torch.testing.assert_close(mem_p[:, :6], mem, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            model.decode(tgt, mem_p, padded_mask)[0], model.decode(tgt, mem, mask)[0], atol=1e-5, rtol=1e-5
        )


def test_fully_padded_row_is_finite(model):
    src, mask, tgt = random_batch(B=2)
    mask[1] = 0
    with torch.no_grad():
        logits, _ = model.decode(tgt, model.encode(src, mask), mask)
    assert torch.isfinite(logits).all()


def test_decoder_cannot_see_the_future(model):
    src, mask, tgt = random_batch(T=6)
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % CFG.vocab_size
    with torch.no_grad():
        memory = model.encode(src, mask)
        a, _ = model.decode(tgt, memory, mask)
        b, _ = model.decode(changed, memory, mask)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_incremental_decode_equals_full_recompute(model):
    src, mask, tgt = random_batch(B=2, T=8)
    mask[1, 5:] = 0
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = torch.log_softmax(model.decode(tgt, memory, mask)[0], dim=-1)
        cross = model.cross_kv(memory)
        past = [(torch.zeros(2, CFG.n_heads, 0, CFG.d_k),) * 2 for _ in range(CFG.n_decoder_layers)]
        past_mask = torch.zeros(2, 0)
        for t in range(tgt.shape[1]):
            lp, new, _ = model.decode_step(tgt[:, t : t + 1], torch.full((2,), t), past, past_mask, cross, mask)
            torch.testing.assert_close(lp, full[:, t], atol=1e-5, rtol=1e-5)
            past = [(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(past, new)]
            past_mask = torch.cat([past_mask, torch.ones(2, 1)], dim=1)


def test_rows_at_different_steps_with_padded_past(model):
    """One decoder call may hold rows at different positions; padding in the past is masked."""
    src, mask, tgt = random_batch(B=2, T=6)
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = torch.log_softmax(model.decode(tgt, memory, mask)[0], dim=-1)
        cross = model.cross_kv(memory)
        # Row 0 has decoded 4 tokens, row 1 only 2: row 1's past is padded with 2 garbage entries.
        caches = []
        for t in range(4):
            _, new, _ = model.decode_step(
                tgt[:, t : t + 1],
                torch.full((2,), t),
                caches[-1] if caches else [(torch.zeros(2, CFG.n_heads, 0, CFG.d_k),) * 2] * 2,
                torch.ones(2, t),
                cross,
                mask,
            )
            prev = caches[-1] if caches else [(torch.zeros(2, CFG.n_heads, 0, CFG.d_k),) * 2] * 2
            caches.append([(torch.cat([pk, k], 2), torch.cat([pv, v], 2)) for (pk, pv), (k, v) in zip(prev, new)])
        past = []
        for k, v in caches[-1]:
            k, v = k.clone(), v.clone()
            k[1, :, 2:], v[1, :, 2:] = 123.0, -55.0  # garbage that the mask must hide
            past.append((k, v))
        past_mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
        tokens = torch.stack([tgt[0, 4:5], tgt[1, 2:3]])
        lp, _, _ = model.decode_step(tokens, torch.tensor([4, 2]), past, past_mask, cross, mask)
    torch.testing.assert_close(lp[0], full[0, 4], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lp[1], full[1, 2], atol=1e-5, rtol=1e-5)


def test_greedy_with_cache_equals_greedy_by_full_recompute(tiny_model):
    model = tiny_model
    cfg = model.cfg
    src = [[(t % (cfg.vocab_size - 4)) + 4 for t in range(3, 3 + n)] + [cfg.eos_id] for n in (3, 9, 5)]
    hyps = greedy_search(model, src, a=1.0, b=5)
    for s, h in zip(src, hyps):
        ids, mask = pad_batch([s], cfg.pad_id)
        with torch.no_grad():
            memory = model.encode(ids, mask)
            out = [cfg.bos_id]
            max_len = min(int(1.0 * len(s) + 5), cfg.max_positions - 1)
            for step in range(max_len):
                logits, _ = model.decode(torch.tensor([out]), memory, mask)
                nxt = cfg.eos_id if step == max_len - 1 else int(logits[0, -1].argmax())
                out.append(nxt)
                if nxt == cfg.eos_id:
                    break
        assert h.tokens == [t for t in out[1:] if t != cfg.eos_id]


def test_beam_1_equals_greedy(tiny_model):
    model = tiny_model
    src = [
        [(7 * i + j) % (model.cfg.vocab_size - 4) + 4 for j in range(2 + i % 9)] + [model.cfg.eos_id] for i in range(20)
    ]
    greedy = greedy_search(model, src)
    beam1 = beam_search(model, src, beam=1)
    assert [h.tokens for h in greedy] == [h.tokens for h in beam1]


def test_beam_search_scores_are_consistent(tiny_model):
    model = tiny_model
    src = [[(5 * i + j) % (model.cfg.vocab_size - 4) + 4 for j in range(3 + i)] + [model.cfg.eos_id] for i in range(6)]
    greedy = greedy_search(model, src)
    beam = beam_search(model, src, beam=4, length_penalty=1.0)
    batched_vs_single = [beam_search(model, [s], beam=4)[0] for s in src]
    for g, b, single in zip(greedy, beam, batched_vs_single):
        assert b.tokens == single.tokens  # batching does not change results
        assert abs(b.score - single.score) < 1e-4
        assert abs(b.score - b.log_prob / (len(b.tokens) + 1)) < 1e-5
        # beam 4 finds a hypothesis at least as good as greedy under its own ranking (length-normalised)
        assert b.score >= g.log_prob / (len(g.tokens) + 1) - 1e-5


def test_max_length_rule(tiny_model):
    model = tiny_model
    src = [[10, 11, 12, model.cfg.eos_id]]
    for h in greedy_search(model, src, a=0.0, b=2) + beam_search(model, src, beam=3, a=0.0, b=2):
        assert len(h.tokens) <= 1  # at most 2 emitted tokens, the last of which is </s>


@pytest.mark.parametrize("beam", [1, 3])
def test_textbook_loop_without_cache_gives_the_same_hypotheses(tiny_model, beam):
    model = tiny_model
    src = [[(3 * i + j) % (model.cfg.vocab_size - 4) + 4 for j in range(2 + i)] + [model.cfg.eos_id] for i in range(5)]
    cached = beam_search(model, src, beam=beam)
    textbook = beam_search(model, src, beam=beam, use_cache=False)
    assert [h.tokens for h in textbook] == [h.tokens for h in cached]
    assert all(abs(a.score - b.score) < 1e-4 for a, b in zip(textbook, cached))
