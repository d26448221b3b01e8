"""Alignment pictures: the target x source cross-attention of a translation as a labelled heatmap
(`mtserve translate --alignment out.png "..."`). Client side only; needs matplotlib, the `plot`
extra (`pip install 'mtserve[plot]'`), imported when a picture is drawn."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from contract.byte_level import BYTE_OF_CHARACTER
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client.client import alignment_matrix

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 150
CONTINUATION = "·"  # marks a subword piece that continues the previous token's word
SPECIAL = re.compile(r"<[^<>\s]+>")  # </s>, <unk>, <pad>: shown as they are


def readable_token(token: str) -> str:
    """One byte-level BPE token as text: 'ĠHund' -> 'Hund', 'MÃ¤' -> 'Mä', a piece that continues a
    word -> '·en'. Special tokens ('</s>') stay as they are; a piece holding part of a multi-byte
    character shows U+FFFD."""
    table = BYTE_OF_CHARACTER
    if not token or SPECIAL.fullmatch(token) or any(c not in table for c in token):
        return token
    data = bytes(table[c] for c in token)
    word_start = data.startswith(b" ")
    text = data.decode("utf-8", errors="replace").strip()
    if not text:
        return "␣"
    if not word_start and not all(unicodedata.category(c).startswith("P") for c in text):
        text = CONTINUATION + text
    return text


def readable_tokens(tokens: list[str]) -> list[str]:
    return [readable_token(t) for t in tokens]


def figure_size(n_source: int, n_target: int) -> tuple[float, float]:
    """Inches: a cell of about 0.45 in per token, with room for labels and the colour bar."""
    return max(4.0, 0.45 * n_source + 2.2), max(3.0, 0.45 * n_target + 1.8)


def alignment_figure(
    source_tokens: list[str], target_tokens: list[str], weights: np.ndarray, title: str | None = None
) -> Figure:
    """A matplotlib Figure (no pyplot, so no GUI backend or global state): rows are target tokens,
    columns source tokens, darker = more attention."""
    try:
        from matplotlib.figure import Figure
    except ModuleNotFoundError:  # pragma: no cover - depends on the install
        raise SystemExit("alignment pictures need matplotlib: pip install 'mtserve[plot]'") from None
    weights = np.asarray(weights, dtype=np.float32)
    if weights.shape != (len(target_tokens), len(source_tokens)):
        raise ValueError(
            f"weights have shape {weights.shape}, expected "
            f"({len(target_tokens)} target, {len(source_tokens)} source tokens)"
        )
    fig = Figure(figsize=figure_size(len(source_tokens), len(target_tokens)), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    # Black = the strongest weight of the picture (the colour bar gives the scale).
    vmax = float(weights.max()) if weights.size and weights.max() > 0 else 1.0
    image = ax.imshow(weights, cmap="Greys", vmin=0.0, vmax=vmax, aspect="equal", interpolation="nearest")
    ax.set_xticks(
        range(len(source_tokens)), readable_tokens(source_tokens), rotation=60, ha="right", rotation_mode="anchor"
    )
    ax.set_yticks(range(len(target_tokens)), readable_tokens(target_tokens))
    ax.set_xlabel("source")
    ax.set_ylabel("translation")
    if title:
        ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention")
    return fig


def save_alignment(translation: pb.Translation, path: str | Path, source_text: str | None = None) -> Figure:
    """Draw an mtserve.v1 Translation's alignment (requested with return_alignment) into `path`
    (format from its suffix: .png, .svg, .pdf); returns the Figure."""
    a = translation.alignment
    if not a.source_tokens:
        raise ValueError("the translation carries no alignment (request it with return_alignment=True)")
    title = f"{source_text}\n→ {translation.text}" if source_text else translation.text
    fig = alignment_figure(list(a.source_tokens), list(a.target_tokens), alignment_matrix(translation), title)
    fig.savefig(path, dpi=DPI)
    return fig
