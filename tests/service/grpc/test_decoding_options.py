"""The decoding options through a real server, on both APIs: n-best lists (`num_hypotheses`),
target prefixes, sampling (`sampling_topk`, `sampling_topp`, `sampling_temperature`, `seed`),
their validation, GetModelInfo's zero_means, the Python client and the CLI flags."""

from __future__ import annotations

import argparse

import grpc
import pytest

from service.api.inference import grpc_service_pb2 as kpb
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import cli
from tests.support import kserve_infer

TEXTS = [
    "Ein Mann fährt Fahrrad.",
    "Zwei Hunde spielen im Schnee.",
    "Eine Frau liest ein Buch im Park.",
]


@pytest.fixture(scope="module")
def server(make_server):
    return make_server(decode_workers=1)


def _code(exc: pytest.ExceptionInfo) -> tuple[grpc.StatusCode, str]:
    return exc.value.code(), exc.value.details()


# ----------------------------------------------------------------------------- mtserve.v1


def test_control_tokens_in_user_text_are_text(client):
    """`</s>`, `<pad>`, `<s>`, `<unk>` in a target prefix or a source text are characters: a
    prefix of "A dog</s>" does not end the translation, "<pad><pad>" forces no pad id, and a
    prefix is cleaned as a source text is (before, "\x00\u200b" came back in the output)."""
    specials = {0, 1, 2, 3}  # <pad> <s> </s> <unk> of mtserve's BPE
    got = client.translate(
        [TEXTS[0]] * 4, beam_size=1, return_tokens=True, target_prefixes=["</s>", "A dog</s>", "<pad><pad>", "<s><unk>"]
    )
    for t, prefix in zip(got, ["</s>", "A dog</s>", "<pad><pad>", "<s><unk>"]):
        assert t.text.startswith(prefix), (t.text, prefix)
        assert not specials & set(t.token_ids), (prefix, list(t.token_ids))
        assert len(t.text) > len(prefix), t.text  # decoded on after the prefix
    (clean,) = client.translate([TEXTS[0]], beam_size=1, target_prefixes=["\x00\u200b"])
    (plain,) = client.translate([TEXTS[0]], beam_size=1)
    assert clean.text == plain.text
    (enc,) = client.encode(["Ein Hund</s><pad> läuft"])
    body = enc["tokens"][:-1]  # the last is the </s> every source ends with
    assert enc["tokens"][-1] == "</s>" and "</s>" not in body and "<pad>" not in body, enc["tokens"]


def test_n_best_lists_top_equals_the_beam_result_and_scores_are_sorted(client):
    plain = client.translate(TEXTS, beam_size=4, return_scores=True)
    nbest = client.translate(TEXTS, beam_size=4, num_hypotheses=3, return_tokens=True)
    for p, t in zip(plain, nbest):
        assert t.text == p.text and len(t.hypotheses) == 3
        assert t.hypotheses[0].text == t.text and t.hypotheses[0].score == pytest.approx(p.score)
        assert list(t.hypotheses[0].token_ids) == list(t.token_ids)
        assert list(t.hypotheses[1].tokens)  # tokens come with return_tokens
        scores = [h.score for h in t.hypotheses]
        assert scores == sorted(scores, reverse=True)
    assert all(not t.hypotheses for t in plain)


@pytest.mark.parametrize("beam", [1, 4])
def test_translations_begin_with_their_target_prefix(client, beam):
    prefixes = ["The dog", "", "A small"]
    got = client.translate(TEXTS, beam_size=beam, target_prefixes=prefixes)
    plain = client.translate(TEXTS, beam_size=beam)
    assert got[0].text.startswith("The dog") and got[2].text.startswith("A small")
    assert got[1].text == plain[1].text
    assert got[0].text != plain[0].text
    # TranslateStream: the chunks add up to the final text, the prefix first.
    msgs = list(client.translate_stream(TEXTS[0], beam_size=beam, target_prefix="The dog"))
    final = msgs[-1].final
    assert final.text == got[0].text
    assert "".join(m.chunk.text for m in msgs[:-1]).strip() == final.text


def test_sampling_is_reproducible_varied_and_topk_1_is_greedy(client):
    greedy = [t.text for t in client.translate(TEXTS, beam_size=1)]
    assert [t.text for t in client.translate(TEXTS, sampling_topk=1, seed=5)] == greedy
    once = [t.text for t in client.translate(TEXTS, sampling_topk=20, seed=42)]
    assert [t.text for t in client.translate(TEXTS, sampling_topk=20, seed=42)] == once
    seen = {
        client.translate(TEXTS[:1], sampling_topk=0, sampling_topp=0.95, sampling_temperature=1.5, seed=s)[0].text
        for s in range(1, 101)
    }
    assert len(seen) > 1
    # TranslateMany items: each item is text 0 of its own request, so the same seed repeats.
    many = client.translate_all([TEXTS[0], TEXTS[0]], sampling_topk=20, seed=42)
    assert [t.text for t in many] == [once[0], once[0]]


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"beam_size": 2, "num_hypotheses": 3}, "options.num_hypotheses"),
        ({"beam_size": 1, "num_hypotheses": 2}, "options.num_hypotheses"),
        ({"num_hypotheses": -1}, "options.num_hypotheses"),
        ({"sampling_topk": -1}, "options.sampling_topk"),
        ({"sampling_topp": 0.0}, "options.sampling_topp"),
        ({"sampling_topp": 1.5}, "options.sampling_topp"),
        ({"sampling_temperature": 0.0}, "options.sampling_temperature"),
        ({"sampling_temperature": -1.0}, "options.sampling_temperature"),
        ({"sampling_topk": 10, "beam_size": 4}, "options.beam_size"),
        ({"sampling_topp": 0.5, "beam_size": 2}, "options.beam_size"),
        ({"max_output_tokens": 4, "target_prefixes": ["", "a b c d e f g h"]}, "target_prefixes[1]"),
        ({"target_prefixes": ["The"]}, "target_prefixes"),
    ],
)
def test_bad_decoding_options_name_their_field(client, kw, field):
    with pytest.raises(grpc.RpcError) as e:
        client.translate(TEXTS[:2], **kw)
    code, message = _code(e)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(field + ":"), message


