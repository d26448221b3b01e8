"""Ids that the model emits and no vocabulary entry names, through a real gRPC server: M2M100's
made-up words after its language codes (tests/service/conftest.py's `padded_repository`, a model
that emits them often). Every path that shows tokens or text (Translate with return_tokens,
n-best lists, alignments, TranslateStream, TranslateMany, KServe's ModelInfer, sampling over the
whole vocabulary) answers with the token `<unk>` and the text transformers' M2M100Tokenizer
decodes (`<unk>` where such an id was), never INTERNAL."""

from __future__ import annotations

import json

import grpc
import pytest

from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.client import pb
from tests.conftest import RunningServer
from tests.service.imported import M2M100_PADDED

TEXTS = [
    "Ein Hund rennt durch den Schnee.",
    "Zwei Kinder spielen am Strand.",
    "Eine Frau liest ein Buch.",
    "Ein Mann fährt Fahrrad auf der Straße.",
    "Drei Personen sitzen an einem Tisch.",
    "Ein kleines Mädchen klettert auf einen Baum.",
    "Der Koch bereitet das Essen zu.",
    "Eine Gruppe von Menschen wartet auf den Bus.",
    "Ein schwarzer Hund schwimmt im See.",
    "Zwei Männer spielen Fußball im Park.",
    "Eine ältere Frau trägt einen roten Hut.",
    "Kinder laufen über eine grüne Wiese.",
    "Ein Junge springt ins Wasser.",
    "Die Musiker spielen auf der Bühne.",
    "Ein Arbeiter repariert das Dach.",
    "Eine Katze schläft auf dem Sofa.",
    "Zwei Frauen unterhalten sich auf der Bank.",
    "Ein Mann in Blau hält eine Kamera.",
    "Leute gehen durch die belebte Stadt.",
    "Ein Hund fängt einen Ball.",
]
PAIR = dict(model=M2M100_PADDED, source_language="de", target_language="en")
SEEDS = 1000


@pytest.fixture(scope="module")
def server(padded_repository):
    from service.settings import Settings

    s = RunningServer(
        Settings(
            address="127.0.0.1:0",
            model_repository=padded_repository,
            models=M2M100_PADDED,
            precision="fp32",
            metrics_port=0,
            decode_workers=1,
            max_queue_delay_ms=2.0,
            engine_process=False,
            max_output_tokens=24,
            max_queue_size=4096,
        )
    )
    yield s
    s.stop()


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def theirs(hf_m2m100_padded_dir):
    from transformers import M2M100Tokenizer

    return M2M100Tokenizer.from_pretrained(str(hf_m2m100_padded_dir), src_lang="de", tgt_lang="en")


@pytest.fixture(scope="module")
def unmapped(hf_m2m100_padded_dir, theirs) -> set[int]:
    """The model's ids that neither vocab.json nor the language codes name (from the folder and
    transformers, not from mtserve)."""
    size = json.loads((hf_m2m100_padded_dir / "config.json").read_text())["vocab_size"]
    named = {*theirs.get_vocab().values(), *theirs.lang_code_to_id.values()}
    ids = {i for i in range(size) if i not in named}
    assert len(ids) == 8  # M2M100's made-up words
    return ids


def expect(theirs, ids) -> tuple[list[str], str]:
    """transformers' tokens and text of `ids`, less the language tokens in the text (which
    transformers 5 keeps there, tests/export/test_hf_import.py)."""
    languages = set(theirs.lang_code_to_id.values())
    text = theirs.decode([i for i in ids if i not in languages], skip_special_tokens=True).strip()
    return theirs.convert_ids_to_tokens(list(ids)), text


def check(theirs, t) -> None:
    """A Translation's (or Hypothesis's) tokens and text are transformers'."""
    tokens, text = expect(theirs, t.token_ids)
    assert t.text == text
    assert list(t.tokens) == tokens


def test_return_tokens_names_every_id(client, theirs, unmapped):
    r = client.translate_response(TEXTS, beam_size=1, return_tokens=True, **PAIR)
    emitted = [i for t in r.translations for i in t.token_ids]
    assert unmapped & set(emitted)  # the model emits them: the test exercises them
    for t in r.translations:
        check(theirs, t)
    assert any("<unk>" in t.text for t in r.translations)
    # Without return_tokens: the same text (the ids are not dropped from it).
    plain = client.translate(TEXTS, beam_size=1, **PAIR)
    assert [t.text for t in plain] == [t.text for t in r.translations]


