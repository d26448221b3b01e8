"""`mtserve shortlist --model VERSION_DIR (--source FILE --target FILE | --monolingual FILE)`: derive a
vocabulary shortlist for a model version and store it with the version (`export.shortlist`): the
.npz and the shortlist decoder steps in its export dir, recorded in its manifest, so that the
server ranks each batch's candidate tokens only (off per model: `"shortlist": false` in
NAME/serving.json). Reports one JSON line on stdout.

`--monolingual` translates FILE with the version itself (greedy, the fused int8 steps without a
shortlist, through `service.decoding.generator.generate`) and derives from those pairs.
`--vmap OUT` also writes the mapping in CTranslate2's vocabulary-map format (its `use_vmap`)."""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
import time
from pathlib import Path

from contract.manifest import Manifest, load_manifest, resolve_onnx_dir
from service.runtime.tokenizer import SentencePieceTokenizer, TextTokenizer, load_tokenizer

MONOLINGUAL_BATCH = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="the model version dir (REPOSITORY/NAME/VERSION) with its onnx/ export"
    )
    p.add_argument("--source", help="source sentences, one a line (.gz ok), with --target")
    p.add_argument("--target", help="their translations, one a line (.gz ok)")
    p.add_argument("--monolingual", help="source sentences to translate with the model and derive from (.gz ok)")
    p.add_argument("--per-source", type=int, default=50, help="target tokens kept per source token (default 50)")
    p.add_argument("--always", type=int, default=100, help="most frequent target tokens always ranked (default 100)")
    p.add_argument("--iterations", type=int, default=5, help="IBM model 1 EM iterations (default 5)")
    p.add_argument("--limit", type=int, help="use at most this many sentences")
    p.add_argument("--vmap", help="also write the mapping as a CTranslate2 vocabulary map (vmap.txt) here")


def read_lines(path: str, limit: int | None) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.rstrip("\n") for line in f]
    return lines[:limit] if limit is not None else lines


def _check(args: argparse.Namespace) -> None:
    parallel = args.source is not None or args.target is not None
    if parallel == (args.monolingual is not None):
        sys.exit("mtserve shortlist: give either --source and --target, or --monolingual")
    if parallel and (args.source is None or args.target is None):
        sys.exit("mtserve shortlist: --source and --target go together")
    if args.per_source < 1 or args.always < 0 or args.iterations < 1:
        sys.exit("mtserve shortlist: --per-source and --iterations must be >= 1, --always >= 0")


def translated_pairs(onnx_dir: Path, manifest: Manifest, sources: list[str]) -> list[tuple[list[int], list[int]]]:
    """(source ids, the model's greedy output ids) of each text: the fused int8 steps where the
    export has them, without any shortlist."""
    from service.decoding.generator import generate
    from service.runtime.onnx_model import OnnxSeq2Seq

    precision = "int8" if manifest.has("int8", "fused") else "fp32"
    model = OnnxSeq2Seq(onnx_dir, precision=precision, shortlist=False)
    src_ids = model.source_ids(sources)
    forced = model.prefixes()[1]
    hyps = generate(
        model,
        src_ids,
        beam=1,
        want_scores=False,
        batch_size=MONOLINGUAL_BATCH,
        target_prefixes=[forced] * len(src_ids) if forced else None,
    )
    return [(s, h.tokens) for s, h in zip(src_ids, hyps)]


def _pieces(tokenizer: TextTokenizer, ids: range, source: bool) -> dict[int, str]:
    """Token strings of ids as CTranslate2 sees them: a SentencePiece model's source vocabulary
    for the source side (imported models keep two), else the tokenizer's one vocabulary."""
    if source and isinstance(tokenizer, SentencePieceTokenizer):
        return {i: p for p, i in tokenizer.source_vocab.items()}
    return {i: p for i in ids if (p := tokenizer.id_to_token(i)) is not None}


def run(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    _check(args)
    t0 = time.perf_counter()
    onnx_dir = resolve_onnx_dir(args.model)
    manifest = load_manifest(onnx_dir, verify_checksums=False)
    tokenizer = load_tokenizer(onnx_dir, manifest)
    if args.monolingual is not None:
        pairs = translated_pairs(onnx_dir, manifest, read_lines(args.monolingual, args.limit))
        derived_from = "monolingual"
    else:
        sources, targets = read_lines(args.source, args.limit), read_lines(args.target, args.limit)
        if len(sources) != len(targets):
            sys.exit(f"mtserve shortlist: {len(sources)} source lines but {len(targets)} target lines")
        pairs = [(tokenizer.encode(s), tokenizer.encode_target(t)) for s, t in zip(sources, targets)]
        derived_from = "parallel"
    try:
        from export.checkpoint import load_model
        from export.shortlist import derive, install, special_ids, write_vmap
    except ModuleNotFoundError as e:
        sys.exit(f"mtserve shortlist: needs the export extra ({e.name} is missing): pip install 'mtserve[export]'")
    V = manifest.dims.vocab_size
    shortlist = derive(
        pairs, V, special_ids(manifest), args.per_source, args.always, args.iterations, derived_from=derived_from
    )
    model_dir = onnx_dir.parent
    updated = install(load_model(model_dir), onnx_dir, manifest, shortlist)
    lengths = [len(shortlist.row(s)) for s in range(shortlist.source_size)]
    report = {
        "shortlist": str(onnx_dir / (updated.shortlist.file if updated.shortlist else "")),
        "pairs": len(pairs),
        "derived_from": derived_from,
        "source_rows": sum(1 for n in lengths if n),
        "mean_per_source": round(sum(lengths) / max(1, sum(1 for n in lengths if n)), 1),
        "always": len(shortlist.always),
        "graphs": sorted(g.file for v in updated.variants.values() for g in v.shortlist_steps.values()),
        "vmap": None,
        "seconds": 0.0,
    }
    if args.vmap:
        ids = range(V)
        src_pieces, tgt_pieces = _pieces(tokenizer, ids, source=True), _pieces(tokenizer, ids, source=False)
        write_vmap(shortlist, src_pieces, tgt_pieces, Path(args.vmap))
        report["vmap"] = args.vmap
    report["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(report))
    return report
