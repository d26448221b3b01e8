"""Language identification for `source_language: "auto"` (service/runtime/language_id.py): accuracy
on the shipped corpus among the served languages, per-sentence detection of a mixed text, the
mapping of mtserve's codes (ISO 639-1, NLLB) to the model's, and the threshold decision that
refuses a text rather than guess."""

from __future__ import annotations

import threading

import pytest

from export.data import read_lines, split_path
from service.errors import InvalidArgument
from service.runtime.language_id import Detected, LanguageDetector, Undecided, decide, detector_code
from service.settings import Settings

SERVED = ("de", "fr", "en")
MIXED = [
    "Ein Mann fährt mit dem Fahrrad über eine alte Brücke.",
    "Une femme lit un livre sur un banc dans le parc.",
    "Zwei Kinder spielen im Schnee vor dem Haus.",
    "Le chien court sur la plage avec une balle rouge.",
]


@pytest.fixture(scope="module")
def detector() -> LanguageDetector:
    return LanguageDetector.shared()


@pytest.fixture(scope="module")
def threshold() -> float:
    return Settings().detection_threshold


@pytest.mark.parametrize("lang", ["de", "fr", "en"])
def test_test_set_sentences_among_the_served_languages(detector, data_dir, threshold, lang):
    texts = [t for t in read_lines(split_path(data_dir, "test_2016_flickr", lang)) if len(t) >= 20]
    assert len(texts) >= 100
    ranked = detector.detect_batch(texts, SERVED)
    right = sum(r[0][0] == lang for r in ranked)
    assert right / len(texts) >= 0.99, f"{right} of {len(texts)}"
    # The default threshold keeps nearly all of them, and those it keeps are right.
    kept = [r[0][0] for r in ranked if r[0][1] >= threshold]
    assert len(kept) / len(texts) >= 0.95, f"{len(kept)} of {len(texts)} at or above {threshold}"
    assert sum(k == lang for k in kept) / len(kept) >= 0.995


def test_each_sentence_of_a_mixed_text(detector, threshold):
    from service.engine.documents import sentence_spans

    text = " ".join(MIXED)
    segments = [text[a:b] for a, b in sentence_spans(text, "de")]
    assert segments == MIXED
    found = [decide(r, threshold) for r in detector.detect_batch(segments, SERVED)]
    assert [d.language for d in found if isinstance(d, Detected)] == ["de", "fr", "de", "fr"]
    # The whole text is a mixture: no candidate is as sure of it as of its sentences.
    whole = detector.detect(text, SERVED)
    assert whole[0][0] in ("de", "fr")
    assert whole[0][1] < min(d.confidence for d in found if isinstance(d, Detected))


def test_ranking_is_normalized_over_the_candidates(detector):
    ranked = detector.detect(MIXED[1], ["en", "fr", "de", "it"])
    assert [c for c, _ in ranked][0] == "fr"
    assert sorted(c for c, _ in ranked) == ["de", "en", "fr", "it"]
    assert sum(p for _, p in ranked) == pytest.approx(1.0)
    assert [p for _, p in ranked] == sorted((p for _, p in ranked), reverse=True)
    # One candidate: certain by construction (the choice is among the candidates only).
    assert detector.detect(MIXED[1], ["de"]) == [("de", 1.0)]


def test_nllb_and_other_spellings_of_a_code():
    labels = {"de", "fr", "en", "zh", "ar", "ary", "no", "ms"}
    assert detector_code("deu_Latn", labels) == "de"
    assert detector_code("fra_Latn", labels) == "fr"
    assert detector_code("arb_Arab", labels) == "ar"
    assert detector_code("ary_Arab", labels) == "ary"  # the model's own three-letter label
    assert detector_code("zsm_Latn", labels) == "ms"
    assert detector_code("nob_Latn", labels) == "no"
    assert detector_code("nb", labels) == "no"
    assert detector_code("de-DE", labels) == "de"
    assert detector_code("__de__", labels) == "de"
    assert detector_code("deu", labels) == "de"
    assert detector_code("acm_Arab", labels) is None  # Mesopotamian Arabic: no label of its own
    assert detector_code("xx", labels) is None
    assert detector_code("zxx", labels | {"zxx"}) is None  # "no linguistic content" is no language


