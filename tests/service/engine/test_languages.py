"""A model's language pairs: which requests it serves, the tokens a pair adds, the pages of pairs."""

from __future__ import annotations

import pytest

from contract.manifest import LanguageSpec
from service.engine.languages import LanguagePair, ModelLanguages, describe_pairs, pair_page
from service.errors import InvalidArgument

ONE_PAIR = ModelLanguages(LanguageSpec(source=["de"], target=["en"]))
MANY = ModelLanguages(
    LanguageSpec(
        source=["de", "en", "fr"],
        target=["de", "en", "fr"],
        source_tokens={"de": 10, "en": 11, "fr": 12},
        target_tokens={"de": 10, "en": 11, "fr": 12},
    )
)


def test_pairs_and_serves():
    assert ONE_PAIR.pairs == [("de", "en")] and not ONE_PAIR.multilingual
    assert ONE_PAIR.serves(LanguagePair("de", "en")) and ONE_PAIR.serves(LanguagePair(target="en"))
    assert not ONE_PAIR.serves(LanguagePair("fr", "en")) and not ONE_PAIR.serves(LanguagePair("de", "fr"))
    assert MANY.pairs == [("de", "en"), ("de", "fr"), ("en", "de"), ("en", "fr"), ("fr", "de"), ("fr", "en")]
    assert MANY.serves(LanguagePair("fr", "de")) and not MANY.serves(LanguagePair("de", "de"))
    assert not MANY.serves(LanguagePair("de", "ja"))


def test_prefixes():
    assert ONE_PAIR.prefixes(LanguagePair()).source == () == ONE_PAIR.prefixes(LanguagePair()).target
    p = MANY.prefixes(LanguagePair("fr", "de"))
    assert p.source == (12,) and p.target == (10,)
    with pytest.raises(InvalidArgument, match=r"^request\.target_language: "):
        MANY.prefixes(LanguagePair("fr"), "request.")
    with pytest.raises(InvalidArgument, match=r"^source_language: "):
        MANY.prefixes(LanguagePair(target="de"))
    assert MANY.prefixes(LanguagePair("en"), need_target=False).source == (11,)


def test_pages_and_descriptions():
    pairs = [(f"l{i}", "en") for i in range(25)]
    page, token = pair_page(pairs, 10, "")
    assert page == pairs[:10] and token == "10"
    page, token = pair_page(pairs, 10, "20")
    assert page == pairs[20:] and token == ""
    assert pair_page(pairs, 0, "")[0] == pairs  # 0: the default page size (100)
    assert pair_page(pairs, 10, "9" * 18) == ([], "")  # past the end: an empty page
    for size, token, field in (
        (-1, "", "page_size"),
        (5000, "", "page_size"),
        (10, "x1", "page_token"),
        (10, "9" * 19, "page_token"),
        (10, "9" * 5000, "page_token"),  # past Python's int() digit limit: was INTERNAL
    ):
        with pytest.raises(InvalidArgument, match=f"^{field}: "):
            pair_page(pairs, size, token)
    text = describe_pairs(pairs)
    assert text.startswith("l0->en, l1->en") and text.endswith("(25 in all)") and "l20->en" not in text
