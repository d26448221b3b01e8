"""Multi30k-style parallel data: `SPLIT.LANG` or `SPLIT.LANG.gz`, one sentence per line."""

from __future__ import annotations

import gzip
import os
import random
from dataclasses import dataclass
from pathlib import Path

# The corpus that ships with the project (data/multi30k/ in the checkout), unless MTSERVE_DATA_DIR
# says otherwise.
SHIPPED_DATA_DIR = Path(__file__).resolve().parent.parent / "data" / "multi30k"
DEFAULT_DATA_DIR = Path(os.environ.get("MTSERVE_DATA_DIR") or SHIPPED_DATA_DIR)


def split_path(data_dir: str | Path, split: str, lang: str) -> Path:
    data_dir = Path(data_dir)
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (data_dir / name).is_file():
            return data_dir / name
    raise FileNotFoundError(f"no {split}.{lang} or {split}.{lang}.gz in {data_dir}")


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n").strip() for line in f]


def read_parallel(
    data_dir: str | Path, split: str, src_lang: str = "de", tgt_lang: str = "en"
) -> tuple[list[str], list[str]]:
    src = read_lines(split_path(data_dir, split, src_lang))
    tgt = read_lines(split_path(data_dir, split, tgt_lang))
    if len(src) != len(tgt):
        raise ValueError(f"{split}: {len(src)} {src_lang} lines but {len(tgt)} {tgt_lang} lines")
    return src, tgt


@dataclass
class Batch:
    src: list[list[int]]  # source ids, each ending with </s>
    tgt: list[list[int]]  # target ids without specials
    indices: list[int]

    @property
    def n_tgt_tokens(self) -> int:
        return sum(len(t) + 1 for t in self.tgt)


def token_batches(
    src: list[list[int]], tgt: list[list[int]], max_tokens: int, seed: int | None, epoch: int = 0
) -> list[Batch]:
    """Length-bucketed batches: sort by length (with random tie-breaking), cut into batches whose
    padded size (rows x longest side) stays under `max_tokens`, then shuffle the batch order."""
    rng = random.Random(None if seed is None else seed * 1000 + epoch)
    order = list(range(len(src)))
    if seed is not None:
        rng.shuffle(order)
    order.sort(key=lambda i: (len(tgt[i]), len(src[i])))
    batches: list[list[int]] = []
    cur: list[int] = []
    longest = 0
    for i in order:
        n = max(len(src[i]), len(tgt[i]) + 1)
        if cur and max(longest, n) * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        batches.append(cur)
    if seed is not None:
        rng.shuffle(batches)
    return [Batch([src[i] for i in b], [tgt[i] for i in b], b) for b in batches]
