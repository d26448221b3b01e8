"""Offline throughput of one engine on the test sentences: sentences/s, target tokens/s, BLEU, and
optionally single-sentence latency. `benchmarks/run.py` runs every engine through this script, one
process per engine, so that no engine's thread pool competes with another's.

    python -m benchmarks.offline --engine ct2-int8 --beam 4 --threads 2 --limit 200 --json out.json

Engines (all on models/de-en/1, all on the CPU, `--threads` threads in all):
  torch-eager   PyTorch, the textbook loop: no key/value cache, every step runs the whole decoder
                over the whole prefix again (Transformer.decode), greedy and beam search with the
                reference semantics of export/generate.py
  torch-cache   PyTorch with the key/value cache: export.generate (the reference search)
  ort-fp32      ONNX Runtime: service.decoding.generator.generate over OnnxSeq2Seq (what the server runs)
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
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.figures import print_result

REPO = Path(__file__).resolve().parent.parent

ENGINES = ["torch-eager", "torch-cache", "ort-fp32", "ort-int8", "ct2-float32", "ct2-int8"]


# ----------------------------------------------------------------------------- engines


def balanced_batch(n: int, batch_size: int, workers: int) -> int:
    """The batch size, at most `batch_size`, that splits n sentences into a multiple of `workers`
    batches of nearly equal size: 200 sentences in batches of 64 over 2 workers would otherwise
    give one worker 128 and the other 72. Both engines batch by it (CTranslate2 as its
    max_batch_size), so that neither waits for the other's last batch."""
    if n == 0:
        return batch_size
    batches = -(-n // batch_size)
    batches = -(-batches // workers) * workers
    return -(-n // batches)


class Engine:
    """translate_ids(src ids lists, beam) -> emitted ids lists, in input order."""

    def __init__(
        self, name: str, model_dir: Path, threads: int, workers: int, batch_size: int, ct2_dir: str | None = None
    ):
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
            from service.runtime.gil import set_switch_interval
            from service.runtime.memory import keep_freed_memory
            from service.runtime.onnx_model import OnnxSeq2Seq
            from service.settings import Settings

            keep_freed_memory()  # as `mtserve serve` does
            # As `mtserve serve` does: the workers hand the GIL to each other at every step.
            set_switch_interval(Settings.model_fields["gil_switch_interval_ms"].default)

            self.models = [
                OnnxSeq2Seq(model_dir, precision=name.split("-")[1], intra_op_threads=intra) for _ in range(workers)
            ]
        elif name.startswith("ct2"):
            from benchmarks.ct2_convert import Ct2Translator, convert

            if ct2_dir is None:  # convert the weights here
                self._tmp = tempfile.TemporaryDirectory(prefix="mtserve-ct2-")
                ct2_dir = self._tmp.name
                convert(model_dir, ct2_dir)
            self.ct2 = Ct2Translator(
                ct2_dir, model_dir, compute_type=name.split("-")[1], inter_threads=workers, intra_threads=intra
            )
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
        size = balanced_batch(len(src), self.batch_size, self.workers)
        if self.name.startswith("ct2"):
            return self.ct2.translate_ids(src, beam=beam, batch_size=size)
        order = sorted(range(len(src)), key=lambda i: len(src[i]))
        chunks = [order[s : s + size] for s in range(0, len(order), size)]
        out: list[list[int]] = [[] for _ in src]
        if self.name.startswith("torch"):
            from export.generate import beam_search

            for idx in chunks:
                part = [src[i] for i in idx]
                hyps = beam_search(self.model, part, beam, use_cache=self.name != "torch-eager")
                res = [h.tokens for h in hyps]
                for i, toks in zip(idx, res):
                    out[i] = toks
            return out
        from service.decoding.generator import generate

        def work(w: int) -> None:  # worker w takes chunks w, w + W, ... (long and short alike)
            for idx in chunks[w :: self.workers]:
                for i, h in zip(
                    idx,
                    generate(
                        self.models[w], [src[i] for i in idx], beam=beam, batch_size=self.batch_size, want_scores=False
                    ),
                ):
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
    eng = Engine(args.engine, Path(args.model), args.threads, args.workers, args.batch_size, args.ct2_dir)
    load_s = time.perf_counter() - t0
    src = eng.source_ids(src_text)
    eng.translate_ids(src[:8], args.beam)  # warm-up
    t0 = time.perf_counter()
    hyps = eng.translate_ids(src, args.beam)
    seconds = time.perf_counter() - t0
    texts = eng.detokenize(hyps)
    n_tokens = sum(len(h) + 1 for h in hyps)
    result = {
        "engine": args.engine,
        "beam": args.beam,
        "threads": args.threads,
        "workers": eng.workers,
        "batch_size": args.batch_size,
        "sentences": len(src),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(src) / seconds, 2),
        "target_tokens_per_s": round(n_tokens / seconds, 1),
        "bleu": round(sacrebleu.corpus_bleu(texts, [ref]).score, 2),
        "load_s": round(load_s, 2),
    }
    if args.latency:
        # One sentence per call, in test-set order: what a lone client waits for.
        lat_threads = args.latency_threads or args.threads
        lat_eng = (
            eng
            if eng.workers == 1 and lat_threads == args.threads
            else Engine(args.engine, Path(args.model), lat_threads, 1, args.batch_size, args.ct2_dir)
        )
        times = []
        for s in src[: args.latency]:
            t = time.perf_counter()
            lat_eng.translate_ids([s], args.beam)
            times.append(time.perf_counter() - t)
        times.sort()
        result["latency_single"] = {
            "n": len(times),
            "threads": lat_threads,
            "p50_ms": round(1000 * statistics.median(times), 2),
            "p95_ms": round(1000 * times[min(len(times) - 1, int(0.95 * len(times)))], 2),
            "mean_ms": round(1000 * statistics.fmean(times), 2),
        }
    if args.hyps:
        Path(args.hyps).write_text(json.dumps(hyps))
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    from export.data import DEFAULT_DATA_DIR

    p.add_argument("--engine", choices=ENGINES, required=True)
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--threads", type=int, default=2, help="threads in all")
    p.add_argument("--workers", type=int, default=1, help="parallel decode loops / CTranslate2 translators")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--limit", type=int, default=0, help="first N sentences only (0 = all)")
    p.add_argument("--latency", type=int, default=0, help="also time N single-sentence calls")
    p.add_argument(
        "--latency-threads",
        type=int,
        default=0,
        help="threads of the single-sentence engine (default: --threads, in one decode loop)",
    )
    p.add_argument(
        "--ct2-dir", help="ct2-*: the model already converted by benchmarks/ct2_convert.py (default: convert it)"
    )
    p.add_argument("--hyps", help="write the output ids here (JSON)")
    p.add_argument("--json", help="write the result here too")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    args = p.parse_args()
    result = run(args)
    print_result(result, args.json)


if __name__ == "__main__":
    main()
