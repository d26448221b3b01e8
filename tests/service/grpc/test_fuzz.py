"""Property-based tests of the gRPC API with hostile input (hypothesis).

Every generated request goes over the wire to one real server (module-scoped, tiny model, small
limits so that generated cases reach them). An oracle written from the documented contract (the
README's error list, the server's limits) says which status each case must get: OK with one
well-formed result per text, or INVALID_ARGUMENT whose message starts with the exact field at
fault. Never INTERNAL or UNKNOWN, never a hang (every call has a deadline), and after every case
the server answers a valid request. No status message is longer than 1,024 characters, and
hostile model names, versions, language codes, KServe names and repository calls (100 kB long,
malformed) get INVALID_ARGUMENT or NOT_FOUND naming the field with the input cut short.

About 2,100 generated cases run in the default suite. More: `make fuzz`, or
`MTSERVE_FUZZ_SCALE=10 pytest tests/service/grpc/test_fuzz.py` (ten times as many of each).
"""

from __future__ import annotations

import math
import os
import re
import unicodedata

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from tokenizers import Tokenizer

from service.api.inference import grpc_service_pb2 as kserve_pb
from service.api.inference import grpc_service_pb2_grpc as kserve_grpc
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import STATUS_BY_NUMBER
from service.engine.languages import MAX_PAGE_SIZE, MAX_PAGE_TOKEN_DIGITS

SCALE = float(os.environ.get("MTSERVE_FUZZ_SCALE", "1"))
TIMEOUT = 30.0
SERVICE = "/mtserve.v1.TranslationService/"

# The fuzzed server's limits: small, so that generated cases reach them.
LIMITS = dict(
    max_texts_per_request=16,
    max_input_tokens=128,
    max_output_tokens=8,
    max_text_bytes=2000,
    max_beam_size=4,
    default_beam_size=2,
)


def fuzz_settings(examples: int):
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.large_base_example,
            HealthCheck.filter_too_much,
        ],
    )


# ----------------------------------------------------------------------------- strategies

