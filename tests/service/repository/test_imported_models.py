"""Imported Hugging Face models served beside the shipped ones, over a real gRPC server: a tiny
Marian (opus-de-en) and a tiny M2M100 (m2m, multilingual) next to the shipped de-en and fr-en
(tests/service/conftest.py). Every API (Translate, TranslateStream, TranslateMany, Encode, KServe
ModelInfer), routing by language pair, NOT_FOUND for pairs nobody serves, min_output_tokens, the
language pairs and notes of GetModelInfo, and a hot swap of an imported model."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from contract.manifest import load_manifest, write_manifest
from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.client import pb
from service.decoding.translator import OnnxTranslator
from tests.service.imported import M2M100, MARIAN

TEXTS = ["Ein Hund rennt durch den Schnee.", "Zwei Kinder spielen am Strand.", "Eine Frau liest ein Buch."]
M2M_PAIRS = 8 * 7  # the wmt21 languages of the tiny M2M100, each into the seven others


@pytest.fixture(scope="module")
def server(make_server, imported_repository):
    return make_server(
        model_dir=None,
        onnx_dir=None,
        model_repository=imported_repository,
        models=f"de-en,fr-en,{M2M100}",
        precision="int8",
        max_output_tokens=64,
    )


@pytest.fixture(scope="module")
def client(server):
    with server.client(timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def kserve(server):
    with grpc.insecure_channel(server.address) as ch:
        yield kpb_grpc.GRPCInferenceServiceStub(ch)


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def translate(client, texts=TEXTS, **fields) -> pb.TranslateResponse:
    return client.translate_response(texts, beam_size=1, return_tokens=True, **fields)


def infer_request(model: str, texts=TEXTS, **params) -> kpb.ModelInferRequest:
    req = kpb.ModelInferRequest(model_name=model)
    tensor = req.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts)])
    tensor.contents.bytes_contents.extend(t.encode() for t in texts)
    for key, value in params.items():
        if isinstance(value, str):
            req.parameters[key].string_param = value
        else:
            req.parameters[key].int64_param = value
    return req


# ----------------------------------------------------------------------------- routing


@pytest.mark.parametrize(
    "model, source, target, answered",
    [
        ("", "de", "en", "de-en:1"),  # the default model serves it
        ("", "fr", "en", "fr-en:1"),  # the first served model that does
        ("", "en", "de", f"{M2M100}:1"),
        ("", "de", "ja", f"{M2M100}:1"),
        (M2M100, "de", "en", f"{M2M100}:1"),
        ("", "", "", "de-en:1"),
    ],
)
def test_a_language_pair_picks_the_model(client, model, source, target, answered):
    r = translate(client, model=model, source_language=source, target_language=target)
    assert r.model == answered and all(t.text for t in r.translations)


def test_pairs_nobody_serves_are_not_found(client):
    code, message = status_of(lambda: translate(client, source_language="xx", target_language="yy"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert message.startswith("source_language/target_language: no served model translates xx->yy")
    assert "de->en (de-en:1)" in message and "fr->en (fr-en:1)" in message
    assert f"{M2M100}:1: 8 languages to 8: cs, de, en, ha, is, ja, ru, zh)" in message  # wmt21's, sorted
    assert "->" not in message.split(f"{M2M100}:1")[1] and len(message.encode()) < 1024
    code, message = status_of(lambda: translate(client, model="fr-en", source_language="de", target_language="en"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "fr-en:1 does not translate de->en: de is not one of its source languages (it serves fr->en)" in message
    code, message = status_of(lambda: translate(client, model=M2M100, source_language="de"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("target_language: ")
    # A TranslateMany item fails alone, naming its own fields.
    items = [
        pb.TranslateManyRequest(id="bad", request=pb.TranslateRequest(texts=TEXTS[:1], target_language="yy")),
        pb.TranslateManyRequest(
            id="ok", request=pb.TranslateRequest(texts=TEXTS[:1], source_language="de", target_language="ja")
        ),
    ]
    answers = {r.id: r for r in client.translate_many(items)}
    assert answers["bad"].error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert answers["bad"].error.message.startswith("request.source_language/request.target_language: ")
    assert answers["ok"].response.model == f"{M2M100}:1"


# ----------------------------------------------------------------------------- every API


def offline(imported_repository: Path, name: str, texts: list[str], target: str = "") -> list[str]:
    """The same texts through the offline path (`mtserve verify`'s generate) in fp32, greedy."""
    t = OnnxTranslator(imported_repository / name / "1", precision="fp32")
    src = t.model.source_ids(texts)
    ids = t.model.prefixes(target_language=target)[1]
    from service.decoding.generator import generate

    gen = t.model.manifest.generation
    hyps = generate(
        t.model, src, beam=1, max_len_a=gen.max_len_a, max_len_b=gen.max_len_b, target_prefixes=[ids] * len(src)
    )
    return t.model.detokenize([h.tokens for h in hyps])


def test_the_multilingual_import_on_every_api(client, kserve, imported_repository):
    pair = dict(model=M2M100, source_language="de", target_language="ja")
    r = translate(client, **pair)
    ja_token = load_manifest(imported_repository / M2M100 / "1").languages.target_tokens["ja"]
    for t in r.translations:
        assert ja_token not in t.token_ids and t.output_tokens == len(t.token_ids) + 1
        assert t.input_tokens == len(t.token_ids) or t.input_tokens > 2  # the de token, the text, </s>
    assert [t.text for t in r.translations] == offline(imported_repository, M2M100, TEXTS, "ja")
    # Streamed: whole characters only, adding up to the translation.
    for text, want in zip(TEXTS, r.translations):
        msgs = list(client.translate_stream(text, beam_size=1, **pair))
        chunks = [m.chunk.text for m in msgs[:-1]]
        assert all("\ufffd" not in c for c in chunks)
        assert "".join(chunks).strip() == msgs[-1].final.text == want.text
    # TranslateMany, Encode (the source language token leads), KServe.
    greedy = pb.TranslationOptions(beam_size=1)
    items = [
        pb.TranslateManyRequest(id=str(i), request=pb.TranslateRequest(texts=[t], options=greedy, **pair))
        for i, t in enumerate(TEXTS)
    ]
    many = {int(a.id): a.response.translations[0].text for a in client.translate_many(items)}
    assert [many[i] for i in range(len(TEXTS))] == [t.text for t in r.translations]
    encoded = client.encode(TEXTS[:1], model=M2M100, source_language="de")[0]
    assert encoded["tokens"][0].strip("_") == "de" and encoded["tokens"][-1] == "</s>"  # the de token, "__de__"
    req = infer_request(M2M100, source_language="de", target_language="ja", beam_size=1)
    out = kserve.ModelInfer(req, timeout=60).outputs[0].contents.bytes_contents
    assert [b.decode() for b in out] == [t.text for t in r.translations]
    code, message = status_of(lambda: kserve.ModelInfer(infer_request(M2M100, source_language="de"), timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("parameters.target_language: ")


def test_the_marian_import_beside_the_shipped_model(make_server, imported_repository):
    """Loaded while de-en and the others serve (a hot swap), used on every API, unloaded."""
    srv = make_server(
        model_dir=None, onnx_dir=None, model_repository=imported_repository, models="de-en", precision="int8"
    )
    with srv.client(timeout=60) as c, grpc.insecure_channel(srv.address) as ch:
        k = kpb_grpc.GRPCInferenceServiceStub(ch)
        k.RepositoryModelLoad(kpb.RepositoryModelLoadRequest(model_name=MARIAN), timeout=300)
        r = translate(c, model=MARIAN, source_language="de", target_language="en", return_alignment=True)
        assert r.model == f"{MARIAN}:1"
        assert [t.text for t in r.translations] == offline(imported_repository, MARIAN, TEXTS)
        a = r.translations[0].alignment
        assert a.target_tokens[-1] == "</s>" and a.source_tokens[-1] == "</s>"
        assert len(a.weights) == len(a.target_tokens) * len(a.source_tokens)
        msgs = list(c.translate_stream(TEXTS[0], model=MARIAN, beam_size=1))
        assert "".join(m.chunk.text for m in msgs[:-1]).strip() == msgs[-1].final.text == r.translations[0].text
        req = infer_request(MARIAN, TEXTS[:1], beam_size=1)
        out = k.ModelInfer(req, timeout=60).outputs[0].contents.bytes_contents
        assert out[0].decode() == r.translations[0].text
        assert c.encode(TEXTS[:1], model=MARIAN)[0]["tokens"][0].startswith("▁")
        assert translate(c, source_language="de", target_language="en").model == "de-en:1"  # the default first
        k.RepositoryModelUnload(kpb.RepositoryModelUnloadRequest(model_name=MARIAN), timeout=120)
        code, _ = status_of(lambda: translate(c, model=MARIAN))
        assert code == grpc.StatusCode.NOT_FOUND
        assert translate(c).model == "de-en:1"


# ----------------------------------------------------------------------------- options and info


@pytest.mark.parametrize("model, target", [("de-en", ""), (M2M100, "en")])
@pytest.mark.parametrize("beam", [1, 3])
def test_min_output_tokens_is_honoured(client, kserve, model, target, beam):
    fields = dict(model=model, source_language="de", target_language=target, beam_size=beam)
    free = client.translate(TEXTS, return_tokens=True, **fields)
    n = max(len(t.token_ids) for t in free) + 3
    got = client.translate(TEXTS, return_tokens=True, min_output_tokens=n, **fields)
    assert all(len(t.token_ids) >= n for t in got)
    # KServe's parameter: the same sentence alone gets the same translation as on mtserve.v1.
    langs = {"source_language": "de", **({"target_language": target} if target else {})}
    req = infer_request(model, TEXTS[:1], min_output_tokens=n, beam_size=beam, **langs)
    alone = client.translate(TEXTS[:1], min_output_tokens=n, **fields)
    assert kserve.ModelInfer(req, timeout=60).outputs[0].contents.bytes_contents[0].decode() == alone[0].text
    code, message = status_of(lambda: client.translate(TEXTS, max_output_tokens=8, min_output_tokens=8, **fields))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith("options.min_output_tokens: 8 is outside 0..7")
    req = infer_request(model, TEXTS[:1], min_output_tokens=64, **langs)
    code, message = status_of(lambda: kserve.ModelInfer(req, timeout=60))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("parameters.min_output_tokens: ")


def test_model_info_lists_pairs_by_page(client):
    info = client.model_info(M2M100)
    assert "options.min_output_tokens" in info.limits.zero_means
    by_name = {m.name: m for m in info.models}
    assert [(p.source_language, p.target_language) for p in by_name["de-en"].language_pairs] == [("de", "en")]
    m2m = by_name[M2M100]
    assert (by_name["de-en"].source_language, by_name["de-en"].target_language) == ("de", "en")
    assert (m2m.source_language, m2m.target_language) == ("", "")  # no default pair
    assert m2m.language_pair_count == M2M_PAIRS and len(m2m.language_pairs) == M2M_PAIRS
    assert set(m2m.target_languages) >= {"de", "en", "ja"} and not by_name["fr-en"].target_languages
    seen, token = [], ""
    while True:
        page = client.stub.GetModelInfo(pb.GetModelInfoRequest(page_size=10, page_token=token), timeout=30)
        m = next(x for x in page.models if x.name == M2M100)
        assert len(m.language_pairs) <= 10
        seen += [(p.source_language, p.target_language) for p in m.language_pairs]
        token = m.next_page_token
        if not token:
            break
    assert len(seen) == len(set(seen)) == M2M_PAIRS
    code, message = status_of(lambda: client.stub.GetModelInfo(pb.GetModelInfoRequest(page_size=-1), timeout=30))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message.startswith("page_size: ")


def test_a_version_without_fused_graphs_says_so(server, client, kserve, imported_repository, tmp_path):
    """m2m/2: the m2m export with its fused variants removed from the manifest. MTSERVE_GRAPH=auto
    runs the portable step there, and GetModelInfo (and the log) say why."""
    version = imported_repository / M2M100 / "2"
    shutil.copytree(imported_repository / M2M100 / "1", version, symlinks=True)
    try:
        manifest = load_manifest(version / "onnx")
        portable = {k: v for k, v in manifest.variants.items() if v.graph == "portable"}
        write_manifest(version / "onnx", manifest.model_copy(update={"variants": portable}))
        kserve.RepositoryModelLoad(
            kpb.RepositoryModelLoadRequest(
                model_name=M2M100, parameters={"version": kpb.ModelRepositoryParameter(string_param="2")}
            ),
            timeout=300,
        )
        info = client.model_info(f"{M2M100}:2")
        assert info.decoder_graph == "portable"
        assert any("no fused variant of fp32" in note for note in info.notes)
        assert (
            client.model_info(f"{M2M100}:1").notes == [] and client.model_info(f"{M2M100}:1").decoder_graph == "fused"
        )
        served = {(m.name, m.version): m for m in info.models}
        assert served[(M2M100, "2")].decoder_graph == "portable" and served[(M2M100, "1")].decoder_graph == "fused"
        kserve.RepositoryModelUnload(
            kpb.RepositoryModelUnloadRequest(
                model_name=M2M100, parameters={"version": kpb.ModelRepositoryParameter(string_param="2")}
            ),
            timeout=120,
        )
    finally:
        shutil.rmtree(version)
