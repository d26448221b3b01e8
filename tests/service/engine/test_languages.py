"""A model's language pairs: which requests it serves, the tokens a pair adds, the pages of pairs."""

from __future__ import annotations

import pytest

from contract.manifest import LanguageSpec
from service.engine.languages import LanguagePair, ModelLanguages, describe_pairs, list_languages, pair_page
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


def test_descriptions_of_what_a_model_serves():
    """A one-pair model: its pair, a default pair; a multilingual one: its languages, sorted,
    counted and cut at LISTED_LANGUAGE_BYTES, and no default pair."""
    assert ONE_PAIR.describe() == "de->en" and ONE_PAIR.has_default_pair
    assert MANY.describe() == "3 languages to 3: de, en, fr" and not MANY.has_default_pair
    codes = [f"l{i:03d}" for i in range(200, 0, -1)]  # 200 codes of 4 bytes, given unsorted
    spec = LanguageSpec(
        source=codes,
        target=codes[:2],
        source_tokens={c: i for i, c in enumerate(codes)},
        target_tokens={c: i for i, c in enumerate(codes[:2])},
    )
    text = ModelLanguages(spec).describe()
    assert text.startswith("200 languages to 2: from l001, l002, l003, ") and text.endswith("; into l199, l200")
    cut = list_languages(codes)
    assert cut.startswith("l001, l002") and cut.endswith(", …") and len(cut.encode()) <= 400 + len(", …".encode())
    assert cut.split(", ")[:-1] == sorted(codes)[: len(cut.split(", ")) - 1]
    assert list_languages(["fr", "de"]) == "de, fr"
    assert MANY.why_not(LanguagePair("de", "ja")) == "ja is not one of its target languages"
    assert MANY.why_not(LanguagePair("xx", "de")) == "xx is not one of its source languages"
    assert MANY.why_not(LanguagePair("de", "de")) == "it does not translate a language into itself"