HOSTILE = [
    "\x00",
    "\x07",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "\x1c",
    "\x1f",
    "\u2028",
    "\u2029",
    "\r\n",
    "\t",
    "\u200e",
    "\u200f",
    "\u202a",
    "\u202b",
    "\u202d",
    "\u202e",
    "\u2066",
    "\u2069",  # bidi controls
    "\u200b",
    "\u200c",
    "\u200d",
    "\u2060",
    "\ufeff",
    "\u00ad",  # zero-width, BOM, soft hyphen
    "\u0301" * 40,
    "e\u0301\u0302\u0303\u0304\u0305\u0306\u0307",
    "Z\u0351\u0352\u0353\u0354\u0355" * 5,  # combining
    "\U0001f469\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466",
    "\U0001f1e9\U0001f1ea",
    "\U0001f44d\U0001f3fd",
    "\U0001f600",
    "\u2764\ufe0f",
    "\ufffd",
    "\uffff",
    "\U0010ffff",
    "\U000e0001",
    "\ue000",
    "\u0645\u0631\u062d\u0628\u0627",
    "\u05e9\u05dc\u05d5\u05dd",
    "\u4f60\u597d",
    "\u3000",
    "\u00a0",
    "\ufdfa",
    "\u0390",
    "\ufb03",
    "\u1e9e",
    "\u2126",
    "\u212b",  # NFC/NFKC changes, expansions
    "<s>",
    "</s>",
    "<pad>",
    "<unk>",
    "%s%n%x",
    "{0}",
    "'; DROP TABLE x;--",
    "\\u0000",
    "\u0130\u0131",
]
WORDS = [
    "Ein",
    "Hund",
    "rennt",
    "durch",
    "den",
    "Schnee",
    ".",
    "Zwei",
    "Männer",
    "sitzen",
    "auf",
    "einer",
    "Bank",
    "Straße",
    "Größe",
    "über",
    ",",
    "!",
    "?",
]
piece = st.one_of(
    st.sampled_from(HOSTILE),
    st.sampled_from(WORDS),
    st.text(max_size=12),
    st.sampled_from([" ", "  ", "\n", "\t", "\u3000"]),
)
short_text = st.lists(piece, max_size=10).map("".join)
long_text = st.builds(lambda p, k: p * k, st.sampled_from(HOSTILE + WORDS + ["Hund "]), st.integers(1, 3000))
whitespace = st.text(
    alphabet=st.sampled_from(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2028\u3000"), max_size=20
)
# Mostly words with a hostile character or two, which the server must translate...
# (Lone surrogates are left out: protobuf cannot encode them, so no client can send them as text;
# test_malformed_protobuf_is_invalid_argument sends their bytes raw.)
benign_text = st.lists(
    st.one_of(
        st.sampled_from(WORDS),
        st.sampled_from(WORDS),
        st.sampled_from(HOSTILE[:25]),
        st.characters(exclude_categories=("Cs",)),
    ),
    min_size=1,
    max_size=8,
).map(" ".join)
# ...and everything else, which it must translate or refuse precisely.
a_text = st.one_of(benign_text, benign_text, benign_text, short_text, st.text(max_size=40), long_text, whitespace)
texts = st.one_of(
    st.lists(a_text, min_size=1, max_size=3),
    st.lists(benign_text, min_size=1, max_size=8),
    st.lists(a_text, max_size=20),
)

int32 = st.integers(-(2**31), 2**31 - 1)
beam = st.one_of(
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(0, 4),
    st.integers(-3, 12),
    st.sampled_from([-(2**31), 2**31 - 1]),
    int32,
)
max_out = st.one_of(st.integers(0, 8), st.integers(0, 8), st.integers(-3, 20), int32)
penalty = st.one_of(
    st.none(), st.none(), st.floats(0, 10, width=32), st.floats(width=32, allow_nan=True, allow_infinity=True)
)
options = st.builds(
    dict,
    beam_size=beam,
    max_output_tokens=max_out,
    length_penalty=penalty,
    return_scores=st.booleans(),
    return_tokens=st.booleans(),
    return_alignment=st.booleans(),
    split=st.sampled_from([0, 1, 2, 3, 7]),  # Split: DEFAULT, SENTENCES, NEWLINES, NONE, an unknown value
)


def options_pb(o: dict) -> pb.TranslationOptions:
    msg = pb.TranslationOptions(
        beam_size=o["beam_size"],
        max_output_tokens=o["max_output_tokens"],
        return_scores=o["return_scores"],
        return_tokens=o["return_tokens"],
        return_alignment=o["return_alignment"],
        split=o["split"],
    )
    if o["length_penalty"] is not None:
        msg.length_penalty = o["length_penalty"]
    return msg


# ----------------------------------------------------------------------------- the oracle


class Oracle:
    """The documented contract, written independently of the engine: given a request, the field
    that must be reported (None: the request must succeed)."""

    def __init__(self, tokenizer: Tokenizer, max_positions: int, eos_id: int, length_penalty: float):
        tokenizer.encode_special_tokens = True  # "</s>" in a text is text (docs/security.md)
        self.tok, self.eos_id, self.default_lp = tokenizer, eos_id, length_penalty
        self.limit = min(LIMITS["max_input_tokens"], max_positions - 1)

    @staticmethod
    def normalized(text: str) -> str:
        """docs/security.md: control and format characters removed but for tab, LF, VT, FF and CR;
        then NFC; then stripped."""
        kept = "".join(c for c in text if unicodedata.category(c) not in ("Cc", "Cf") or c in "\t\n\x0b\x0c\r")
        return unicodedata.normalize("NFC", kept).strip()

    def n_tokens(self, text: str) -> int:
        return len(self.tok.encode(self.normalized(text), add_special_tokens=False).ids) + 1  # + </s>

    def texts_problem(self, texts: list[str], field: str, rows: str = "encode") -> str | None:
        """`rows`: "encode", each text one row, sizes checked before tokens, over all texts;
        "none" (split NONE), each text one row, checked text by text; "split", each text split
        into rows (docs/documents.md), which max_input_tokens does not limit."""
        if field == "texts":
            if not texts or len(texts) > LIMITS["max_texts_per_request"]:
                return "texts"
        names = [f"texts[{i}]" for i in range(len(texts))] if field == "texts" else ["text"]
        for name, t in zip(names, texts):
            if len(t.encode("utf-8")) > LIMITS["max_text_bytes"]:
                return name
        for name, t in zip(names, texts):
            if not self.normalized(t):
                return name
            if rows == "none" and self.n_tokens(t) > self.limit:
                return name
        for name, t in zip(names, texts):
            if rows == "encode" and self.n_tokens(t) > self.limit:
                return name
        return None

    def options_problem(self, o: pb.TranslationOptions) -> str | None:
        if not 1 <= (o.beam_size or LIMITS["default_beam_size"]) <= LIMITS["max_beam_size"]:
            return "options.beam_size"
        if not 0 <= o.max_output_tokens <= LIMITS["max_output_tokens"]:
            return "options.max_output_tokens"
        lp = float(np.float32(o.length_penalty)) if o.HasField("length_penalty") else self.default_lp
        if not math.isfinite(lp) or not 0 <= lp <= 10:
            return "options.length_penalty"
        return None

    def before_markup(self, texts: list[str], o: pb.TranslationOptions, field: str = "texts") -> str | None:
        """What is checked before a marked-up request's markup is read: the texts' count, each
        text's bytes, then the text type."""
        if field == "texts" and (not texts or len(texts) > LIMITS["max_texts_per_request"]):
            return "texts"
        names = [f"texts[{i}]" for i in range(len(texts))] if field == "texts" else ["text"]
        for name, t in zip(names, texts):
            if len(t.encode("utf-8")) > LIMITS["max_text_bytes"]:
                return name
        return None if o.text_type in pb.TextType.values() else "options.text_type"

    def translate(self, texts: list[str], o: pb.TranslationOptions, field: str = "texts") -> str | None:
        """The texts' count, then each text's bytes (checked first, before any work on them),
        then the options and the texts' contents."""
        early = self.before_markup(texts, o, field)
        if early is not None and early != "options.text_type":
            return early
        if o.split not in pb.Split.values():
            return "options.split"
        rows = "none" if o.split == pb.SPLIT_NONE else "split"
        return self.texts_problem(texts, field, rows) or self.options_problem(o)

    def check_translation(self, t: pb.Translation, text: str, o: pb.TranslationOptions) -> None:
        if o.split != pb.SPLIT_NONE:
            self.check_document(t, text, o)
            return
        cap = o.max_output_tokens or LIMITS["max_output_tokens"]
        assert t.input_tokens == self.n_tokens(text)
        assert 1 <= t.output_tokens <= cap
        if o.return_tokens:
            assert len(t.tokens) == len(t.token_ids) == t.output_tokens - 1
        else:
            assert not t.tokens and not t.token_ids
        if o.return_scores:
            assert math.isfinite(t.score) and t.score <= 0
        if o.return_alignment:
            a = t.alignment
            assert len(a.source_tokens) == t.input_tokens and len(a.target_tokens) == t.output_tokens
            w = np.asarray(a.weights, dtype=np.float32).reshape(len(a.target_tokens), len(a.source_tokens))
            assert np.all(np.isfinite(w))
            np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-3)

    def check_document(self, t: pb.Translation, text: str, o: pb.TranslationOptions) -> None:
        """A text split into segments (docs/documents.md): spans in order over text that is left
        once normalised, the text around them kept, totals the segments' sums."""
        cap = o.max_output_tokens or LIMITS["max_output_tokens"]
        segs = list(t.segments)
        assert segs and all(a.end <= b.start for a, b in zip(segs, segs[1:]))
        assert t.text.startswith(text[: segs[0].start]) and t.text.endswith(text[segs[-1].end :])
        assert t.input_tokens == sum(s.input_tokens for s in segs)
        assert t.output_tokens == sum(s.output_tokens for s in segs)
        for s in segs:
            assert self.normalized(text[s.start : s.end]) and s.output_tokens >= 1
            if s.input_tokens <= self.limit:  # one row, not cut for length
                assert s.output_tokens <= cap
            if o.return_scores:
                assert math.isfinite(s.score) and s.score <= 0
            assert len(s.tokens) == len(s.token_ids) <= (s.output_tokens - 1 if o.return_tokens else 0)
        assert list(t.token_ids) == [i for s in segs for i in s.token_ids]


