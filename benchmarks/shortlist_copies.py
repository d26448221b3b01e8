"""Shortlisted copies of an imported model version, as the shortlist benchmarks use them: a
shortlist's size (`Size`), a linked copy of the version that `mtserve shortlist` gave the shortlist
of a size (`derive`, reused while the code that derives it is unchanged), a CTranslate2 dir with
the same mapping as its vmap.txt (`with_vmap`), the real-size model's shortlisted copy
(`prepare_shortlist`) and the mean number of candidates a step ranks (`candidate_counts`).
benchmarks/shortlist.py (quality and speed by size) and benchmarks/real_size.py (the shortlist
rows) both build on it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.real_size_model import DATA, REPO, Prepared
from contract.manifest import PRECISIONS
from contract.weights import weights_file

LINKED_SUFFIXES = (".onnx", ".onnx_data", ".safetensors", ".bin", ".spm")
SHARED_WEIGHTS = frozenset(weights_file(p) for p in PRECISIONS)
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
    whose others (manifests, configs: what a tool may rewrite in place) are copies. The shared
    weights files of an export are copies too: the onnx package refuses to read external data
    through a file with more than one link."""
    shutil.rmtree(dst, ignore_errors=True)

    def copy(s: str, d: str) -> None:
        if s.endswith(LINKED_SUFFIXES) and Path(s).name not in SHARED_WEIGHTS:
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
SHORTLIST_CODE = (
    "contract/shortlist.py",
    "export/shortlist.py",
    "mtserve/shortlist.py",
    "export/fused/__init__.py",
    "export/fused/builder.py",
    "export/fused/ranking.py",
    "export/fused/decoder.py",
    "export/fused/encoder.py",
)


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
    fill = int(sl.always[0])  # a special id: any candidate pads to the same K
    single = [len(sl.batch_ids([r], fill)) for r in rows]
    order = sorted(range(len(rows)), key=lambda i: len(sources[i]))
    batches = [[rows[i] for i in order[s : s + batch]] for s in range(0, len(order), batch)]
    return {
        "k_single": round(sum(single) / len(single), 1),
        f"k_batch{batch}": round(sum(len(sl.batch_ids(b, fill)) for b in batches) / len(batches), 1),
        "vocab": sl.vocab_size,
    }


# The shortlist of the real-size rows (per source token, always): `mtserve shortlist`'s defaults.
SHORTLIST = (50, 100)


def prepare_shortlist(prep: Prepared, size: tuple[int, int] = SHORTLIST, data: Path = DATA) -> tuple[Path, Path]:
    """The imported version with a vocabulary shortlist of `size` that `mtserve shortlist` derives
    from the corpus's training pairs (de->en), in a linked copy (derive:
    ROOT/shortlist-pN-aM/models/opus-size/1), and the CTranslate2 int8 dir with the same mapping
    as its vmap.txt (ROOT/shortlist-pN-aM/ct2-int8-vmap): (version dir, CTranslate2 dir)."""
    sl = Size(*size)
    root = prep.model.parent.parent.parent / f"shortlist-{sl.key}"
    model, vmap = derive(prep.model, root, sl, data)
    return model, with_vmap(prep.ct2, vmap, root / "ct2-int8-vmap")