def test_n_best_and_alignment(client, theirs, unmapped):
    r = client.translate_response(
        TEXTS,
        beam_size=4,
        num_hypotheses=3,
        return_tokens=True,
        return_alignment=True,
        return_scores=True,
        **PAIR,
    )
    hyps = [h for t in r.translations for h in t.hypotheses]
    assert len(hyps) == 3 * len(TEXTS) and unmapped & {i for h in hyps for i in h.token_ids}
    for t in r.translations:
        check(theirs, t)
        assert list(t.alignment.target_tokens) == [*t.tokens, "</s>"]
        assert len(t.alignment.weights) == len(t.alignment.target_tokens) * len(t.alignment.source_tokens)
        for h in t.hypotheses:
            check(theirs, h)


def test_translate_stream(client, theirs, unmapped):
    seen = set()
    for text in TEXTS[:8]:
        msgs = list(client.translate_stream(text, beam_size=1, return_tokens=True, **PAIR))
        final = msgs[-1].final
        check(theirs, final)
        chunks = [m.chunk for m in msgs[:-1]]
        assert "".join(c.text for c in chunks).strip() == final.text
        assert [i for c in chunks for i in c.token_ids] == list(final.token_ids)
        seen |= set(final.token_ids)
    assert unmapped & seen


def test_translate_many(client, theirs, unmapped):
    options = {
        "greedy": pb.TranslationOptions(beam_size=1, return_tokens=True),
        "beam": pb.TranslationOptions(beam_size=3, num_hypotheses=2, return_tokens=True, return_alignment=True),
        "sampled": pb.TranslationOptions(return_tokens=True, sampling_topk=1000, sampling_temperature=5.0, seed=7),
    }
    items = [
        pb.TranslateManyRequest(id=f"{name}-{i}", request=pb.TranslateRequest(texts=[t], options=o, **PAIR))
        for name, o in options.items()
        for i, t in enumerate(TEXTS)
    ]
    answers = list(client.translate_many(items))
    assert len(answers) == len(items) and all(a.WhichOneof("result") == "response" for a in answers), [
        a.error for a in answers if a.HasField("error")
    ]
    emitted = set()
    for a in answers:
        (t,) = a.response.translations
        check(theirs, t)
        emitted |= set(t.token_ids)
    assert unmapped & emitted


def test_kserve_text(server, client, unmapped):
    want = [t.text for t in client.translate(TEXTS, beam_size=1, **PAIR)]
    assert any("<unk>" in t for t in want)
    req = kpb.ModelInferRequest(model_name=M2M100_PADDED)
    tensor = req.inputs.add(name="TEXT", datatype="BYTES", shape=[len(TEXTS)])
    tensor.contents.bytes_contents.extend(t.encode() for t in TEXTS)
    for key, value in (("source_language", "de"), ("target_language", "en")):
        req.parameters[key].string_param = value
    req.parameters["beam_size"].int64_param = 1
    with grpc.insecure_channel(server.address) as ch:
        out = kpb_grpc.GRPCInferenceServiceStub(ch).ModelInfer(req, timeout=120).outputs[0].contents.bytes_contents
    assert [b.decode() for b in out] == want


def test_sampling_the_whole_vocabulary_with_many_seeds(client, theirs, unmapped):
    """SEEDS seeds at a high temperature over every id of the vocabulary (sampling_topk past its
    size): not one request fails, and the drawn made-up words come back as <unk>."""
    sampled = pb.TranslationOptions(return_tokens=True, sampling_topk=100_000, sampling_temperature=20.0)
    items = []
    for seed in range(1, SEEDS + 1):
        options = pb.TranslationOptions()
        options.CopyFrom(sampled)
        options.seed = seed
        options.max_output_tokens = 8
        request = pb.TranslateRequest(texts=[TEXTS[seed % len(TEXTS)]], options=options, **PAIR)
        items.append(pb.TranslateManyRequest(id=str(seed), request=request))
    answers = list(client.translate_many(items))
    errors = [a.error for a in answers if a.HasField("error")]
    assert len(answers) == SEEDS and not errors, errors[:3]
    hits = 0
    for a in answers:
        (t,) = a.response.translations
        check(theirs, t)
        hits += sum(i in unmapped for i in t.token_ids)
    assert hits > 0