# ----------------------------------------------------------------------------- the server and calls


@pytest.fixture(scope="module")
def fz(make_server, tiny_onnx_dir):
    srv = make_server(decode_workers=1, max_queue_delay_ms=0.0, **LIMITS)
    m = srv.server.engine.manifest
    oracle = Oracle(
        Tokenizer.from_file(str(tiny_onnx_dir / m.tokenizer.file)),
        m.dims.max_positions,
        m.special_ids.eos_id,
        m.generation.length_penalty,
    )
    channel = grpc.insecure_channel(srv.address)
    raw_unary = {name: channel.unary_unary(SERVICE + name) for name in ("Translate", "Encode", "GetModelInfo")}
    raw_stream = channel.unary_stream(SERVICE + "TranslateStream")
    raw_many = channel.stream_stream(SERVICE + "TranslateMany")
    raw_infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")

    class Fuzz:
        server, client, check = srv, srv.client(timeout=TIMEOUT), oracle

        @staticmethod
        def call(method: str, request: bytes):
            """Raw bytes on the wire: (status code, details, parsed responses)."""
            try:
                if method == "TranslateMany":  # one message or several (a list) on one stream
                    messages = request if isinstance(request, list) else [request]
                    return (
                        grpc.StatusCode.OK,
                        "",
                        [pb.TranslateManyResponse.FromString(m) for m in raw_many(iter(messages), timeout=TIMEOUT)],
                    )
                if method == "TranslateStream":
                    return (
                        grpc.StatusCode.OK,
                        "",
                        [pb.TranslateStreamResponse.FromString(m) for m in raw_stream(request, timeout=TIMEOUT)],
                    )
                if method == "ModelInfer":
                    return (
                        grpc.StatusCode.OK,
                        "",
                        [kserve_pb.ModelInferResponse.FromString(raw_infer(request, timeout=TIMEOUT))],
                    )
                out = {"Translate": pb.TranslateResponse, "Encode": pb.EncodeResponse, "GetModelInfo": pb.ModelInfo}
                return grpc.StatusCode.OK, "", [out[method].FromString(raw_unary[method](request, timeout=TIMEOUT))]
            except grpc.RpcError as e:
                return e.code(), e.details(), []

        def still_serving(self) -> None:
            (t,) = self.client.translate(["Ein Hund rennt."], beam_size=1, max_output_tokens=3)
            assert t.text and t.output_tokens <= 3

    f = Fuzz()
    f.still_serving()
    yield f
    f.client.close()
    channel.close()


# docs/security.md: a model name is at most 128 characters of [A-Za-z0-9._-], not starting with a
# dot; a version is a positive integer in ASCII digits without a leading zero (18 digits at most).
MODEL_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
VERSION = re.compile(r"[1-9][0-9]{0,17}")
# docs/security.md: no status message is longer than this, whatever the request.
MAX_DETAILS = 1024


def model_problem(ref: str, field: str = "model") -> tuple[grpc.StatusCode, str] | None:
    """What the server answers for a `model` field before anything else: None when it names the
    one served model ("model", version 1), else NOT_FOUND, or INVALID_ARGUMENT when malformed."""
    name, colon, version = ref.partition(":")
    malformed_name = name and not MODEL_NAME.fullmatch(name)
    if (ref and not name) or malformed_name or (colon and not VERSION.fullmatch(version)):
        return grpc.StatusCode.INVALID_ARGUMENT, field
    if name not in ("", "model") or version not in ("", "1"):
        return grpc.StatusCode.NOT_FOUND, field
    return None


