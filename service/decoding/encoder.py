"""The encoder pass of a batch: sources of any lengths run in length-sorted chunks, each padded
only to its own longest source (`encoder_chunks`, `encode_sources`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from service.decoding.model import DecoderModel

# The encoder runs over a batch's sources in length-sorted chunks, each padded only to its own longest
# source (a mixed batch of 16 padded to its longest is 42% padding, test_2016_flickr). A chunk takes
# the next longer source while that adds at most this many padding tokens to it, about what one more
# encoder call costs (25-30 µs a token, 0.4-0.5 ms a call), up to ENCODE_CHUNK sentences. Offline, in
# sorted batches of 32, chunks of 16 cost 7% less than chunks of 8 (docs/performance.md).
ENCODE_PAD_TOKENS = 16
ENCODE_CHUNK = 32


def encoder_chunks(
    lens: np.ndarray, chunk: int = ENCODE_CHUNK, pad_tokens: int = ENCODE_PAD_TOKENS
) -> list[np.ndarray]:
    """Rows by increasing length, cut where the next source would add more than `pad_tokens` padding
    to its chunk, or at `chunk` rows."""
    order = np.argsort(lens, kind="stable")
    chunks, start, real = [], 0, 0
    for i, r in enumerate(order.tolist()):
        L = int(lens[r])
        if i > start and (i - start == chunk or (i - start + 1) * L - (real + L) > pad_tokens):
            chunks.append(order[start:i])
            start, real = i, 0
        real += L
    chunks.append(order[start:])
    return chunks


def encode_sources(
    model: DecoderModel,
    src_ids_lists: Sequence[Sequence[int]],
    chunk: int = ENCODE_CHUNK,
    pad_tokens: int = ENCODE_PAD_TOKENS,
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """Run the encoder over sources of any lengths -> lens (n,), src_mask (n, S) int64 and per
    decoder layer the cross-attention keys and values (n, H, S, d_k), S the longest source, rows in
    input order. Sorted by length and run in chunks (`encoder_chunks`), so that no chunk pays much
    for another's longest source; what lies past a source's end is hidden by src_mask."""
    n = len(src_ids_lists)
    lens = np.array([len(s) for s in src_ids_lists], dtype=np.int64)
    S = int(lens.max())
    mask = (np.arange(S)[None, :] < lens[:, None]).astype(np.int64)

    def run(rows: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        s_len = int(lens[rows].max())
        ids = np.full((len(rows), s_len), model.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, : lens[r]] = src_ids_lists[r]
        _, ck, cv = model.encode(ids, np.ascontiguousarray(mask[rows, :s_len]))
        return ck, cv

    chunks = encoder_chunks(lens, chunk, pad_tokens)
    if len(chunks) == 1:
        ck, cv = run(list(range(n)))
        return lens, mask, list(ck), list(cv)
    ck_all: list[np.ndarray] = []
    cv_all: list[np.ndarray] = []
    for rows in chunks:
        ck, cv = run(rows.tolist())
        if not ck_all:
            shape = (n, ck[0].shape[1], S, ck[0].shape[3])
            ck_all = [np.empty(shape, dtype=ck[0].dtype) for _ in ck]
            cv_all = [np.empty(shape, dtype=cv[0].dtype) for _ in cv]
        s_len = ck[0].shape[2]
        for out, part in zip(ck_all + cv_all, list(ck) + list(cv)):
            out[rows, :, :s_len] = part
            out[rows, :, s_len:] = 0.0
    return lens, mask, ck_all, cv_all
