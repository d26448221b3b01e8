"""Offline throughput of one engine on the test sentences: sentences/s, target tokens/s, BLEU, and
optionally single-sentence latency. `benchmarks/run.py` runs every engine through this script, one
process per engine, so that no engine's thread pool competes with another's.

    python benchmarks/offline.py --engine ct2-int8 --beam 4 --threads 2 --limit 200 --json out.json

Engines (all on models/de-en, all on the CPU, `--threads` threads in all):
  torch-eager   PyTorch, the textbook loop: no key/value cache, every step runs the whole decoder
                over the whole prefix again (Transformer.decode), greedy and beam search with the
                reference semantics of export/generate.py
  torch-cache   PyTorch with the key/value cache: export.generate (the reference search)
  ort-fp32      ONNX Runtime: service.generator.generate over OnnxSeq2Seq (what the server runs)
  ort-int8      the same over the dynamically quantised int8 graphs
  ct2-float32   CTranslate2 over the same weights (benchmarks/ct2_convert.py), float32
  ct2-int8      the same, int8 (quantised when loaded)

Layout: `--workers W` splits the work over W threads, each with its own model and `--threads / W`
intra-op threads (torch: one model, `--threads` threads; CTranslate2: `inter_threads=W`).
Target tokens are the generated subword tokens, </s> included.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ENGINES = ["torch-eager", "torch-cache", "ort-fp32", "ort-int8", "ct2-float32", "ct2-int8"]


# ----------------------------------------------------------------------------- the textbook loop


def eager_search(model, src: list[list[int]], beam: int = 4, length_penalty: float = 1.0, a: float = 1.5,
                 b: int = 10) -> list[list[int]]:
    """Greedy (beam 1) or beam search without a cache: every step calls Transformer.decode on the
    whole prefix (<s> + everything emitted so far), keeps the last position's logits and throws
    the rest away. Same rules as export.generate (max length, forced </s>, 2K candidates,
    length-normalised finished hypotheses)."""
    import torch

    from export.generate import max_output_len, pad_batch

    cfg = model.cfg
    B, K, V = len(src), beam, cfg.vocab_size
    with torch.no_grad():
        src_ids, src_mask = pad_batch(src, cfg.pad_id)
        memory = model.encode(src_ids, src_mask)
        max_len = [max_output_len(len(s), a, b, cfg.max_positions) for s in src]
        if K == 1:
            tgt = torch.full((B, 1), cfg.bos_id, dtype=torch.long)
            done = torch.zeros(B, dtype=torch.bool)
            limit = torch.tensor(max_len)
            for step in range(max(max_len)):
                logits, _ = model.decode(tgt, memory, src_mask)
                lp = torch.log_softmax(logits[:, -1].float(), dim=-1)
                force = step >= limit - 1
                lp[force] = torch.where(torch.arange(V) == cfg.eos_id, lp[force], torch.tensor(float("-inf")))
                nxt = lp.argmax(dim=-1)
                nxt = torch.where(done, torch.full_like(nxt, cfg.pad_id), nxt)
                tgt = torch.cat([tgt, nxt[:, None]], dim=1)
                done |= nxt == cfg.eos_id
                if bool(done.all()):
                    break
            return [[t for t in row[1:].tolist() if t not in (cfg.eos_id, cfg.pad_id)] for row in tgt]

        memory = memory.repeat_interleave(K, dim=0)
        mask = src_mask.repeat_interleave(K, dim=0)
        tgt = torch.full((B * K, 1), cfg.bos_id, dtype=torch.long)
        scores = torch.full((B, K), float("-inf"))
        scores[:, 0] = 0.0
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(B)]
        active = [True] * B
        for step in range(max(max_len)):
            logits, _ = model.decode(tgt, memory, mask)
            lp = torch.log_softmax(logits[:, -1].float(), dim=-1).view(B, K, V)
            for i in range(B):
                if step >= max_len[i] - 1:
                    eos = lp[i, :, cfg.eos_id].clone()
                    lp[i] = float("-inf")
                    lp[i, :, cfg.eos_id] = eos
            top_s, top_i = (scores[:, :, None] + lp).view(B, K * V).topk(2 * K, dim=1)
            ts, bi, ti = top_s.tolist(), (top_i // V).tolist(), (top_i % V).tolist()
            new_scores = torch.full((B, K), float("-inf"))
            new_src = torch.zeros(B, K, dtype=torch.long)
            new_tok = torch.full((B, K), cfg.pad_id, dtype=torch.long)
            for i in range(B):
                if not active[i]:
                    continue
                kept = 0
                for r in range(2 * K):
                    s = ts[i][r]
                    if s == float("-inf"):
                        break
                    if ti[i][r] == cfg.eos_id:
                        if r < K:
                            toks = tgt[i * K + bi[i][r], 1:].tolist()
                            finished[i].append((s / (len(toks) + 1) ** length_penalty, toks))
                        continue
                    if kept < K:
                        new_scores[i, kept], new_src[i, kept], new_tok[i, kept] = s, bi[i][r], ti[i][r]
                        kept += 1
                if len(finished[i]) >= K or step >= max_len[i] - 1 or kept == 0:
                    active[i] = False
                    new_scores[i] = float("-inf")
            if not any(active):
                break
            rows = (torch.arange(B)[:, None] * K + new_src).view(-1)
            scores = new_scores
            tgt = torch.cat([tgt[rows], new_tok.view(-1, 1)], dim=1)
        return [max(f, key=lambda h: h[0])[1] for f in finished]


# ----------------------------------------------------------------------------- engines


class Engine:
    """translate_ids(src ids lists, beam) -> emitted ids lists, in input order."""

    def __init__(self, name: str, model_dir: Path, threads: int, workers: int, batch_size: int):
        self.name, self.threads, self.workers, self.batch_size = name, threads, workers, batch_size
        self.model_dir = model_dir
        intra = max(1, threads // workers)
        if name.startswith("torch"):
            import torch

            from export.checkpoint import load_model

            torch.set_num_threads(threads)
            torch.set_num_interop_threads(1)
            self.model = load_model(model_dir)
            self.workers = 1
        elif name.startswith("ort"):
            from service.onnx_model import OnnxSeq2Seq

            self.models = [OnnxSeq2Seq(model_dir, precision=name.split("-")[1], intra_op_threads=intra)
                           for _ in range(workers)]
        elif name.startswith("ct2"):
            from benchmarks.ct2_convert import Ct2Translator, convert

            self._tmp = tempfile.TemporaryDirectory(prefix="mtserve-ct2-")
            convert(model_dir, self._tmp.name)
            self.ct2 = Ct2Translator(self._tmp.name, model_dir, compute_type=name.split("-")[1],
                                     inter_threads=workers, intra_threads=intra)
        else:
            raise ValueError(f"unknown engine {name!r}")
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.cfg = json.loads((model_dir / "config.json").read_text())["model"]

    def source_ids(self, texts: list[str]) -> list[list[int]]:
        limit, eos = self.cfg["max_positions"] - 1, self.cfg["eos_id"]
        return [e.ids[: limit - 1] + [eos] for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def detokenize(self, ids: list[list[int]]) -> list[str]:
        return [s.strip() for s in self.tokenizer.decode_batch(ids, skip_special_tokens=True)]

    def translate_ids(self, src: list[list[int]], beam: int) -> list[list[int]]:
        if self.name.startswith("ct2"):
            return self.ct2.translate_ids(src, beam=beam, batch_size=self.batch_size)
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        chunks = [order[s: s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        out: list[list[int]] = [[] for _ in src]
        if self.name.startswith("torch"):
            from export.generate import beam_search

            for idx in chunks:
                part = [src[i] for i in idx]
                res = (eager_search(self.model, part, beam) if self.name == "torch-eager"
                       else [h.tokens for h in beam_search(self.model, part, beam)])
                for i, toks in zip(idx, res):
                    out[i] = toks
            return out
        from service.generator import generate

        def work(w: int) -> None:  # worker w takes chunks w, w + W, ... (long and short alike)
            for idx in chunks[w:: self.workers]:
                for i, h in zip(idx, generate(self.models[w], [src[i] for i in idx], beam=beam,
                                              batch_size=self.batch_size)):
                    out[i] = h.tokens

        if self.workers == 1:
            work(0)
        else:
            with ThreadPoolExecutor(self.workers) as pool:
                list(pool.map(work, range(self.workers)))
        return out


def run(args) -> dict:
    import sacrebleu

    from export.data import read_parallel

    src_text, ref = read_parallel(args.data, args.split)
    if args.limit:
        src_text, ref = src_text[: args.limit], ref[: args.limit]
    t0 = time.perf_counter()
    eng = Engine(args.engine, Path(args.model), args.threads, args.workers, args.batch_size)
    load_s = time.perf_counter() - t0
    src = eng.source_ids(src_text)
    eng.translate_ids(src[:8], args.beam)  # warm-up
    t0 = time.perf_counter()
    hyps = eng.translate_ids(src, args.beam)
    seconds = time.perf_counter() - t0
    texts = eng.detokenize(hyps)
    n_tokens = sum(len(h) + 1 for h in hyps)
    result = {
        "engine": args.engine, "beam": args.beam, "threads": args.threads, "workers": eng.workers,
        "batch_size": args.batch_size, "sentences": len(src), "seconds": round(seconds, 3),
        "sentences_per_s": round(len(src) / seconds, 2), "target_tokens_per_s": round(n_tokens / seconds, 1),
        "bleu": round(sacrebleu.corpus_bleu(texts, [ref]).score, 2), "load_s": round(load_s, 2),
    }
    if args.latency:
        # One sentence per call, in test-set order: what a lone client waits for.
        lat_eng = eng if eng.workers == 1 else Engine(args.engine, Path(args.model), args.threads, 1, args.batch_size)
        times = []
        for s in src[: args.latency]:
            t = time.perf_counter()
            lat_eng.translate_ids([s], args.beam)
            times.append(time.perf_counter() - t)
        times.sort()
        result["latency_single"] = {"n": len(times), "p50_ms": round(1000 * statistics.median(times), 2),
                                    "p95_ms": round(1000 * times[min(len(times) - 1, int(0.95 * len(times)))], 2),
                                    "mean_ms": round(1000 * statistics.fmean(times), 2)}
    if args.hyps:
        Path(args.hyps).write_text(json.dumps(hyps))
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    from export.data import DEFAULT_DATA_DIR

    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--model", default=str(REPO / "models" / "de-en"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=2, help="threads in all")
    p.add_argument("--workers", type=int, default=1, help="parallel decode loops / CTranslate2 translators")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--latency", type=int, default=0, help="also time N single-sentence calls")
    p.add_argument("--hyps", help="write the output ids here (JSON)")
    p.add_argument("--json", help="write the result here too")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args()
    result = run(args)
    line = json.dumps(result)
    if args.json:
        Path(args.json).write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
