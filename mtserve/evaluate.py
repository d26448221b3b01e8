"""`mtserve evaluate`: translate `SPLIT.SRC` of a data dir and score it against `SPLIT.TGT`
with sacreBLEU (13a tokenisation, cased, detokenised output). SRC and TGT are the languages the
model records (`src_lang`/`tgt_lang` of its config.json for the torch engine, of the export's
manifest for the onnx engine) unless `--src-lang`/`--tgt-lang` say otherwise.

Engines: `torch` (the PyTorch reference, needs the export extra) and `onnx` (ONNX Runtime over
the export in MODEL/onnx, `mtserve export` makes it; no torch is imported)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import sacrebleu

from export.data import DEFAULT_DATA_DIR, read_parallel


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="models/de-en/1", help="model dir")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR), help="dir with SPLIT.LANG[.gz] files")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--src-lang", help="source language of the data files (default: the model's src_lang)")
    p.add_argument("--tgt-lang", help="reference language of the data files (default: the model's tgt_lang)")
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


def model_languages(model: str | Path, engine: str = "torch") -> tuple[str, str]:
    """(src_lang, tgt_lang) that a model records: its config.json for the torch engine, the export
    manifest (MODEL/onnx/manifest.json or an export dir's own) for the onnx engine."""
    if engine == "onnx":
        from contract.manifest import load_manifest

        manifest = load_manifest(model, verify_checksums=False)
        return manifest.src_lang, manifest.tgt_lang
    config = Path(model) / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"no config.json in {model}")
    meta = json.loads(config.read_text(encoding="utf-8"))
    if not meta.get("src_lang") or not meta.get("tgt_lang"):
        raise ValueError(f"{config} records no src_lang/tgt_lang: give --src-lang and --tgt-lang")
    return meta["src_lang"], meta["tgt_lang"]


def resolve_languages(args, engine: str = "torch") -> tuple[str, str]:
    """--src-lang/--tgt-lang where given, else what the model records (read only when needed)."""
    if args.src_lang and args.tgt_lang:
        return args.src_lang, args.tgt_lang
    src, tgt = model_languages(args.model, engine)
    return args.src_lang or src, args.tgt_lang or tgt


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
    src_lang, tgt_lang = resolve_languages(args, args.engine)
    src, ref = read_parallel(args.data, args.split, src_lang, tgt_lang)
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
        "src_lang": src_lang,
        "tgt_lang": tgt_lang,
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