# The one served model's language pair: a request's source_language / target_language, when set,
# must be these (empty means any).
SERVED_PAIR = ("de", "en")


def route_problem(req, field: str = "model") -> tuple[grpc.StatusCode, str] | None:
    """What the server answers for a request's model and language pair before its texts: the
    `model` problem first, then NOT_FOUND naming the request's language fields (both; Encode's
    source_language) for a pair that the model (named, or the one a pair would pick) does not serve."""
    problem = model_problem(req.model, field)
    if problem is not None:
        return problem
    pair = (getattr(req, "source_language", ""), getattr(req, "target_language", ""))
    if any(lang and lang != served for lang, served in zip(pair, SERVED_PAIR)):
        prefix = field[: -len("model")]
        if not hasattr(req, "target_language"):  # Encode: the one language field it has
            return grpc.StatusCode.NOT_FOUND, f"{prefix}source_language"
        return grpc.StatusCode.NOT_FOUND, f"{prefix}source_language/{prefix}target_language"
    return None


def expect(code, details, problem: str | None, model: tuple[grpc.StatusCode, str] | None = None) -> None:
    """OK when there is no problem, else INVALID_ARGUMENT naming exactly the field at fault; a
    `model` problem comes first. Never a message longer than MAX_DETAILS."""
    assert len(details) <= MAX_DETAILS, (code, details[:200], len(details))
    if model is not None:
        assert code == model[0], (code, details, model)
        assert details.startswith(model[1] + ": "), (details, model)
    elif problem is None:
        assert code == grpc.StatusCode.OK, (code, details)
    else:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details, problem)
        assert details.startswith(problem + ": "), (details, problem)


def page_problem(req: pb.GetModelInfoRequest) -> str | None:
    """The field at fault in GetModelInfo's paging (translation.proto): page_size outside 0..1000,
    or a page_token that is not a number of at most 18 digits, as ServedModel.next_page_token is."""
    if not 0 <= req.page_size <= MAX_PAGE_SIZE:
        return "page_size"
    if req.page_token and not (req.page_token.isascii() and req.page_token.isdigit()):
        return "page_token"
    if len(req.page_token) > MAX_PAGE_TOKEN_DIGITS:
        return "page_token"
    return None


REQUESTS = {
    "Translate": pb.TranslateRequest,
    "TranslateStream": pb.TranslateStreamRequest,
    "TranslateMany": pb.TranslateManyRequest,
    "Encode": pb.EncodeRequest,
    "GetModelInfo": pb.GetModelInfoRequest,
}


def check_many_item(fz, req: pb.TranslateManyRequest, answer: pb.TranslateManyResponse) -> None:
    """One TranslateMany item's answer: the Translate call's outcome, as the item's own status."""
    assert answer.id == req.id
    problem = fz.check.translate(list(req.request.texts), req.request.options)
    if answer.HasField("error"):
        code = STATUS_BY_NUMBER[answer.error.code]
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and 0 < req.timeout_ms < TIMEOUT * 1000:
            return  # its own deadline, which the oracle does not model
        expect(code, answer.error.message, problem, route_problem(req.request, "request.model"))
    else:
        expect(grpc.StatusCode.OK, "", problem, route_problem(req.request, "request.model"))
        assert len(answer.response.translations) == len(req.request.texts) and answer.response.model
        for t, text in zip(answer.response.translations, req.request.texts):
            fz.check.check_translation(t, text, req.request.options)


def check_call(fz, method: str, raw: bytes) -> None:
    """Send `raw` to `method` and hold the answer against the oracle."""
    code, details, responses = fz.call(method, raw)
    if currently_in_test_context():  # the share of each outcome: --hypothesis-show-statistics
        event(f"{method}: {code.name} {details.split(':')[0] if details else ''}".rstrip())
    try:
        req = REQUESTS[method].FromString(raw)
    except DecodeError:
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
        assert details.startswith("request: not a valid protobuf message"), details
        return
    if method in ("Translate", "TranslateStream") and req.options.text_type != pb.TEXT_TYPE_TEXT:
        texts = list(req.texts) if method == "Translate" else [req.text]
        field = "texts" if method == "Translate" else "text"
        early = fz.check.before_markup(texts, req.options, field)
        if early is not None or route_problem(req) is not None:
            expect(code, details, early, route_problem(req))
        else:  # markup (docs/markup.md): the plain-text oracle does not model its translations
            assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (code, details)
        return
    if method == "Translate":
        expect(code, details, fz.check.translate(list(req.texts), req.options), route_problem(req))
        if code == grpc.StatusCode.OK:
            (resp,) = responses
            assert len(resp.translations) == len(req.texts) and resp.model
            for t, text in zip(resp.translations, req.texts):
                fz.check.check_translation(t, text, req.options)
    elif method == "TranslateStream":
        expect(code, details, fz.check.translate([req.text], req.options, field="text"), route_problem(req))
        if code == grpc.StatusCode.OK:
            *chunks, final = responses
            assert final.HasField("final") and all(m.HasField("chunk") for m in chunks)
            streamed = "".join(m.chunk.text for m in chunks)  # split NONE: the translation alone
            assert (streamed.strip() if req.options.split == pb.SPLIT_NONE else streamed) == final.final.text
            fz.check.check_translation(final.final, req.text, req.options)
    elif method == "TranslateMany":
        assert code == grpc.StatusCode.OK, (code, details)  # items fail alone; the stream ends OK
        (answer,) = responses
        check_many_item(fz, req, answer)
    elif method == "Encode":
        expect(code, details, fz.check.texts_problem(list(req.texts), "texts"), route_problem(req))
        if code == grpc.StatusCode.OK:
            (resp,) = responses
            assert len(resp.encodings) == len(req.texts)
            for e, text in zip(resp.encodings, req.texts):
                assert len(e.tokens) == fz.check.n_tokens(text)
                assert np.all(np.isfinite(np.asarray(e.pooled))) and len(e.pooled) > 0
                assert len(e.token_embeddings.data) == (
                    len(e.pooled) * len(e.tokens) if req.return_token_embeddings else 0
                )
    else:  # GetModelInfo
        expect(code, details, page_problem(req), model_problem(req.model))


