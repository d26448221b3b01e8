"""`mtserve evaluate`: translate `SPLIT.SRC` of a data dir and score it against `SPLIT.TGT`
with sacreBLEU (13a tokenisation, cased, detokenised output).

Engines: `torch` (the PyTorch reference, needs the export extra) and `onnx` (ONNX Runtime over
the export in MODEL/onnx, `mtserve export` makes it; no torch is imported)."""

from __future__ import annotations

import argparse
import json
import sys
import time

import sacrebleu

from export.data import DEFAULT_DATA_DIR, read_parallel


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="models/de-en/1", help="model dir")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR), help="dir with SPLIT.LANG[.gz] files")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--length-penalty", type=float, default=1.0)
    p.add_argument("--max-len-a", type=float, default=1.5)
    p.add_argument("--max-len-b", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument(
        "--engine",
        choices=["torch", "onnx"],
        default="torch",
        help="torch: the PyTorch reference; onnx: ONNX Runtime over the export (MODEL/onnx or an export dir)",
    )
    p.add_argument("--precision", choices=["fp32", "int8", "fp16"], default="fp32", help="onnx engine: graph variant")
    p.add_argument(
        "--graph",
        choices=["auto", "fused", "portable"],
        default="auto",
        help="onnx engine: the decoder step (auto: the fused one where the export has it for the device)",
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (onnx: auto too)")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0 = the library's default)")
    p.add_argument("--limit", type=int, help="first N sentences only")
    p.add_argument("--output", help="write the translations here, one per line")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def make_translator(args):
    if args.engine == "torch":
        from export.translator import TorchTranslator

        return TorchTranslator(args.model, device=args.device, threads=args.threads)
    if args.engine == "onnx":
        from service.decoding.translator import OnnxTranslator

        return OnnxTranslator(
            args.model, precision=args.precision, device=args.device, threads=args.threads, graph=args.graph
        )
    raise ValueError(f"unknown engine {args.engine!r}")


def run(args) -> dict:
    src, ref = read_parallel(args.data, args.split, args.src_lang, args.tgt_lang)
    if args.limit:
        src, ref = src[: args.limit], ref[: args.limit]
    translator = make_translator(args)
    t0 = time.perf_counter()
    hyps = translator.translate(
        src,
        beam=args.beam,
        length_penalty=args.length_penalty,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        batch_size=args.batch_size,
    )
    seconds = time.perf_counter() - t0
    bleu = sacrebleu.BLEU()
    score = bleu.corpus_score(hyps, [ref])
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.writelines(h + "\n" for h in hyps)
    result = {
        "bleu": round(score.score, 2),
        "signature": str(bleu.get_signature()),
        "sentences": len(src),
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(src) / seconds, 1),
        "split": args.split,
        "beam": args.beam,
        "engine": args.engine,
        "model": args.model,
    }
    if args.engine == "onnx":
        result["precision"] = args.precision
        result["graph"] = translator.model.graph
    print(
        json.dumps(result)
        if args.json
        else f"BLEU {result['bleu']} ({result['signature']}) on {len(src)} sentences of {args.split} in {seconds:.1f}s",
        file=sys.stdout,
    )
    return result
