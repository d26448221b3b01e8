"""Byte-level BPE's alphabet (GPT-2's `bytes_to_unicode`), in which mtserve's own tokenizer.json
spells its tokens (the tokenizers library's ByteLevel pre-tokenizer and decoder): printable Latin-1
bytes stand for themselves, the others for the characters from U+0100 on ("Ġ" is the space). The
serving path reads a token's bytes with it (service.runtime.tokenizer), and the client shows
tokens as text (service.client.alignment_plot)."""

from __future__ import annotations


def _characters() -> dict[int, str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in alphabet:
            alphabet[b] = chr(256 + extra)
            extra += 1
    return alphabet


CHARACTER_OF_BYTE: dict[int, str] = _characters()
BYTE_OF_CHARACTER: dict[str, int] = {c: b for b, c in CHARACTER_OF_BYTE.items()}
