"""`mtserve shortlist --model VERSION_DIR (--source FILE --target FILE | --monolingual FILE)`: derive a
vocabulary shortlist for a model version and store it with the version (`export.shortlist`): the
.npz and the shortlist decoder steps in its export dir, recorded in its manifest, so that the
server ranks each batch's candidate tokens only (off per model: `"shortlist": false` in
NAME/serving.json). Reports one JSON line on stdout.

`--monolingual` translates FILE with the version itself (greedy, the fused int8 steps without a
shortlist, through `service.decoding.generator.generate`) and derives from those pairs.
`--vmap OUT` also writes the mapping in CTranslate2's vocabulary-map format (its `use_vmap`).

The corpora are read with bounds (`mtserve.corpus`: --max-line-chars, --max-bytes); blank lines
(pairs with a blank side) are dropped, and fewer than --min-sentences left is refused. The last
`held_out` sentences are not derived from: the model translates them greedily, and at least
--min-identical of those translations must be unchanged by the shortlist
(`export.shortlist.identical_share`), else it is refused. The target ids no vocabulary entry names
(config.json's `unmapped_ids`, else those the tokenizer lacks) are in no row unless
--include-unmapped. The manifest is written last, once every other output is (`--vmap` included)."""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from contract.manifest import Manifest, load_manifest, resolve_onnx_dir
from mtserve.corpus import MAX_BYTES, MAX_LINE_CHARS, read_lines
from service.runtime.tokenizer import SentencePieceTokenizer, TextTokenizer, load_tokenizer

MONOLINGUAL_BATCH = 32
MIN_SENTENCES = 20
MIN_IDENTICAL = 0.95
MAX_HELD_OUT = 200
MAX_TOKEN_PAIRS = 50_000_000  # (source token, target token) pairs of a sentence pair, summed: the EM's arrays


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", required=True, help="the model version dir (REPOSITORY/NAME/VERSION) with its onnx/ export"
    )
    p.add_argument("--source", help="source sentences, one a line (.gz ok), with --target")
    p.add_argument("--target", help="their translations, one a line (.gz ok)")
    p.add_argument("--monolingual", help="source sentences to translate with the model and derive from (.gz ok)")
    p.add_argument("--per-source", type=int, default=50, help="target tokens kept per source token (default 50)")
    p.add_argument("--always", type=int, default=100, help="most frequent target tokens always ranked (default 100)")
    p.add_argument("--iterations", type=int, default=5, help="IBM model 1 EM iterations (1 to 100, default 5)")
    p.add_argument("--limit", type=int, help="use at most this many sentences (>= 1)")
    p.add_argument("--vmap", help="also write the mapping as a CTranslate2 vocabulary map (vmap.txt) here")
    p.add_argument(
        "--min-sentences",
        type=int,
        default=MIN_SENTENCES,
        help=f"refuse a corpus of fewer non-blank sentences (default {MIN_SENTENCES})",
    )
    p.add_argument(
        "--min-identical",
        type=float,
        default=MIN_IDENTICAL,
        help=f"share of held-out greedy translations the shortlist must leave unchanged (default {MIN_IDENTICAL})",
    )
    p.add_argument(
        "--max-line-chars",
        type=int,
        default=MAX_LINE_CHARS,
        help=f"refuse a corpus with a longer line (default {MAX_LINE_CHARS})",
    )
    p.add_argument(
        "--max-bytes", type=int, default=MAX_BYTES, help=f"read at most this much text of a file (default {MAX_BYTES})"
    )
    p.add_argument(
        "--include-unmapped",
        action="store_true",
        help="let the shortlist hold target ids no vocabulary entry names (an imported model's padding rows)",
    )


def _check(args: argparse.Namespace) -> None:
    """The arguments' combinations and ranges: ArgumentTypeError (bad usage)."""
    parallel = args.source is not None or args.target is not None
    problem = None
    if parallel == (args.monolingual is not None):
        problem = "give either --source and --target, or --monolingual"
    elif parallel and (args.source is None or args.target is None):
        problem = "--source and --target go together"
    elif args.per_source < 1 or args.always < 0 or not 1 <= args.iterations <= 100:
        problem = "--per-source must be >= 1, --always >= 0, --iterations 1 to 100"
    elif args.limit is not None and args.limit < 1:
        problem = f"--limit {args.limit}: give at least 1 sentence"
    elif args.min_sentences < 2 or not 0.0 <= args.min_identical <= 1.0:
        problem = "--min-sentences must be >= 2 and --min-identical between 0 and 1"
    elif args.max_line_chars < 1 or args.max_bytes < 1:
        problem = "--max-line-chars and --max-bytes must be >= 1"
    if problem:
        raise argparse.ArgumentTypeError(problem)


def _read(args: argparse.Namespace, path: str) -> list[str]:
    return read_lines(path, args.limit, args.max_line_chars, args.max_bytes)


