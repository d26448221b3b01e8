"""The shared weight files of an export dir: one per precision, holding every large initializer of
that precision's graphs once.

Every graph of a precision (the portable and fused encoders, every decoder step, the shortlist
steps) keeps its small initializers (shapes, scalars: under `INLINE_BYTES`) inside the .onnx file
and refers to the others as ONNX external data in `weights_file(precision)`, by offset and length.
An initializer whose bytes two graphs share (the embeddings, the quantised layers of the scored and
unscored steps) is stored once, at one offset both graphs name. Each offset is a multiple of
`ALIGNMENT`, so that ONNX Runtime maps the file into memory instead of reading it (it memory-maps
external data whose offset is a multiple of the allocation granularity: 4 KiB pages on Linux,
64 KiB on Windows).

`export.shared_weights` writes the layout; the manifest lists each weights file with its SHA-256
(`Manifest.weights`), checked on load as the graphs are. Exports whose graphs hold their own
weights (no `Manifest.weights`) serve as they are.
"""

from __future__ import annotations

from typing import Final

ALIGNMENT: Final = 65536  # a multiple of every platform's allocation granularity
INLINE_BYTES: Final = 4096  # initializers under this many bytes stay inside their graph


def weights_file(precision: str) -> str:
    """The shared weights of `precision`'s graphs: weights.int8.bin."""
    return f"weights.{precision}.bin"


def aligned(offset: int) -> int:
    """`offset` rounded up to the next multiple of ALIGNMENT."""
    return -(-offset // ALIGNMENT) * ALIGNMENT
