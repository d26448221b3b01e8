"""Derive a vocabulary shortlist (`contract.shortlist`) and store it with a model version: the .npz,
the decoder steps that rank over it (`export.fused.decoder.build_fused_decoder(shortlist=True)`) for every
fused variant, and the manifest entries (`contract.manifest.ShortlistSpec`, `Variant.shortlist_steps`).

The derivation is IBM model 1 (a few EM iterations of p(target token | source token) over the
sentence pairs, without a NULL word), vectorised over every (source, target) token pair of the
corpus: Multi30k's 29,000 pairs take a few seconds. A source token keeps its `per_source` most
likely target tokens of p >= `min_prob`; every batch also ranks the `always` most frequent target
tokens and the special ones (pad, bos, eos, unk, the decoder start and the target language tokens).
Target ids in `exclude` (an imported model's ids that no vocabulary entry names, unless asked
for) are in no row and not among the frequent ones.

`identical_share` says how many sentences a shortlist leaves unchanged: greedy search over a
shortlist gives the output of greedy search without it exactly when every token of that output is
among the sentence's candidates (the argmax over a subset that holds the full argmax is that
argmax; the first token outside the subset is where the two part).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract.graphs import fused_decoder_io
from contract.manifest import (
    GraphSpec,
    Manifest,
    ShortlistSpec,
    Variant,
    sha256_file,
    write_manifest,
)
from contract.shortlist import SHORTLIST_FILE, Shortlist, shortlist_file_name
from export import onnx_files
from export.checks import check_graph
from export.fused.decoder import build_fused_decoder
from export.model import Transformer
from export.shared_weights import share_weights

log = logging.getLogger("mtserve.shortlist")

DEFAULT_PER_SOURCE = 50
DEFAULT_ALWAYS = 100
DEFAULT_ITERATIONS = 5
MIN_PROB = 1e-3
# How each decoder-step field of a fused variant multiplies, by precision (export.variants' FUSED
# and FUSED_ONE_ROW), and whether it ranks with log-probabilities.
_STEP_KINDS = {
    "decoder": ({"fp32": "fp32", "int8": "int8"}, True),
    "decoder_unscored": ({"fp32": "fp32", "int8": "int8"}, False),
    "decoder_one_row": ({"int8": "nbits8"}, True),
    "decoder_one_row_unscored": ({"int8": "nbits8"}, False),
}


def ibm1(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]], iterations: int = DEFAULT_ITERATIONS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """IBM model 1's p(t | s) over the token pairs that co-occur in `pairs` (source ids, target
    ids): (source ids, target ids, probabilities), one entry per co-occurring pair. The first
    iteration starts from uniform probabilities (co-occurrence counts)."""
    src = [np.asarray(s, dtype=np.int64) for s, t in pairs if len(s) and len(t)]
    tgt = [np.asarray(t, dtype=np.int64) for s, t in pairs if len(s) and len(t)]
    if not src:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, np.zeros(0)
    ls = np.array([len(s) for s in src])
    lt = np.array([len(t) for t in tgt])
    # every (source token, target token) of a sentence, grouped by its target position
    s_all = np.concatenate([np.tile(s, len(t)) for s, t in zip(src, tgt)])
    t_all = np.concatenate([np.repeat(t, len(s)) for s, t in zip(src, tgt)])
    group = np.repeat(np.arange(int(lt.sum())), np.repeat(ls, lt))
    v_tgt = int(t_all.max()) + 1
    keys, inv = np.unique(s_all * v_tgt + t_all, return_inverse=True)
    s_of, t_of = keys // v_tgt, keys % v_tgt
    theta = np.ones(len(keys))
    for _ in range(iterations):
        p = theta[inv]
        post = p / np.bincount(group, weights=p)[group]
        counts = np.bincount(inv, weights=post, minlength=len(keys))
        theta = counts / np.bincount(s_of, weights=counts)[s_of]
    return s_of, t_of, theta


def derive(
    pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
    vocab_size: int,
    specials: Sequence[int],
    per_source: int = DEFAULT_PER_SOURCE,
    always: int = DEFAULT_ALWAYS,
    iterations: int = DEFAULT_ITERATIONS,
    min_prob: float = MIN_PROB,
    derived_from: str = "parallel",
    exclude: Sequence[int] = (),
) -> Shortlist:
    """The shortlist of `pairs` (see the module doc) over a target vocabulary of `vocab_size`,
    without the target ids `exclude`."""
    s_of, t_of, theta = ibm1(pairs, iterations)
    if len(exclude):
        allowed = ~np.isin(t_of, np.asarray(exclude, dtype=np.int64))
        s_of, t_of, theta = s_of[allowed], t_of[allowed], theta[allowed]
    order = np.lexsort((t_of, -theta, s_of))  # by source, then most likely first (ties: lower id)
    s_sorted = s_of[order]
    first = np.searchsorted(s_sorted, s_sorted, side="left")
    keep = order[((np.arange(len(order)) - first) < per_source) & (theta[order] >= min_prob)]
    rows_n = int(s_of.max()) + 1 if len(s_of) else 0
    rows: list[list[int]] = [[] for _ in range(rows_n)]
    for s, t in zip(s_of[keep].tolist(), t_of[keep].tolist()):
        rows[s].append(t)
    freq = np.bincount(np.concatenate([np.asarray(t, dtype=np.int64) for _, t in pairs] or [np.zeros(0, np.int64)]))
    freq[np.asarray([i for i in exclude if i < len(freq)], dtype=np.int64)] = 0
    frequent = np.argsort(-freq, kind="stable")[:always]
    frequent = frequent[freq[frequent] > 0]
    params = {
        "method": "ibm1",
        "iterations": iterations,
        "per_source": per_source,
        "always": always,
        "min_prob": min_prob,
        "pairs": len(pairs),
        "derived_from": derived_from,
    }
    return Shortlist.from_rows(rows, [*frequent.tolist(), *specials], vocab_size, params)


def identical_share(
    shortlist: Shortlist, sentences: Sequence[tuple[Sequence[int], Sequence[int]]], forced: Sequence[int], eos: int
) -> tuple[int, int]:
    """(sentences whose greedy output the shortlist leaves unchanged, sentences): each is (source
    ids, the greedy output ids without a shortlist), decoded alone (its own candidates, `forced`
    the ids forced on every output, and </s>)."""
    same = 0
    for src, out in sentences:
        ids = shortlist.batch_candidates([shortlist.candidates(src, [*forced, eos])])
        same += bool(np.isin(np.asarray(list(out), dtype=np.int64), ids).all())
    return same, len(sentences)


def special_ids(manifest: Manifest) -> list[int]:
    """The target ids every batch ranks whatever its sources: pad, bos, eos, unk, the decoder start
    and the target language tokens."""
    ids = manifest.special_ids
    return sorted(
        {ids.pad_id, ids.bos_id, ids.eos_id, ids.unk_id, ids.start_id, *manifest.languages.target_tokens.values()}
    )


def shortlist_steps(
    model: Transformer, out: Path, variant: Variant, work: Path, keep_in_work: bool = False
) -> dict[str, GraphSpec]:
    """The shortlist twin of each decoder step of a fused `variant`, built in `work`, checked against
    the contract and moved into `out` (left in `work` with `keep_in_work`: the caller moves it)."""
    steps: dict[str, GraphSpec] = {}
    for field, spec in variant.decoder_steps().items():
        kinds, scored = _STEP_KINDS[field]
        if variant.precision not in kinds:
            raise ValueError(f"no shortlist step for {field} of {variant.precision}")
        name = shortlist_file_name(spec.file)
        built = work / name
        build_fused_decoder(model, built, kinds[variant.precision], scored=scored, shortlist=True)
        io = fused_decoder_io(model.cfg, scored, shortlist=True)
        check_graph(built, *io)
        if not keep_in_work:
            built = onnx_files.move(built, out)
        steps[field] = GraphSpec(file=name, sha256=sha256_file(built), inputs=io[0], outputs=io[1])
    return steps


def with_shortlist(
    model: Transformer, out: Path, manifest: Manifest, spec: ShortlistSpec, staging: Path | None = None
) -> Manifest:
    """`manifest` with the shortlist `spec` (its file already in `out`) and the shortlist steps of
    every fused variant, built where a variant lacks them: into `out`, or left in `staging` for
    the caller to move into `out`."""
    variants = dict(manifest.variants)
    with tempfile.TemporaryDirectory(prefix=".shortlist-", dir=out) as tmp:
        work = staging or Path(tmp)
        for key, v in manifest.variants.items():
            if v.graph != "fused" or set(v.shortlist_steps) == set(v.decoder_steps()):
                continue
            steps = shortlist_steps(model, out, v, work, keep_in_work=staging is not None)
            variants[key] = v.model_copy(update={"shortlist_steps": steps})
            log.info("built the shortlist steps of %s", key)
    return manifest.model_copy(update={"shortlist": spec, "variants": variants})


def install(model: Transformer, out: Path, manifest: Manifest, shortlist: Shortlist) -> Manifest:
    """Store `shortlist` with the export in `out` (its .npz and the fused variants' shortlist steps,
    replacing any earlier ones) and write the manifest; returns it. Every file is made in a staging
    dir first and moved into `out` only once all are made: a failure leaves `out` as it was."""
    with tempfile.TemporaryDirectory(prefix=".shortlist-", dir=out) as tmp:
        staging = Path(tmp)
        shortlist.save(staging / SHORTLIST_FILE)
        spec = ShortlistSpec(
            file=SHORTLIST_FILE,
            sha256=sha256_file(staging / SHORTLIST_FILE),
            per_source=int(shortlist.params["per_source"]),
            always=int(shortlist.params["always"]),
            derived_from=shortlist.params["derived_from"],
            pairs=int(shortlist.params["pairs"]),
            masks_repeats=True,
        )
        bare = {k: v.model_copy(update={"shortlist_steps": {}}) for k, v in manifest.variants.items()}
        updated = with_shortlist(model, out, manifest.model_copy(update={"variants": bare}), spec, staging)
        for path in list(staging.iterdir()):
            path.replace(out / path.name)
    if manifest.weights:  # the new steps' weights join the shared files
        updated = share_weights(out, updated)
    write_manifest(out, Manifest.model_validate(updated.model_dump()))
    return updated


def write_vmap(shortlist: Shortlist, source_pieces: dict[int, str], target_pieces: dict[int, str], path: Path) -> int:
    """The shortlist in CTranslate2's vocabulary-map text format (its vocabulary_map.cc): one line
    `SOURCE_PIECE<TAB>TARGET_PIECE TARGET_PIECE ...` per source token with candidates, and one line
    with an empty source for the tokens every batch ranks. Returns the lines written. Tokens
    without a piece (never the case for a model's own vocabularies) are left out."""
    lines = ["\t" + " ".join(target_pieces[i] for i in shortlist.always.tolist() if i in target_pieces)]
    for s in range(shortlist.source_size):
        row = [target_pieces[t] for t in shortlist.row(s).tolist() if t in target_pieces]
        if row and s in source_pieces:
            lines.append(f"{source_pieces[s]}\t{' '.join(row)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return len(lines)