def _corpus(args: argparse.Namespace) -> list[tuple[str, str]] | list[str]:
    """The non-blank sentences (pairs) of the corpus; ValueError when fewer than --min-sentences."""
    if args.monolingual is not None:
        corpus: list = [t for t in _read(args, args.monolingual) if t.strip()]
        what = args.monolingual
    else:
        sources, targets = _read(args, args.source), _read(args, args.target)
        if len(sources) != len(targets):
            raise ValueError(f"{len(sources)} source lines but {len(targets)} target lines")
        corpus = [(s, t) for s, t in zip(sources, targets) if s.strip() and t.strip()]
        what = f"{args.source} and {args.target}"
    if len(corpus) < args.min_sentences:
        raise ValueError(
            f"{what}: {len(corpus)} non-blank sentences; a shortlist needs at least {args.min_sentences} (--min-sentences)"
        )
    return corpus


def held_out_count(n: int) -> int:
    """Sentences kept out of the derivation to check the shortlist on: a tenth, 2 to MAX_HELD_OUT."""
    return min(MAX_HELD_OUT, max(2, n // 10))


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


def unmapped_target_ids(model_dir: Path, tokenizer: TextTokenizer, vocab_size: int) -> list[int]:
    """config.json's `unmapped_ids` (`mtserve import` records them), else the ids below
    `vocab_size` that the tokenizer has no entry for."""
    config = model_dir / "config.json"
    if config.is_file():
        recorded = json.loads(config.read_text(encoding="utf-8")).get("unmapped_ids")
        if isinstance(recorded, list):
            return [int(i) for i in recorded]
    return [i for i in range(vocab_size) if tokenizer.id_to_token(i) is None]


def _pairs(args, onnx_dir: Path, manifest: Manifest, tokenizer: TextTokenizer, corpus: list) -> tuple[list, list]:
    """(the pairs derived from, the held-out (source ids, greedy output ids) checked on)."""
    n_held = held_out_count(len(corpus))
    if args.monolingual is not None:
        pairs = translated_pairs(onnx_dir, manifest, corpus)
        return pairs[:-n_held], pairs[-n_held:]
    train, held = corpus[:-n_held], corpus[-n_held:]
    pairs = [(tokenizer.encode(s), tokenizer.encode_target(t)) for s, t in train]
    return pairs, translated_pairs(onnx_dir, manifest, [s for s, _ in held])


def run(args: argparse.Namespace) -> dict:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    _check(args)
    t0 = time.perf_counter()
    onnx_dir = resolve_onnx_dir(args.model)
    manifest = load_manifest(onnx_dir, verify_checksums=False)
    tokenizer = load_tokenizer(onnx_dir, manifest)
    try:
        from export.checkpoint import load_model
        from export.shortlist import derive, identical_share, install, special_ids, write_vmap
    except ModuleNotFoundError as e:
        raise RuntimeError(f"needs the export extra ({e.name} is missing): pip install 'mtserve[export]'") from None
    corpus = _corpus(args)
    pairs, held = _pairs(args, onnx_dir, manifest, tokenizer, corpus)
    token_pairs = sum(len(s) * len(t) for s, t in pairs)
    if token_pairs > MAX_TOKEN_PAIRS:
        raise ValueError(f"the corpus has {token_pairs} token pairs, more than {MAX_TOKEN_PAIRS}; give --limit")
    V = manifest.dims.vocab_size
    model_dir = onnx_dir.parent
    unmapped = [] if args.include_unmapped else unmapped_target_ids(model_dir, tokenizer, V)
    shortlist = derive(
        pairs,
        V,
        special_ids(manifest),
        args.per_source,
        args.always,
        args.iterations,
        derived_from="monolingual" if args.monolingual is not None else "parallel",
        exclude=unmapped,
    )
    forced = [manifest.special_ids.start_id, *manifest.languages.target_tokens.values()]
    same, checked = identical_share(shortlist, held, forced, manifest.special_ids.eos_id)
    if same < args.min_identical * checked:
        raise ValueError(
            f"the shortlist changes {checked - same} of {checked} held-out greedy translations "
            f"({same / checked:.0%} identical, --min-identical {args.min_identical:.0%}); "
            "raise --per-source or --always, or give more sentences"
        )
    if args.vmap:
        ids = range(V)
        src_pieces, tgt_pieces = _pieces(tokenizer, ids, source=True), _pieces(tokenizer, ids, source=False)
        write_vmap(shortlist, src_pieces, tgt_pieces, Path(args.vmap))
    updated = install(load_model(model_dir), onnx_dir, manifest, shortlist)  # the manifest last
    lengths = [len(shortlist.row(s)) for s in range(shortlist.source_size)]
    report = {
        "shortlist": str(onnx_dir / (updated.shortlist.file if updated.shortlist else "")),
        "pairs": len(pairs),
        "derived_from": shortlist.params["derived_from"],
        "held_out": {"sentences": checked, "identical": same},
        "excluded_unmapped": len(unmapped),
        "source_rows": sum(1 for n in lengths if n),
        "mean_per_source": round(sum(lengths) / max(1, sum(1 for n in lengths if n)), 1),
        "always": len(shortlist.always),
        "graphs": sorted(g.file for v in updated.variants.values() for g in v.shortlist_steps.values()),
        "vmap": args.vmap,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    print(json.dumps(report))
    return report