def test_nllb_candidates_come_back_as_given(detector):
    nllb = ["eng_Latn", "deu_Latn", "fra_Latn"]
    ranked = detector.detect(MIXED[0], nllb)
    assert ranked[0][0] == "deu_Latn" and {c for c, _ in ranked} == set(nllb)
    iso = dict(detector.detect(MIXED[0], ["en", "de", "fr"]))
    assert [p for _, p in ranked] == pytest.approx([iso[c[:2]] for c, _ in ranked])


def test_candidates_the_model_cannot_tell_apart_share_a_probability(detector):
    ranked = dict(detector.detect("这是一个测试句子，有几个汉字。", ["zho_Hans", "zho_Hant", "eng_Latn"]))
    assert ranked["zho_Hans"] == ranked["zho_Hant"] == pytest.approx(0.5, abs=0.01)
    assert isinstance(decide(list(ranked.items()), 0.6), Undecided)


def test_unknown_candidates_are_refused_not_scored(detector):
    assert detector.detectable(["deu_Latn", "acm_Arab", "xx", "fr"]) == ["deu_Latn", "fr"]
    with pytest.raises(ValueError, match="acm_Arab"):
        detector.detect(MIXED[0], ["de", "acm_Arab"])
    with pytest.raises(ValueError, match="empty"):
        detector.detect(MIXED[0], [])


def test_below_the_threshold_the_top_candidates_and_their_scores(detector, threshold):
    ranked = detector.detect("Ein Mann", ["de", "fr", "en", "nl", "sv"])
    assert ranked[0][1] < threshold
    found = decide(ranked, threshold)
    assert isinstance(found, Undecided)
    assert found.candidates == tuple(ranked[:3]) and found.threshold == threshold
    error = found.error("texts[2].")
    assert isinstance(error, InvalidArgument) and error.code == "INVALID_ARGUMENT"
    assert error.field == "texts[2].source_language"
    for lang, p in ranked[:3]:
        assert f"{lang} {p:.3f}" in error.message
    assert ranked[3][0] not in error.message.split("(best:")[1]
    # At or above: the best and its probability.
    assert decide(ranked, ranked[0][1]) == Detected(*ranked[0])
    assert decide([("de", 0.5), ("fr", 0.5)], 0.5) == Detected("de", 0.5)
    with pytest.raises(ValueError):
        decide([], threshold)


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "12345", "3.14 + 2,72 = 5,86", "!!! ???", "😀👍"])
def test_text_without_letters_is_undecided(detector, threshold, text):
    ranked = detector.detect(text, SERVED)
    assert ranked == [(lang, pytest.approx(1 / 3)) for lang in SERVED]
    assert isinstance(decide(ranked, threshold), Undecided)
    # The same for every candidate, also where two of them share the model's label.
    shared = ["zho_Hans", "zho_Hant", "eng_Latn", "deu_Latn"]
    assert detector.detect(text, shared) == [(lang, 0.25) for lang in shared]


def test_deterministic_and_thread_safe(detector, data_dir):
    texts = read_lines(split_path(data_dir, "val", "fr"))[:60] + read_lines(split_path(data_dir, "val", "de"))[:60]
    first = detector.detect_batch(texts, SERVED)
    assert detector.detect_batch(texts, SERVED) == first
    assert [detector.detect(t, SERVED) for t in texts] == first
    assert LanguageDetector().detect_batch(texts, SERVED) == first  # a second load: the same model
    results: list[list[list[tuple[str, float]]]] = []

    def run() -> None:
        results.append(detector.detect_batch(texts, ["en", "de", "fr"]))  # another candidate set

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r == results[0] for r in results)
    assert [dict(r) for r in results[0]] == [dict(r) for r in first]


def test_loaded_once_per_process():
    assert LanguageDetector.shared() is LanguageDetector.shared()


def test_the_threshold_setting(monkeypatch):
    import argparse

    from service.server import add_arguments, settings_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert "--detection-threshold" in parser.format_help()  # its description formats as help text
    assert settings_from_args(parser.parse_args(["--detection-threshold", "0.6"])).detection_threshold == 0.6
    monkeypatch.setenv("MTSERVE_DETECTION_THRESHOLD", "0.75")
    assert Settings().detection_threshold == 0.75
    monkeypatch.setenv("MTSERVE_DETECTION_THRESHOLD", "1.5")
    with pytest.raises(ValueError, match="detection_threshold"):
        Settings()