# ----------------------------------------------------------------------------- properties


@fuzz_settings(700)
@given(texts=texts, opts=options)
def test_translate_any_texts_and_options(fz, texts, opts):
    check_call(fz, "Translate", pb.TranslateRequest(texts=texts, options=options_pb(opts)).SerializeToString())
    fz.still_serving()


@fuzz_settings(300)
@given(text=a_text, opts=options)
def test_translate_stream_any_text_and_options(fz, text, opts):
    check_call(
        fz, "TranslateStream", pb.TranslateStreamRequest(text=text, options=options_pb(opts)).SerializeToString()
    )
    fz.still_serving()


@fuzz_settings(150)
@given(items=st.lists(st.tuples(texts, options, st.sampled_from([0, 0, 1, 50, 60_000])), min_size=1, max_size=5))
def test_translate_many_any_items_on_one_stream(fz, items):
    reqs = [
        pb.TranslateManyRequest(
            id=f"item-{i}", request=pb.TranslateRequest(texts=t, options=options_pb(o)), timeout_ms=ms
        )
        for i, (t, o, ms) in enumerate(items)
    ]
    code, details, answers = fz.call("TranslateMany", [r.SerializeToString() for r in reqs])
    assert code == grpc.StatusCode.OK, (code, details)
    assert sorted(a.id for a in answers) == sorted(r.id for r in reqs)  # each answered once
    by_id = {a.id: a for a in answers}
    for r in reqs:
        check_many_item(fz, r, by_id[r.id])
    fz.still_serving()


@fuzz_settings(300)
@given(texts=texts, embeddings=st.booleans())
def test_encode_any_texts(fz, texts, embeddings):
    check_call(fz, "Encode", pb.EncodeRequest(texts=texts, return_token_embeddings=embeddings).SerializeToString())
    fz.still_serving()


@fuzz_settings(400)
@given(method=st.sampled_from(sorted(REQUESTS)), raw=st.one_of(st.binary(max_size=64), st.binary(max_size=2048)))
@example(method="GetModelInfo", raw=b"\x10\x80\x08")  # page_size 1024
@example(method="GetModelInfo", raw=b"\x1a\x01x")  # page_token "x"
def test_random_bytes_on_the_wire(fz, method, raw):
    check_call(fz, method, raw)
    fz.still_serving()


mutation = st.tuples(
    st.sampled_from(["flip", "set", "insert", "delete", "truncate"]), st.integers(0, 10**6), st.integers(0, 255)
)


@fuzz_settings(400)
@given(
    method=st.sampled_from(["Translate", "TranslateStream", "Encode"]),
    texts=st.lists(short_text, max_size=4),
    opts=options,
    mutations=st.lists(mutation, min_size=1, max_size=4),
)
def test_mutated_valid_messages(fz, method, texts, opts, mutations):
    if method == "Translate":
        msg = pb.TranslateRequest(texts=texts, options=options_pb(opts))
    elif method == "TranslateStream":
        msg = pb.TranslateStreamRequest(text=texts[0] if texts else "", options=options_pb(opts))
    else:
        msg = pb.EncodeRequest(texts=texts, return_token_embeddings=opts["return_tokens"])
    raw = bytearray(msg.SerializeToString())
    for op, pos, byte in mutations:
        i = pos % (len(raw) + 1)
        if op == "insert" or not raw:
            raw.insert(i, byte)
        elif op == "flip":
            raw[i % len(raw)] ^= 1 << (byte % 8)
        elif op == "set":
            raw[i % len(raw)] = byte
        elif op == "delete":
            del raw[i % len(raw)]
        else:
            del raw[i:]
    check_call(fz, method, bytes(raw))
    fz.still_serving()


