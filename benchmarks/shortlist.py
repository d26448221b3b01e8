"""The vocabulary shortlist (contract/shortlist.py, `mtserve shortlist`) measured for quality: sacreBLEU
on the 1,000 test_2016_flickr sentences of the trained Marian of docs/models.md ("A trained model"),
with and without a shortlist derived from Multi30k's training pairs, and CTranslate2 greedy on the
same folder with and without the same mapping (`use_vmap`):

    python -m benchmarks.shortlist --bleu           # sizes (per source:always) 50:100, 20:50, 10:20
    python -m benchmarks.shortlist --bleu --sizes 50:100 20:50 10:20 50:100:mono   # :mono: from the
                                                  # model's own translations (--monolingual)
    python -m benchmarks.shortlist --bleu --sizes 50:100 100:200 --hf DIR --model VERSION_DIR
    flock /tmp/bench.lock python -m benchmarks.shortlist --speed    # the engine's speed by size, real size

Each size is a copy of the imported version (benchmarks/.cache/shortlist-bleu/p{N}-a{M}/: its graph
files hard links of the original's, its manifest a copy) that `mtserve shortlist --vmap` then
gives a shortlist; the original is left as it is. mtserve's figures are `mtserve evaluate --json`
of each (fp32 and int8, greedy and beam 4). CTranslate2 runs a conversion of the same folder
(`convert_marian`: it starts from the <pad> embedding as transformers and mtserve do, where
CTranslate2's Marian loader would start from zeros and drop the last vocabulary row as if it were
<pad>; this folder's <pad> is id 2), with mtserve's length rule, and the vmap as `vmap.txt` in a
linked copy of its dir (`with_vmap`). Every figure's command is printed with it.

`--speed` times the engine greedy on the OPUS-MT-sized model of benchmarks/real_size.py without a
shortlist and with each size's, so that a size can be chosen; the comparisons with CTranslate2 are
benchmarks/real_size.py's shortlist rows. Run timings under a lock of their own (nothing else
timed at once).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.real_size_model import DATA, REPO, read_lines

CACHE = REPO / "benchmarks" / ".cache"
TRAINED_HF = Path("/tmp/marian-de-en")  # export.hf.train_marian's output (docs/models.md)
TRAINED_VERSION = Path("/tmp/byom-models/marian-de-en/1")  # its `mtserve import`
LINKED_SUFFIXES = (".onnx", ".onnx_data", ".safetensors", ".bin", ".spm")
Row = dict[str, Any]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Size:
    """A shortlist's size: target tokens kept per source token, and most frequent ones always in;
    derived from the training pairs, or (`monolingual`) from the model's own greedy translations
    of their source side (`mtserve shortlist --monolingual`)."""

    per_source: int
    always: int
    monolingual: bool = False

    @classmethod
    def parse(cls, text: str) -> Size:
        """PER_SOURCE:ALWAYS[:mono] (e.g. 50:100, 50:100:mono) as a Size."""
        per_source, always, *rest = text.split(":") + [""]
        if not per_source.isdigit() or not always.isdigit() or rest not in ([""], ["mono", ""]):
            raise argparse.ArgumentTypeError(f"a size is PER_SOURCE:ALWAYS[:mono] (e.g. 50:100), not {text!r}")
        return cls(int(per_source), int(always), rest[0] == "mono")

    @property
    def key(self) -> str:
        return f"p{self.per_source}-a{self.always}" + ("-mono" if self.monolingual else "")

    @property
    def label(self) -> str:
        return f"{self.per_source} : {self.always}" + (" (own translations)" if self.monolingual else "")


def link_tree(src: Path, dst: Path) -> Path:
    """A copy of `src` at `dst` (replaced) whose large files (LINKED_SUFFIXES) are hard links and
    whose others (manifests, configs: what a tool may rewrite in place) are copies."""
    shutil.rmtree(dst, ignore_errors=True)

    def copy(s: str, d: str) -> None:
        if s.endswith(LINKED_SUFFIXES):
            try:
                os.link(s, d)
                return
            except OSError:
                pass
        shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy)
    return dst


def with_vmap(ct2_dir: Path, vmap: Path, out: Path) -> Path:
    """A linked copy of a CTranslate2 model dir with `vmap` as its vmap.txt (what use_vmap reads)."""
    link_tree(ct2_dir, out)
    (out / "vmap.txt").unlink(missing_ok=True)
    shutil.copyfile(vmap, out / "vmap.txt")
    return out


def read_vmap(path: Path) -> tuple[list[str], dict[str, list[str]]]:
    """A CTranslate2 vocabulary map (`SOURCE<TAB>TARGET TARGET ...` a line, the empty source's line
    the always-included targets; vocabulary_map.cc): (always targets, targets by source token)."""
    always: list[str] = []
    rules: dict[str, list[str]] = {}
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        source, tab, targets = line.partition("\t")
        if not tab:
            raise ValueError(f"{path}:{n}: no tab")
        if " " in source:
            raise ValueError(f"{path}:{n}: an n-gram source; the shortlist maps single tokens")
        tokens = targets.split(" ") if targets else []
        if source:
            rules[source] = tokens
        else:
            always = tokens
    return always, rules


def check_vmap(shortlist_file: Path, vmap: Path, tokens: list[str]) -> int:
    """Raise unless the vocabulary map allows each source token the targets the shortlist does
    (`tokens`: the shared vocabulary in id order); the number of source tokens compared."""
    from contract.shortlist import Shortlist

    sl = Shortlist.load(shortlist_file)
    always, rules = read_vmap(vmap)
    if set(always) != {tokens[i] for i in sl.always}:
        raise ValueError(f"{vmap}: its always-included targets are not the shortlist's")
    for s in range(sl.source_size):
        want = {tokens[i] for i in sl.row(s)}
        if set(rules.get(tokens[s], ())) != want:
            raise ValueError(f"{vmap}: source token {tokens[s]!r} maps to other targets than the shortlist's")
    return sl.source_size


def convert_marian(hf: Path, out: Path) -> Path:
    """CTranslate2's conversion (float32 weights; int8 at load) of a Marian folder whose decoding
    starts from the <pad> embedding wherever <pad> sits, as transformers and mtserve decode."""
    if (out / "model.bin").exists():
        return out
    from ctranslate2.converters import transformers as ct

    class PadStartMarian(ct.MarianMTLoader):
        def get_model_spec(self, model: Any) -> Any:
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct.BartLoader.get_model_spec(self, model)  # keeps every vocabulary row

        def get_vocabulary(self, model: Any, tokenizer: Any) -> Any:
            return ct.BartLoader.get_vocabulary(self, model, tokenizer)

        def set_config(self, config: Any, model: Any, tokenizer: Any) -> None:
            super().set_config(config, model, tokenizer)
            config.decoder_start_token = tokenizer.pad_token

        def set_decoder(self, spec: Any, decoder: Any) -> None:
            ct.BartLoader.set_decoder(self, spec, decoder)  # the <pad> row, not zeros

    original = ct._MODEL_LOADERS["MarianConfig"]
    ct._MODEL_LOADERS["MarianConfig"] = PadStartMarian()
    try:
        ct.TransformersConverter(str(hf)).convert(str(out), force=True)
    finally:
        ct._MODEL_LOADERS["MarianConfig"] = original
    return out


def ct2_translate(
    translator: Any, tokenizer: Any, texts: list[str], beam: int, use_vmap: bool, batch: int = 64
) -> list[str]:
    """CTranslate2 under mtserve's length rule (`mtserve evaluate`'s defaults: at most
    int(1.5 * source tokens + 10) - 1 tokens before </s>; exact for greedy search), <pad> never
    emitted; batches of similar lengths, outputs in input order."""
    src = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(texts).input_ids]
    limits = [int(1.5 * len(s) + 10) - 1 for s in src]
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    out = [""] * len(src)
    for start in range(0, len(order), batch):
        idx = order[start : start + batch]
        results = translator.translate_batch(
            [src[i] for i in idx],
            beam_size=beam,
            max_decoding_length=max(limits[i] for i in idx),
            suppress_sequences=[[tokenizer.pad_token]],
            use_vmap=use_vmap,
        )
        for i, r in zip(idx, results):
            out[i] = tokenizer.convert_tokens_to_string(r.hypotheses[0][: limits[i]])
    return out


def ct2_bleu(ct2_dir: Path, hf: Path, split: str, beam: int, use_vmap: bool, compute_type: str, threads: int) -> Row:
    import ctranslate2
    import sacrebleu
    from transformers import AutoTokenizer

    texts, refs = read_lines("de", split), read_lines("en", split)
    translator = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute_type, intra_threads=threads)
    t0 = time.perf_counter()
    hyps = ct2_translate(translator, AutoTokenizer.from_pretrained(str(hf)), texts, beam, use_vmap)
    seconds = time.perf_counter() - t0
    return {
        "bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
        "sentences_per_s": round(len(texts) / seconds, 1),
    }


def evaluate_cmd(version: Path, precision: str, beam: int, threads: int, split: str) -> list[str]:
    return [
        *(sys.executable, "-m", "mtserve", "evaluate", "--model", str(version), "--split", split, "--engine", "onnx"),
        *("--precision", precision, "--beam", str(beam), "--threads", str(threads), "--json"),
    ]


def mtserve_bleu(version: Path, precision: str, beam: int, threads: int, split: str) -> Row:
    """`mtserve evaluate --json` of the version (its shortlist on where it has one)."""
    cmd = evaluate_cmd(version, precision, beam, threads, split)
    out = subprocess.run(cmd, check=True, cwd=REPO, capture_output=True, text=True).stdout
    row: Row = json.loads(out.strip().splitlines()[-1])
    return {"bleu": row["bleu"], "sentences_per_s": row["sentences_per_s"]}


def shortlist_cmd(version: Path, size: Size, vmap: Path, data: Path = DATA) -> list[str]:
    corpus = ["--source", str(data / "train.de.gz"), "--target", str(data / "train.en.gz")]
    return [
        *(sys.executable, "-m", "mtserve", "shortlist", "--model", str(version)),
        *(["--monolingual", str(data / "train.de.gz")] if size.monolingual else corpus),
        *("--per-source", str(size.per_source), "--always", str(size.always)),
        *("--min-identical", "0"),  # each size is measured as it is, however many outputs it changes
        *("--vmap", str(vmap)),
    ]


# The code that derives a shortlist and writes its graphs: a change to any of them derives it again.
SHORTLIST_CODE = ("contract/shortlist.py", "export/shortlist.py", "mtserve/shortlist.py", "export/fused.py")


def derivation_key(version: Path, size: Size) -> str:
    """What a derived copy depends on: the original's manifest (a re-export rewrites the linked
    graphs in place), the size, and the code of SHORTLIST_CODE."""
    import hashlib

    h = hashlib.sha256((version / "onnx" / "manifest.json").read_bytes())
    h.update(size.key.encode())
    for name in SHORTLIST_CODE:
        h.update((REPO / name).read_bytes())
    return h.hexdigest()


def derive(version: Path, root: Path, size: Size, data: Path = DATA) -> tuple[Path, Path]:
    """A linked copy of `version` at ROOT/models/NAME/1 with the shortlist of `size` derived from
    the training pairs, and its vocabulary map at ROOT/vmap.txt; reused while `derivation_key`
    is the one it was made under."""
    copy, vmap, stamp = root / "models" / version.parent.name / "1", root / "vmap.txt", root / "derivation.sha256"
    source = derivation_key(version, size)
    if vmap.exists() and stamp.exists() and stamp.read_text() == source:
        return copy, vmap
    stamp.unlink(missing_ok=True)
    link_tree(version, copy)
    cmd = shortlist_cmd(copy, size, vmap, data)
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, cwd=REPO, stdout=sys.stderr)
    stamp.write_text(source)
    return copy, vmap


def candidate_counts(shortlist_file: Path, sources: list[list[int]], batch: int = 32) -> Row:
    """The mean K (vocab_ids a step ranks) over one-sentence batches and over batches of `batch`
    sentences of similar length, as the engine forms them."""
    from contract.shortlist import Shortlist

    sl = Shortlist.load(shortlist_file)
    rows = [sl.candidates(s) for s in sources]
    single = [len(sl.batch_ids([r])) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: len(sources[i]))
    batches = [[rows[i] for i in order[s : s + batch]] for s in range(0, len(order), batch)]
    return {
        "k_single": round(sum(single) / len(single), 1),
        f"k_batch{batch}": round(sum(len(sl.batch_ids(b)) for b in batches) / len(batches), 1),
        "vocab": sl.vocab_size,
    }


SETTINGS = [("fp32", 1), ("int8", 1), ("fp32", 4), ("int8", 4)]  # mtserve's (precision, beam)


def bleu_rows(hf: Path, original: Path, sizes: list[Size], cache: Path, threads: int, split: str) -> list[Row]:
    """Per shortlist (none first, then each size) of the imported version `original` of the
    Marian folder `hf`: mtserve's BLEU at every setting, CTranslate2's greedy (int8 and float32
    compute) with the same mapping or none, and the mean K."""
    from transformers import AutoTokenizer

    ct2 = convert_marian(hf, cache / "ct2")
    tokenizer = AutoTokenizer.from_pretrained(str(hf))
    sources = tokenizer(read_lines("de", split)).input_ids
    vocabulary = [str(tokenizer.convert_ids_to_tokens(i)) for i in range(len(tokenizer))]
    rows = []
    for size in [None, *sizes]:
        version, ct2_dir = original, ct2
        row: Row = {"size": size.key if size else "none", "label": size.label if size else "none"}
        if size is not None:
            version, vmap = derive(original, cache / size.key, size)
            check_vmap(version / "onnx" / "shortlist.npz", vmap, vocabulary)
            ct2_dir = with_vmap(ct2, vmap, cache / size.key / "ct2-vmap")
            row |= candidate_counts(version / "onnx" / "shortlist.npz", sources)
        for precision, beam in SETTINGS:
            row[f"mtserve_{precision}_beam{beam}"] = mtserve_bleu(version, precision, beam, threads, split)
            log(f"{row['size']} mtserve {precision} beam {beam}: {row[f'mtserve_{precision}_beam{beam}']}")
        for compute in ("int8", "float32"):
            row[f"ct2_{compute}_beam1"] = ct2_bleu(ct2_dir, hf, split, 1, size is not None, compute, threads)
            log(f"{row['size']} CTranslate2 {compute} greedy: {row[f'ct2_{compute}_beam1']}")
        rows.append(row)
    return rows


COLUMNS = [
    *((f"mtserve_{p}_beam{b}", f"mtserve {p} {'greedy' if b == 1 else f'beam {b}'}") for p, b in SETTINGS),
    ("ct2_int8_beam1", "CTranslate2 int8 greedy"),
    ("ct2_float32_beam1", "CTranslate2 fp32 greedy"),
]


def bleu_table(rows: list[Row]) -> list[str]:
    """Markdown: BLEU (its change against no shortlist) per setting, and the mean K."""
    base = rows[0]
    lines = [
        "| shortlist (per source : always) | mean K, 1 sentence / 32 | " + " | ".join(t for _, t in COLUMNS) + " |",
        "| --- | --- | " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    for r in rows:
        name = r["label"]
        k = f"{r['k_single']} / {r['k_batch32']}" if "k_single" in r else f"{base.get('vocab', 'all')}"
        cells = []
        for key, _ in COLUMNS:
            bleu = r[key]["bleu"]
            cells.append(f"{bleu}" if r is base else f"{bleu} ({bleu - base[key]['bleu']:+.2f})")
        lines.append(f"| {name} | {k} | " + " | ".join(cells) + " |")
    return lines


def speed_rows(sizes: list[Size], rounds: int = 3) -> list[Row]:
    """The engine greedy on the real-size model (benchmarks/real_size.py's workers, 30 forced
    tokens) without a shortlist and with each size's: offline sentences/s (2 loops x 1 thread)
    and one sentence's p50 on 1 thread, `rounds` rounds in alternating order, medians; and the
    mean K of each size over the test sentences. Time it under the lock."""
    import statistics

    from benchmarks import real_size as rs
    from benchmarks.real_size_model import prepare, prepare_shortlist

    prep, plan = prepare(), rs.quick_plan()
    dirs: dict[str, tuple[Path, bool]] = {"none": (prep.model, False)}
    labels = {"none": "none", **{size.key: size.label for size in sizes}}
    for size in sizes:
        if size.monolingual:
            raise ValueError("--speed times shortlists of the training pairs only")
        dirs[size.key] = (prepare_shortlist(prep, (size.per_source, size.always))[0], True)
    workers = {
        key: (
            rs.worker("mtserve", d, prep.hf, 2, 2, plan.batch, shortlist=on),
            rs.worker("mtserve", d, prep.hf, 1, 1, plan.batch, shortlist=on),
        )
        for key, (d, on) in dirs.items()
    }
    figs: dict[str, dict[str, list[float]]] = {key: {"offline": [], "single": []} for key in workers}
    try:
        for r in range(rounds):
            for key in list(workers) if r % 2 == 0 else reversed(list(workers)):
                figs[key]["offline"].append(rs.offline_part(workers[key][0], plan, 1)())
                figs[key]["single"].append(rs.single_part(workers[key][1], plan, 1)())
    finally:
        for pair in workers.values():
            for w in pair:
                w.close()
    rows = []
    for key, (d, on) in dirs.items():
        row: Row = {
            "size": key,
            "label": labels[key],
            **(rs.candidate_counts(prep, d / "onnx" / "shortlist.npz") if on else {}),
        }
        row["sentences_per_s"] = statistics.median(figs[key]["offline"])
        row["single_p50_ms"] = statistics.median(figs[key]["single"])
        row["runs"] = figs[key]
        rows.append(row)
    return rows


def speed_table(rows: list[Row]) -> list[str]:
    """Markdown: each size's mean K and speed, and its ratio to no shortlist (the first row)."""
    base, vocab = rows[0], max(r.get("vocab", 0) for r in rows)
    lines = [
        "| shortlist (per source : always) | mean K, 1 sentence / 32 | offline sent/s (x none) | single p50 ms (x none) |",
        "| --- | --- | --- | --- |",
    ]
    for r in rows:
        name = r["label"]
        k = f"{r['k_single']} / {r['k_batch32']}" if "k_single" in r else f"{vocab:,} (all)"
        off = r["sentences_per_s"] / base["sentences_per_s"]
        single = r["single_p50_ms"] / base["single_p50_ms"]
        lines.append(f"| {name} | {k} | {r['sentences_per_s']} ({off:.2f}) | {r['single_p50_ms']} ({single:.2f}) |")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--bleu", action="store_true", help="the BLEU table on the trained Marian")
    ap.add_argument("--speed", action="store_true", help="the engine's speed by size at real size (use the lock)")
    ap.add_argument("--sizes", nargs="+", type=Size.parse, default=[Size(50, 100), Size(20, 50), Size(10, 20)])
    ap.add_argument("--hf", default=str(TRAINED_HF), help="the trained Marian folder (export.hf.train_marian)")
    ap.add_argument("--model", default=str(TRAINED_VERSION), help="its `mtserve import`, left as it is")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--split", default="test_2016_flickr")
    ap.add_argument("--cache", default=str(CACHE / "shortlist-bleu"))
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args(argv)
    if args.bleu == args.speed:
        ap.error("give one of --bleu and --speed")
    if args.speed:
        rows = speed_rows(args.sizes)
        table = speed_table(rows)
    else:
        rows = bleu_rows(Path(args.hf), Path(args.model), args.sizes, Path(args.cache), args.threads, args.split)
        table = bleu_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print("\n".join(table))
    print("\n$ " + " ".join(["python -m benchmarks.shortlist", *(argv if argv is not None else sys.argv[1:])]))
    if args.bleu:
        cell = " ".join(evaluate_cmd(Path("VERSION_DIR"), "fp32", 1, args.threads, args.split))
        print(f"each mtserve cell: $ {cell.replace('--beam 1', '--beam B')} (VERSION_DIR: {args.model} or its copies)")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