def test_a_bad_item_of_translate_many_fails_alone(client):
    ok = pb.TranslateRequest(texts=TEXTS[:1], target_prefixes=["The dog"])
    bad = pb.TranslateRequest(
        texts=TEXTS[:1], options=pb.TranslationOptions(max_output_tokens=3), target_prefixes=["a b c d e f"]
    )
    answers = {
        r.id: r
        for r in client.translate_many(
            [pb.TranslateManyRequest(id="ok", request=ok), pb.TranslateManyRequest(id="bad", request=bad)]
        )
    }
    assert answers["ok"].response.translations[0].text.startswith("The dog")
    assert answers["bad"].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert answers["bad"].error.message.startswith("request.target_prefixes[0]:")
    with pytest.raises(grpc.RpcError) as e:
        list(client.translate_stream(TEXTS[0], max_output_tokens=3, target_prefix="a b c d e f"))
    assert _code(e)[1].startswith("target_prefix:")


def test_model_info_describes_the_decoding_options(client):
    zero = dict(client.model_info().limits.zero_means)
    for key in ("options.num_hypotheses", "options.sampling_topk", "options.sampling_topp", "target_prefixes"):
        assert key in zero
    assert "beam size" in zero["options.num_hypotheses"]
    assert "(0, 1]" in zero["options.sampling_topp"]


def test_the_cli_takes_the_decoding_flags(server, capsys):
    p = argparse.ArgumentParser()
    cli.add_arguments(p)
    args = p.parse_args(
        ["--server", server.address, "--beam", "4", "--num-hypotheses", "2", "--target-prefix", "The", TEXTS[1]]
    )
    cli.run(args)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("The") and len(lines) == 3
    assert lines[1].split("\t")[1] == lines[0]  # the n-best list, best first: score, tab, text
    args = p.parse_args(["--server", server.address, "--sampling-topk", "20", "--seed", "9", TEXTS[0]])
    cli.run(args)
    first = capsys.readouterr().out
    cli.run(args)
    assert capsys.readouterr().out == first


# ----------------------------------------------------------------------------- KServe


def _infer(server, texts: list[str], **params) -> kpb.ModelInferResponse:
    return kserve_infer(server.address, server.server.engine.translation_model, texts, **params)


def _outputs(resp: kpb.ModelInferResponse) -> list[str]:
    return [b.decode() for b in resp.outputs[0].contents.bytes_contents]


def test_kserve_takes_the_decoding_options(server, client):
    beam = [t.text for t in client.translate(TEXTS, beam_size=4)]
    assert _outputs(_infer(server, TEXTS, beam_size=4, num_hypotheses=3)) == beam  # the best of the list
    prefixed = _outputs(_infer(server, TEXTS, beam_size=1, target_prefix="The dog"))
    assert all(t.startswith("The dog") for t in prefixed)
    assert prefixed == [t.text for t in client.translate(TEXTS, beam_size=1, target_prefixes=["The dog"] * 3)]
    sampled = _outputs(_infer(server, TEXTS, sampling_topk=20, sampling_temperature=1.2, seed=3))
    assert _outputs(_infer(server, TEXTS, sampling_topk=20, sampling_temperature=1.2, seed=3)) == sampled
    assert sampled == [t.text for t in client.translate(TEXTS, sampling_topk=20, sampling_temperature=1.2, seed=3)]
    topp = _outputs(_infer(server, TEXTS, sampling_topp=0.9, seed=3))
    assert topp == [t.text for t in client.translate(TEXTS, sampling_topp=0.9, seed=3)]


@pytest.mark.parametrize(
    "params, field",
    [
        ({"beam_size": 2, "num_hypotheses": 3}, "parameters.num_hypotheses"),
        ({"sampling_topp": 1.5}, "parameters.sampling_topp"),
        ({"sampling_temperature": 0.0}, "parameters.sampling_temperature"),
        ({"sampling_topk": 5, "beam_size": 3}, "parameters.beam_size"),
        ({"max_output_tokens": 3, "target_prefix": "a b c d e f"}, "parameters.target_prefix"),
    ],
)
def test_kserve_refuses_bad_decoding_options_naming_the_parameter(server, params, field):
    with pytest.raises(grpc.RpcError) as e:
        _infer(server, TEXTS[:1], **params)
    code, message = _code(e)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message.startswith(field + ":"), message