# ----------------------------------------------------------------------------- the extremes, by hand


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"\x0a\x03\xed\xa0\x80", "UTF-8"),  # a lone surrogate (U+D800) as protobuf would never encode it
        (b"\x0a\x06ab\xed\xb0\x80c", "UTF-8"),  # a lone low surrogate inside text
        (b"\x0a\x02\xc0\xaf", "UTF-8"),  # an overlong encoding of "/"
        (b"\x0a\x01\xff", "UTF-8"),
        (b"\x0a\x05ab", "corrupt"),  # a length running past the end
        (b"\x12\xff\xff\xff\xff\x0f", "corrupt"),  # a 4 GiB sub-message length
        (b"\x08" + b"\xff" * 11, "corrupt"),  # a varint longer than 10 bytes
    ],
)
def test_malformed_protobuf_is_invalid_argument(fz, raw, reason):
    for method in ("Translate", "TranslateStream", "TranslateMany", "Encode"):
        code, details, _ = fz.call(method, raw)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details)
        assert details.startswith("request: not a valid protobuf message") and reason in details, details
    fz.still_serving()


def test_lone_surrogates_cannot_even_be_sent_by_the_client():
    with pytest.raises(UnicodeEncodeError):
        pb.TranslateRequest(texts=["a\ud800b"])


def test_one_megabyte_texts(fz):
    for text in ("Hund " * 200_000, "\U0001f600" * 250_000, "\u0301" * 500_000):
        assert len(text.encode()) >= 1_000_000
        code, details, _ = fz.call("Translate", pb.TranslateRequest(texts=["Hallo", text]).SerializeToString())
        expect(code, details, "texts[1]")
        assert "max_text_bytes" in details
        code, details, _ = fz.call("TranslateStream", pb.TranslateStreamRequest(text=text).SerializeToString())
        expect(code, details, "text")
        code, details, _ = fz.call("Encode", pb.EncodeRequest(texts=[text]).SerializeToString())
        expect(code, details, "texts[0]")
    fz.still_serving()


def test_message_over_the_receive_limit_is_resource_exhausted(fz):
    big = pb.TranslateRequest(texts=["Hund " * 200_000] * 5).SerializeToString()  # 5 MB > the 4 MiB default
    assert len(big) > fz.server.server.settings.max_receive_message_bytes
    code, details, _ = fz.call("Translate", big)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    fz.still_serving()


def test_thousands_of_texts_in_one_request(fz):
    for n in (17, 1000, 5000):
        code, details, _ = fz.call("Translate", pb.TranslateRequest(texts=["Ein Hund."] * n).SerializeToString())
        expect(code, details, "texts")
        assert f"{n} texts exceed max_texts_per_request" in details
        code, details, _ = fz.call("Encode", pb.EncodeRequest(texts=["Ein Hund."] * n).SerializeToString())
        expect(code, details, "texts")
    fz.still_serving()


def test_thousands_of_texts_answered_in_order_when_the_limits_allow(make_server):
    srv = make_server(max_texts_per_request=3000, max_queue_size=4096, max_queue_delay_ms=0.0)
    sentences = ["Ein Hund rennt.", "Zwei Männer sitzen auf einer Bank.", "Ein Kind.", "Eine Frau singt laut."]
    with srv.client(timeout=120) as c:
        alone = {s: c.translate([s], beam_size=1, max_output_tokens=4)[0].text for s in sentences}
        batch = [sentences[i % 4] for i in range(3000)]
        out = c.translate(batch, beam_size=1, max_output_tokens=4)
    assert [t.text for t in out] == [alone[s] for s in batch]
    assert srv.wait_idle(5)


def test_every_hostile_piece_alone_and_together(fz):
    everything = "".join(HOSTILE)
    for text in [*HOSTILE, everything[:300], "Ein Hund " + "".join(HOSTILE[:20]) + " rennt."]:
        for method, msg in (
            ("Translate", pb.TranslateRequest(texts=[text], options=pb.TranslationOptions(beam_size=1))),
            ("TranslateStream", pb.TranslateStreamRequest(text=text)),
            ("Encode", pb.EncodeRequest(texts=[text])),
        ):
            check_call(fz, method, msg.SerializeToString())
    fz.still_serving()


# ----------------------------------------------------------------------------- nothing to translate

# Texts from the categories that can hide "nothing": controls (Cc), format characters (Cf), spaces
# (Zs), combining marks (Mn) and private use (Co). Whether a text has anything left is the
# oracle's `normalized` (docs/security.md), drawn on every API.
invisible_text = st.lists(
    st.one_of(
        st.characters(categories=("Cc", "Cf", "Zs", "Mn", "Co")),
        st.characters(categories=("Cc", "Cf", "Zs")),
        st.characters(categories=("Cc", "Cf")),
        st.sampled_from(["\x00", "\u200b", "\ufeff", "\u00a0", "\u200d", "\t", "\r\n", "\x85", "\U000e0041"]),
    ),
    min_size=1,
    max_size=12,
).map("".join)
INVISIBLE_APIS = ["Translate", "TranslateStream", "TranslateMany", "Encode", "ModelInfer"]


def model_infer_request(fz, texts: list[str]) -> kserve_pb.ModelInferRequest:
    req = kserve_pb.ModelInferRequest(
        model_name=fz.server.server.engine.manifest.name,
        parameters={"beam_size": kserve_pb.InferParameter(int64_param=1)},
    )
    req.inputs.add(name="TEXT", datatype="BYTES", shape=[len(texts)]).contents.bytes_contents.extend(
        t.encode() for t in texts
    )
    return req


