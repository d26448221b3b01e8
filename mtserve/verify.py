"""`mtserve verify` (or `python -m mtserve.verify`): measure an ONNX export against PyTorch.

For a model dir: export the graphs if missing or stale (else reuse them), then report
- the max abs difference of the decoder's log-probabilities, ORT vs PyTorch, over random padded
  batches of real source sentences and `--steps` teacher-forced decode steps (each side keeps its
  own key/value cache; the tokens fed are PyTorch's greedy choices);
- how many greedy translations of a split (default: all of test_2016_flickr) are identical token
  for token between the ORT generator and the PyTorch reference (and, with --beam K > 1, the
  same for beam search);
as one JSON line on stdout. The source sentences are `SPLIT.SRC` with SRC the model's `src_lang`
(config.json) unless `--src-lang` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import torch

from export.checkpoint import load_model
from export.data import DEFAULT_DATA_DIR, read_parallel
from export.generate import beam_search
from export.to_onnx import ensure_exported
from mtserve.evaluate import resolve_languages


def log_prob_parity(
    tmodel, omodel, sources: list[list[int]], batches: int = 4, batch_size: int = 16, steps: int = 60, seed: int = 0
) -> float:
    """Max |log p_ORT - log p_torch| over `batches` random padded batches of `sources` and
    `steps` decode steps each."""
    rng = np.random.default_rng(seed)
    steps = min(steps, tmodel.cfg.max_positions - 1)
    worst = 0.0
    t = torch.from_numpy
    for _ in range(batches):
        pick = rng.choice(len(sources), size=min(batch_size, len(sources)), replace=False)
        src = [sources[i] for i in pick]
        S = max(len(s) for s in src)
        ids = np.full((len(src), S), omodel.pad_id, dtype=np.int64)
        for i, s in enumerate(src):
            ids[i, : len(s)] = s
        mask = (ids != omodel.pad_id).astype(np.int64)
        B = len(src)
        _, ck, cv = omodel.encode(ids, mask)
        with torch.no_grad():
            tcross = tmodel.cross_kv(tmodel.encode(t(ids), t(mask)))
        step = (
            FusedLogProbs(omodel, B, steps, ck, cv, mask)
            if omodel.graph == "fused"
            else PortableLogProbs(omodel, B, ck, cv, mask)
        )
        tpast = [
            (torch.zeros(B, omodel.n_heads, 0, omodel.d_k), torch.zeros(B, omodel.n_heads, 0, omodel.d_k))
        ] * omodel.n_layers
        tokens = np.full((B, 1), omodel.bos_id, dtype=np.int64)
        for p in range(steps):
            pos = np.full(B, p, dtype=np.int64)
            log_probs = step(tokens, pos)
            with torch.no_grad():
                tlp, tnew, _ = tmodel.decode_step(t(tokens), t(pos), tpast, torch.ones(B, p), tcross, t(mask))
            worst = max(worst, float(np.abs(log_probs - tlp.numpy()).max()))
            tpast = [(torch.cat([a, k], 2), torch.cat([b, v], 2)) for (a, b), (k, v) in zip(tpast, tnew)]
            tokens = tlp.argmax(-1, keepdim=True).numpy()
    return worst


class PortableLogProbs:
    """The portable decoder step's log-probabilities, step after step, its cache grown by the graph."""

    def __init__(self, omodel, B: int, ck, cv, mask):
        self.omodel, self.ck, self.cv, self.mask = omodel, ck, cv, mask
        self.pk, self.pv, self.pm = omodel.empty_past(B)

    def __call__(self, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        out = self.omodel.step(tokens, pos, self.pk, self.pv, self.pm, self.ck, self.cv, self.mask, log_probs=True)
        self.pk, self.pv = out.present_k, out.present_v
        self.pm = np.ones((len(tokens), self.pm.shape[1] + 1), dtype=np.float32)
        assert out.log_probs is not None
        return out.log_probs


class FusedLogProbs:
    """The fused decoder step's log-probabilities, step after step, over a cache of `steps` slots."""

    def __init__(self, omodel, B: int, steps: int, ck, cv, mask):
        L, H, dk = omodel.n_layers, omodel.n_heads, omodel.d_k
        self.session = omodel.decoder
        self.cache = [np.zeros((B, H, steps, dk), dtype=np.float32) for _ in range(2 * L)]
        self.names = ["log_probs"] + [f"present_{kv}_{i}" for i in range(L) for kv in ("key", "value")]
        self.feed = {
            "self_mask": np.ones((B, steps), dtype=np.int32),
            "src_mask": mask.astype(np.int32),
            "top_k": np.array([1], dtype=np.int64),
            "beam_width": np.array([1], dtype=np.int32),
            "cache_indirection": np.zeros((B, 1, steps), dtype=np.int32),
        }
        for i in range(L):
            self.feed[f"cross_key_{i}"], self.feed[f"cross_value_{i}"] = ck[i], cv[i]
        self.L = L

    def __call__(self, tokens: np.ndarray, pos: np.ndarray) -> np.ndarray:
        feed = dict(self.feed, tokens=tokens, positions=pos[:, None], past_sequence_length=pos[:1].astype(np.int32))
        for i in range(self.L):
            feed[f"cache_key_{i}"], feed[f"cache_value_{i}"] = self.cache[2 * i], self.cache[2 * i + 1]
        log_probs, *self.cache = self.session.run(self.names, feed)
        return log_probs


def agreement(tmodel, omodel, sources: list[list[int]], beam: int, batch_size: int) -> dict:
    from service.decoding.generator import generate

    forced = omodel.prefixes()[1]  # a multilingual model's target-language token, forced first
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    ref: list = [None] * len(sources)
    t0 = time.perf_counter()
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        for i, h in zip(
            idx, beam_search(tmodel, [sources[i] for i in idx], beam=beam, forced=forced[0] if forced else None)
        ):
            ref[i] = h
    t_torch = time.perf_counter() - t0
    t0 = time.perf_counter()
    prefixes = [forced] * len(sources)
    got = generate(omodel, sources, beam=beam, batch_size=batch_size, target_prefixes=prefixes)
    t_onnx = time.perf_counter() - t0
    same = [r.tokens == g.tokens for r, g in zip(ref, got)]
    unscored = {}
    if beam == 1:  # greedy search as the server runs it when no score is asked for (the argmax step)
        plain = generate(omodel, sources, beam=1, batch_size=batch_size, want_scores=False, target_prefixes=prefixes)
        unscored = {"identical_without_scores": sum(r.tokens == g.tokens for r, g in zip(ref, plain))}
    return {
        "identical": int(sum(same)),
        **unscored,
        "sentences": len(sources),
        "identical_ratio": round(sum(same) / max(len(same), 1), 4),
        "first_differences": [i for i, s in enumerate(same) if not s][:10],
        "max_abs_score_diff_when_identical": round(
            max((abs(r.score - g.score) for r, g, s in zip(ref, got, same) if s), default=0.0), 6
        ),
        "torch_seconds": round(t_torch, 2),
        "onnx_seconds": round(t_onnx, 2),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="models/de-en/1", help="model dir")
    p.add_argument("--onnx-dir", help="export dir (default: MODEL/onnx; exported there when missing or stale)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8", "fp16"])
    p.add_argument(
        "--graph",
        default="auto",
        choices=["auto", "portable", "fused"],
        help="the decoder step: auto (the fused one where the export has it for the CPU), portable or fused",
    )
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src-lang", help="source language of the data files (default: the model's src_lang)")
    p.add_argument("--tgt-lang", help="reference language of the data files (default: the model's tgt_lang)")
    p.add_argument("--limit", type=int, help="first N sentences only (default: the whole split)")
    p.add_argument("--batches", type=int, default=4, help="random padded batches for the log-prob check")
    p.add_argument("--steps", type=int, default=60, help="decode steps per batch for the log-prob check")
    p.add_argument("--beam", type=int, default=1, help="also compare beam search of this width (> 1)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch and ORT intra-op threads (0 = defaults)")


def run(args) -> dict:
    t0 = time.perf_counter()
    if args.threads:
        torch.set_num_threads(args.threads)
    onnx_dir = ensure_exported(args.model, args.precision, args.onnx_dir)
    from service.runtime.onnx_model import OnnxSeq2Seq

    omodel = OnnxSeq2Seq(onnx_dir, precision=args.precision, intra_op_threads=args.threads, graph=args.graph)
    tmodel = load_model(args.model)
    src_text, _ = read_parallel(args.data, args.split, *resolve_languages(args, "torch"))
    if args.limit:
        src_text = src_text[: args.limit]
    sources = omodel.source_ids(src_text)
    result = {
        "model": str(args.model),
        "onnx_dir": str(onnx_dir),
        "precision": args.precision,
        "graph": omodel.graph,
        "max_abs_log_prob_diff": log_prob_parity(tmodel, omodel, sources, args.batches, 16, args.steps),
        "log_prob_check": {"batches": args.batches, "batch_size": 16, "steps": args.steps},
        "split": args.split,
        "greedy": agreement(tmodel, omodel, sources, 1, args.batch_size),
    }
    if args.beam > 1:
        result[f"beam{args.beam}"] = agreement(tmodel, omodel, sources, args.beam, args.batch_size)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(result), file=sys.stdout, flush=True)
    return result


def main(argv=None) -> None:
    p = argparse.ArgumentParser("mtserve verify")
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
