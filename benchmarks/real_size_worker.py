"""One engine of the real-size benchmark (benchmarks/real_size.py) in a process of its own, its
model loaded once, answering one JSON command a line on stdin with one JSON line on stdout:

    {"op": "offline", "beam": 1, "tokens": 30, "sentences": 200}  -> sentences_per_s, output token counts
    {"op": "single", "beam": 1, "tokens": 30, "sentences": 10}    -> p50_ms of one sentence per call
    {"op": "rss"}                                                 -> vm_hwm_kb (peak RSS), vm_rss_kb

Every engine is forced to emit exactly `tokens` target tokens a sentence (</s> not counted), so
that work per sentence is identical:
  mtserve    service.decoding.generator.generate over OnnxSeq2Seq int8 (what the server runs; its
             decode loops share one OnnxSeq2Seq, as the server's workers do):
             min_len = tokens, max_len = tokens + 1 (max_len counts the final </s>, which is forced
             at the last step: one step more than the others run)
  ct2        CTranslate2 int8: min_decoding_length = max_decoding_length = tokens (no </s>)
  hf-torch   transformers' generate in PyTorch fp32: min_new_tokens = max_new_tokens = tokens,
             forced_eos_token_id off (it would spend the last token on </s>)
  hf-ort-*   optimum's ORTModelForSeq2SeqLM (fp32, or its graphs dynamically quantised to int8),
             the same generate arguments; runs in the optimum venv (it needs transformers 4.57)
With --tgt-lang (a multilingual model's target language: NLLB's eng_Latn), that token is forced
first on both mtserve (the manifest's tgt_lang, as `target_prefixes`; max_len counts it) and
CTranslate2 (`target_prefix`; its lengths count it too) and left out of the counts, so that
`tokens` are emitted after it; the source starts with the source language token on both (the
manifest's src_lang, the Hugging Face tokenizer's src_lang).
With --shortlist, mtserve ranks over its version's vocabulary shortlist (contract/shortlist.py) and
CTranslate2 over the same mapping (`use_vmap`: vmap.txt in its model dir), so the forced tokens
come from the shortlist on both; without it, mtserve runs the version's plain steps (shortlist=False).
The counts of emitted tokens come back with every offline answer, so the caller can check them.
Only the standard library is imported at the top: this module runs in both venvs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# translate(token id lists or token lists, beam, tokens) -> emitted lengths, in input order
Translate = Callable[[list[Any], int, int], list[int]]
ENGINES = ("mtserve", "ct2", "hf-torch", "hf-ort-fp32", "hf-ort-int8")


def read_test(data: Path, limit: int) -> list[str]:
    with gzip.open(data / "test_2016_flickr.de.gz", "rt", encoding="utf-8") as f:
        return [line.strip() for line in f][:limit]


def chunks(n_items: list[Any], batch: int) -> list[list[int]]:
    """Indices sorted by length (the items' len), in batches of at most `batch`."""
    order = sorted(range(len(n_items)), key=lambda i: len(n_items[i]))
    return [order[s : s + batch] for s in range(0, len(order), batch)]


def mtserve_engine(args: argparse.Namespace, texts: list[str]) -> tuple[Translate, list[Any]]:
    from benchmarks.offline import balanced_batch
    from service.decoding.generator import generate
    from service.runtime.gil import set_switch_interval
    from service.runtime.memory import keep_freed_memory
    from service.runtime.onnx_model import OnnxSeq2Seq
    from service.settings import Settings

    keep_freed_memory()  # as `mtserve serve` does
    set_switch_interval(Settings.model_fields["gil_switch_interval_ms"].default)
    intra = max(1, args.threads // args.workers)
    # one session set for every loop, as the server's decode workers share theirs (`share_sessions`):
    # the weights in memory once, so that this process's peak RSS is what one server process's is
    model = OnnxSeq2Seq(args.dir, precision="int8", intra_op_threads=intra, shortlist=args.shortlist)
    if args.shortlist and model.shortlist is None:
        raise SystemExit(f"{args.dir} has no vocabulary shortlist")
    models = [model] * args.workers
    forced = model.prefixes()[1] if args.tgt_lang else []  # the manifest's tgt_lang token
    if args.tgt_lang and model.manifest.tgt_lang != args.tgt_lang:
        raise SystemExit(f"{args.dir} translates into {model.manifest.tgt_lang}, not {args.tgt_lang}")

    def translate(src: list[Any], beam: int, tokens: int) -> list[int]:
        size = balanced_batch(len(src), args.batch, args.workers)
        parts = chunks(src, size)
        out = [0] * len(src)

        def work(w: int) -> None:  # loop w takes batches w, w + W, ...
            for idx in parts[w :: args.workers]:
                hyps = generate(
                    models[w],
                    [src[i] for i in idx],
                    beam=beam,
                    batch_size=size,
                    max_len_a=0.0,
                    max_len_b=tokens + 1 + len(forced),
                    min_len=tokens,
                    want_scores=False,
                    target_prefixes=[forced] * len(idx) if forced else None,
                )
                for i, h in zip(idx, hyps):
                    out[i] = len(h.tokens)

        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(work, range(args.workers)))
        return out

    return translate, models[0].source_ids(texts)


def ct2_engine(args: argparse.Namespace, texts: list[str]) -> tuple[Translate, list[Any]]:
    import ctranslate2
    from transformers import AutoTokenizer

    from benchmarks.offline import balanced_batch

    tok = AutoTokenizer.from_pretrained(args.hf)
    intra = max(1, args.threads // args.workers)
    tr = ctranslate2.Translator(
        args.dir, device="cpu", compute_type="int8", inter_threads=args.workers, intra_threads=intra
    )

    prefix = [args.tgt_lang] if args.tgt_lang else []

    def translate(src: list[Any], beam: int, tokens: int) -> list[int]:
        res = tr.translate_batch(
            src,
            target_prefix=[prefix] * len(src) if prefix else None,
            beam_size=beam,
            min_decoding_length=tokens + len(prefix),
            max_decoding_length=tokens + len(prefix),
            max_batch_size=balanced_batch(len(src), args.batch, args.workers),
            batch_type="examples",
            use_vmap=args.shortlist,
        )
        return [len(r.hypotheses[0]) - len(prefix) for r in res]

    src = [tok.convert_ids_to_tokens(ids) for ids in tok(texts).input_ids]
    return translate, src


def hf_engine(args: argparse.Namespace, texts: list[str]) -> tuple[Translate, list[Any]]:
    import torch
    from transformers import AutoTokenizer

    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.hf)
    if args.engine == "hf-torch":
        from transformers import MarianMTModel

        model: Any = MarianMTModel.from_pretrained(args.hf).eval()
    else:
        import onnxruntime as ort
        from optimum.onnxruntime import ORTModelForSeq2SeqLM

        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        so.inter_op_num_threads = 1
        model = ORTModelForSeq2SeqLM.from_pretrained(args.dir, session_options=so, provider="CPUExecutionProvider")
    pad = tok.pad_token_id

    def translate(src: list[Any], beam: int, tokens: int) -> list[int]:
        out = [0] * len(src)
        for idx in chunks(src, args.batch):
            width = max(len(src[i]) for i in idx)
            ids = torch.tensor([src[i] + [pad] * (width - len(src[i])) for i in idx])
            mask = (ids != pad).long()
            with torch.inference_mode():
                gen = model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    num_beams=beam,
                    do_sample=False,
                    min_new_tokens=tokens,
                    max_new_tokens=tokens,
                    forced_eos_token_id=None,
                )
            for i, row in zip(idx, gen.tolist()):
                out[i] = sum(t != pad for t in row[1:])  # after the decoder start token (<pad>)
        return out

    return translate, tok(texts).input_ids