def check_on_api(fz, api: str, texts: list[str]) -> str | None:
    """Send `texts` (one text on TranslateStream) to `api` and hold the answer against the oracle;
    returns the field the oracle expects refused (in the API's own naming), or None."""
    opts = pb.TranslationOptions(beam_size=1, max_output_tokens=4)
    if api == "ModelInfer":
        problem = fz.check.texts_problem(texts, "texts")
        if problem is not None:  # the KServe names of the same fields
            problem = "inputs[0]" + problem[len("texts") :]
        code, details, responses = fz.call(api, model_infer_request(fz, texts).SerializeToString())
        expect(code, details, problem)
        if code == grpc.StatusCode.OK:
            (resp,) = responses
            assert list(resp.outputs[0].shape) == [len(texts)]
        return problem
    if api == "TranslateStream":
        msg = pb.TranslateStreamRequest(text=texts[0], options=opts)
        check_call(fz, api, msg.SerializeToString())
        return fz.check.translate(texts[:1], opts, field="text")
    if api == "TranslateMany":
        msg = pb.TranslateManyRequest(id="x", request=pb.TranslateRequest(texts=texts, options=opts))
        check_call(fz, api, msg.SerializeToString())
        return fz.check.translate(texts, opts)
    if api == "Encode":
        check_call(fz, api, pb.EncodeRequest(texts=texts).SerializeToString())
        return fz.check.texts_problem(texts, "texts")
    check_call(fz, api, pb.TranslateRequest(texts=texts, options=opts).SerializeToString())
    return fz.check.translate(texts, opts)


@fuzz_settings(250)
@given(
    api=st.sampled_from(INVISIBLE_APIS), texts=st.lists(st.one_of(invisible_text, benign_text), min_size=1, max_size=3)
)
def test_texts_of_controls_format_characters_spaces_and_marks(fz, api, texts):
    problem = check_on_api(fz, api, texts)
    if currently_in_test_context():
        event(f"{api}: {problem or 'OK'}")
    fz.still_serving()


@pytest.mark.parametrize("api", INVISIBLE_APIS)
@pytest.mark.parametrize(
    "nothing", ["\x00\x00", "\u200b\ufeff", "\u200e\u202e\u2066", " \x1b\x7f\u3000\u00ad ", "\U000e0001"]
)
def test_texts_with_nothing_to_translate_are_refused_on_every_api(fz, api, nothing):
    if api == "TranslateStream":  # one text
        assert check_on_api(fz, api, [nothing]) == "text"
    else:
        expected = "inputs[0][1]" if api == "ModelInfer" else "texts[1]"
        assert check_on_api(fz, api, ["Ein Hund rennt.", nothing]) == expected
    # Beside a word, the same characters are dropped and the word is translated.
    assert check_on_api(fz, api, [nothing + "Hund" + nothing]) is None


# ----------------------------------------------------------------------------- hostile names

HUGE = "x" * 100_000  # a 100 kB name: whole in a status it would pass gRPC's 16 KiB metadata limit
# Names and versions refused at the edge (docs/security.md): (model field, the problem's start).
BAD_MODELS = [
    (HUGE, f"{HUGE[:64]!r}"[:-1] + "…' (100000 chars) is not a model name"),
    ("m" * 129, "'" + "m" * 64 + "…' (129 chars) is not a model name"),
    ("model:", "version '' of 'model:' is not a positive integer"),
    ("model:01", "version '01' of 'model:01'"),
    ("model:\uff11", "version '\uff11'"),
    ("model:1" + "0" * 18, "version '1000"),
    (".model", "'.model' is not a model name"),
    ("../model", "'../model' is not a model name"),
    ("mo del", "'mo del' is not a model name"),
    ("modèl", "'modèl' is not a model name"),
    ("model:" + HUGE, "version 'xxxx"),
]


def mtserve_calls(model: str) -> dict[str, tuple[str, bytes]]:
    """Every mtserve.v1 call naming `model`: (its model field, the request)."""
    text, opts = ["Ein Hund rennt."], pb.TranslationOptions(beam_size=1, max_output_tokens=3)
    return {
        "Translate": ("model", pb.TranslateRequest(texts=text, model=model, options=opts).SerializeToString()),
        "TranslateStream": ("model", pb.TranslateStreamRequest(text=text[0], model=model).SerializeToString()),
        "Encode": ("model", pb.EncodeRequest(texts=text, model=model).SerializeToString()),
        "GetModelInfo": ("model", pb.GetModelInfoRequest(model=model).SerializeToString()),
        "TranslateMany": (
            "request.model",
            pb.TranslateManyRequest(id="a", request=pb.TranslateRequest(texts=text, model=model)).SerializeToString(),
        ),
    }


@pytest.mark.parametrize("model, problem", BAD_MODELS, ids=lambda v: v[:24] if isinstance(v, str) else v)
def test_malformed_model_names_are_invalid_argument_with_a_short_message(fz, model, problem):
    for method, (field, raw) in mtserve_calls(model).items():
        code, details, responses = fz.call(method, raw)
        if method == "TranslateMany":
            (answer,) = responses
            code, details = STATUS_BY_NUMBER[answer.error.code], answer.error.message
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, code, details[:200])
        assert details.startswith(f"{field}: {problem}"), (method, details[:200])
        assert len(details) <= MAX_DETAILS, (method, len(details))
    fz.still_serving()


