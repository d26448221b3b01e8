"""contract/byte_level.py: the byte-level BPE alphabet is the tokenizers library's."""

from __future__ import annotations

from tokenizers import pre_tokenizers

from contract.byte_level import BYTE_OF_CHARACTER, CHARACTER_OF_BYTE


def test_the_alphabet_is_the_tokenizers_librarys_one_character_a_byte():
    assert sorted(CHARACTER_OF_BYTE) == list(range(256))
    assert set(CHARACTER_OF_BYTE.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    assert CHARACTER_OF_BYTE[ord(" ")] == "Ġ" and CHARACTER_OF_BYTE[ord("A")] == "A"
    assert all(BYTE_OF_CHARACTER[c] == b for b, c in CHARACTER_OF_BYTE.items())