def peak_rss() -> dict[str, int]:
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {"vm_hwm_kb": int(status["VmHWM"].split()[0]), "vm_rss_kb": int(status["VmRSS"].split()[0])}


def answer(cmd: dict[str, Any], translate: Translate, src: list[Any]) -> dict[str, Any]:
    if cmd["op"] == "rss":
        return peak_rss()
    beam, tokens, n = cmd["beam"], cmd["tokens"], cmd["sentences"]
    if cmd["op"] == "offline":
        translate(src[: min(8, n)], beam, tokens)  # warm-up at this beam
        t0 = time.perf_counter()
        lengths = translate(src[:n], beam, tokens)
        seconds = time.perf_counter() - t0
        return {
            "sentences": n,
            "seconds": round(seconds, 3),
            "sentences_per_s": round(n / seconds, 2),
            "min_tokens": min(lengths),
            "max_tokens": max(lengths),
        }
    times = []
    for s in src[:n]:
        t = time.perf_counter()
        translate([s], beam, tokens)
        times.append(time.perf_counter() - t)
    return {"sentences": n, "p50_ms": round(1000 * statistics.median(times), 2)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--engine", choices=ENGINES, required=True)
    ap.add_argument("--dir", required=True, help="the engine's model dir")
    ap.add_argument("--hf", required=True, help="the Hugging Face folder (its tokenizer)")
    ap.add_argument("--data", required=True, help="the corpus dir (test_2016_flickr.de.gz)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="decode loops (CTranslate2: inter_threads)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument(
        "--shortlist",
        action="store_true",
        help="rank over the vocabulary shortlist: the version's (mtserve), vmap.txt in the model dir (ct2: use_vmap)",
    )
    ap.add_argument("--tgt-lang", default="", help="a multilingual model's target language, forced first")
    ap.add_argument("--sentences", type=int, default=1000, help="test sentences to tokenize")
    args = ap.parse_args(argv)
    texts = read_test(Path(args.data), args.sentences)
    make = {"mtserve": mtserve_engine, "ct2": ct2_engine}.get(args.engine, hf_engine)
    translate, src = make(args, texts)
    print(json.dumps({"ready": args.engine, **peak_rss()}), flush=True)
    for line in sys.stdin:
        print(json.dumps(answer(json.loads(line), translate, src)), flush=True)


if __name__ == "__main__":
    main()