KSERVE = "/inference.GRPCInferenceService/"


def kserve_status(fz, method: str, request) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(fz.server.address) as ch:
        stub = kserve_grpc.GRPCInferenceServiceStub(ch)
        try:
            getattr(stub, method)(request, timeout=TIMEOUT)
        except grpc.RpcError as e:
            return e.code(), e.details()
    return grpc.StatusCode.OK, ""


def test_kserve_names_versions_and_parameters_are_checked_and_quoted_short(fz):
    infer = model_infer_request(fz, ["Ein Hund rennt."])
    name = infer.model_name
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = []
    for version, shown in (("abc", "'abc'"), ("-1", "'-1'"), ("01", "'01'"), ("\uff11", "'\uff11'"), (HUGE, "'xxx")):
        req = kserve_pb.ModelInferRequest()
        req.CopyFrom(infer)
        req.model_version = version
        cases.append(("ModelInfer", req, invalid, f"model_version: {shown}"))
        cases.append(
            ("ModelMetadata", kserve_pb.ModelMetadataRequest(name=name, version=version), invalid, "version: ")
        )
    cases.append(("ModelInfer", kserve_pb.ModelInferRequest(model_name=HUGE), invalid, "model_name: 'xxx"))
    hostile = kserve_pb.ModelInferRequest()
    hostile.CopyFrom(infer)
    hostile.parameters[HUGE].string_param = "x"
    cases.append(("ModelInfer", hostile, invalid, "parameters['xxx"))
    wrong_input = kserve_pb.ModelInferRequest()
    wrong_input.CopyFrom(infer)
    wrong_input.inputs[0].name = HUGE
    cases.append(("ModelInfer", wrong_input, invalid, "inputs[0].name: unknown input 'xxx"))
    wrong_type = kserve_pb.ModelInferRequest()
    wrong_type.CopyFrom(infer)
    wrong_type.inputs[0].datatype = HUGE
    cases.append(("ModelInfer", wrong_type, invalid, "inputs[0].datatype: TEXT must be BYTES, got 'xxx"))
    language = kserve_pb.ModelInferRequest()
    language.CopyFrom(infer)
    language.parameters["target_language"].string_param = HUGE
    cases.append(("ModelInfer", language, grpc.StatusCode.NOT_FOUND, "parameters.source_language/"))
    # The repository's calls (a one-model server answers FAILED_PRECONDITION to a valid one).
    load, unload = kserve_pb.RepositoryModelLoadRequest, kserve_pb.RepositoryModelUnloadRequest
    cases += [
        ("RepositoryModelLoad", load(model_name=HUGE), invalid, "model_name: 'xxx"),
        ("RepositoryModelUnload", unload(model_name=HUGE), invalid, "model_name: 'xxx"),
        ("RepositoryModelLoad", load(model_name="model:"), invalid, "model_name: 'model:' is not a model name"),
        ("RepositoryModelLoad", load(model_name="model", repository_name=HUGE), grpc.StatusCode.NOT_FOUND, "repo"),
        ("RepositoryIndex", kserve_pb.RepositoryIndexRequest(repository_name=HUGE), grpc.StatusCode.NOT_FOUND, "repo"),
    ]
    versioned = load(model_name="model")
    versioned.parameters["version"].string_param = "01"
    cases.append(("RepositoryModelLoad", versioned, invalid, "parameters[\"version\"]: '01'"))
    keyed = load(model_name="model")
    keyed.parameters[HUGE].string_param = "x"
    cases.append(("RepositoryModelLoad", keyed, invalid, "parameters['xxx"))
    for method, request, code, start in cases:
        got, details = kserve_status(fz, method, request)
        assert got == code and details.startswith(start), (method, got, details[:200])
        assert len(details) <= MAX_DETAILS, (method, len(details))
    with grpc.insecure_channel(fz.server.address) as ch:  # a readiness probe answers no, whatever it names
        ready = kserve_grpc.GRPCInferenceServiceStub(ch).ModelReady
        assert not ready(kserve_pb.ModelReadyRequest(name=HUGE, version=HUGE), timeout=TIMEOUT).ready
    fz.still_serving()


def test_long_language_codes_and_item_ids_are_quoted_short(fz):
    for method, raw in (
        ("Translate", pb.TranslateRequest(texts=["Hund"], source_language=HUGE).SerializeToString()),
        ("TranslateStream", pb.TranslateStreamRequest(text="Hund", target_language=HUGE).SerializeToString()),
        ("Encode", pb.EncodeRequest(texts=["Hund"], source_language=HUGE).SerializeToString()),
    ):
        code, details, _ = fz.call(method, raw)
        assert code == grpc.StatusCode.NOT_FOUND and "(100000 chars)" in details, (method, code, details[:200])
        assert len(details) <= MAX_DETAILS
    many = [pb.TranslateManyRequest(id=HUGE, request=pb.TranslateRequest(texts=["Hund"], model="nope:0"))] * 2
    code, details, answers = fz.call("TranslateMany", [m.SerializeToString() for m in many])
    assert code == grpc.StatusCode.OK and len(answers) == 2
    for a in answers:
        assert len(a.error.message) <= MAX_DETAILS, len(a.error.message)
    fz.still_serving()
