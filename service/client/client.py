"""Python client library for mtserve.

    from service.client import Client
    with Client("localhost:50051") as c:
        print(c.translate(["Ein Hund rennt durch den Schnee."])[0].text)
        print(c.translate(["Un chien court."], model="fr-en")[0].text)   # another model the server serves
        print(c.translate(["Ein Hund."], model="de-en:2")[0].text)      # one version of it
        print([(m.name, m.version) for m in c.model_info().models])   # what it serves

`model` is "NAME" (that model's default version), "NAME:VERSION", or empty (the server's default
model); TranslateResponse.model and EncodeResponse.model report the "NAME:VERSION" that answered.

`target` may be one address, a list of addresses (client-side round robin over all of them),
or a gRPC name such as `dns:///mtserve-headless.default.svc.cluster.local:50051`, which
resolves to every replica (use a headless Service in Kubernetes).

TLS and authentication (docs/security.md):

    Client("mt.example.com:443", ca_cert="ca.pem")                        # TLS, server verified
    Client(addr, ca_cert="ca.pem", client_cert="me.pem", client_key="me.key")   # mutual TLS
    Client(addr, ca_cert="ca.pem", token=os.environ["MTSERVE_TOKEN"])    # + bearer token
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypedDict, Unpack

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

DEFAULT_SERVER = "localhost:50051"
STATUS_BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}  # an ItemError's `code` -> grpc.StatusCode
# TranslationOptions.split by name (docs/documents.md).
SPLITS = {"": pb.SPLIT_DEFAULT, "sentences": pb.SPLIT_SENTENCES, "newlines": pb.SPLIT_NEWLINES, "none": pb.SPLIT_NONE}


class ItemFailed(Exception):
    """An item of a TranslateMany stream failed: its index, status code and message."""

    def __init__(self, index: int, code: grpc.StatusCode | None, message: str):
        super().__init__(f"text {index}: {code.name if code else 'UNKNOWN'}: {message}")
        self.index, self.code, self.message = index, code, message


def channel_target(target: str | Sequence[str]) -> str:
    """One address as is; several become an `ipv4:`/`ipv6:` list that round robin spreads over."""
    if isinstance(target, str):
        if "," not in target:
            return target
        target = [t.strip() for t in target.split(",") if t.strip()]
    hosts = []
    for addr in target:
        host, _, port = addr.rpartition(":")
        host = {"localhost": "127.0.0.1"}.get(host, host)
        hosts.append(f"{host}:{port}")
    scheme = "ipv6" if any(h.startswith("[") for h in hosts) else "ipv4"
    return f"{scheme}:{','.join(hosts)}"


class OptionFields(TypedDict, total=False):
    """The keyword arguments of `options`, which the translate methods pass on."""

    beam_size: int
    max_output_tokens: int
    length_penalty: float | None
    return_scores: bool
    return_tokens: bool
    return_alignment: bool
    min_output_tokens: int
    num_hypotheses: int
    sampling_topk: int
    sampling_topp: float | None
    sampling_temperature: float | None
    seed: int
    split: str
    text_type: str
    glossary: Mapping[str, str] | Sequence[tuple[str, str] | tuple[str, str, Sequence[str]]]
    do_not_translate: Sequence[str]
    glossary_id: str
    detect_per_segment: bool


TEXT_TYPES = {"": pb.TEXT_TYPE_TEXT, "text": pb.TEXT_TYPE_TEXT, "html": pb.TEXT_TYPE_HTML, "xml": pb.TEXT_TYPE_XML}


def glossary_entries(
    glossary: Mapping[str, str] | Sequence[tuple[str, str] | tuple[str, str, Sequence[str]]],
) -> list[pb.GlossaryEntry]:
    """GlossaryEntry messages from {source: target} or (source, target[, forms]) tuples."""
    items = list(glossary.items()) if isinstance(glossary, Mapping) else list(glossary)
    return [pb.GlossaryEntry(source=e[0], target=e[1], forms=list(e[2]) if len(e) > 2 else []) for e in items]


def options(
    beam_size: int = 0,
    max_output_tokens: int = 0,
    length_penalty: float | None = None,
    return_scores: bool = False,
    return_tokens: bool = False,
    return_alignment: bool = False,
    min_output_tokens: int = 0,
    num_hypotheses: int = 0,
    sampling_topk: int = 0,
    sampling_topp: float | None = None,
    sampling_temperature: float | None = None,
    seed: int = 0,
    split: str = "",
    text_type: str = "",
    glossary: Mapping[str, str] | Sequence[tuple[str, str] | tuple[str, str, Sequence[str]]] = (),
    do_not_translate: Sequence[str] = (),
    glossary_id: str = "",
    detect_per_segment: bool = False,
) -> pb.TranslationOptions:
    """The TranslationOptions message; None leaves an optional field unset (the server's default).
    `split`: "sentences", "newlines", "none" (SPLITS), or "" for the default (sentences).
    `text_type`: "text" (or ""), "html" or "xml". `glossary`: {source: target}, or (source, target)
    and (source, target, forms) tuples; `do_not_translate`: phrases kept verbatim; `glossary_id`: a
    glossary the model ships; `detect_per_segment`: with source_language "auto", per segment."""
    opts = pb.TranslationOptions(
        beam_size=beam_size,
        max_output_tokens=max_output_tokens,
        min_output_tokens=min_output_tokens,
        return_scores=return_scores,
        return_tokens=return_tokens,
        return_alignment=return_alignment,
        num_hypotheses=num_hypotheses,
        sampling_topk=sampling_topk,
        seed=seed,
        split=SPLITS[split],
        text_type=TEXT_TYPES[text_type],
        glossary=glossary_entries(glossary),
        do_not_translate=list(do_not_translate),
        glossary_id=glossary_id,
        detect_per_segment=detect_per_segment,
    )
    if length_penalty is not None:
        opts.length_penalty = length_penalty
    if sampling_topp is not None:
        opts.sampling_topp = sampling_topp
    if sampling_temperature is not None:
        opts.sampling_temperature = sampling_temperature
    return opts


def tls_credentials(
    ca_cert: str | Path | None = None, client_cert: str | Path | None = None, client_key: str | Path | None = None
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files. Without `ca_cert` the system's roots verify the
    server; `client_cert` and `client_key` (together) present a client certificate (mutual TLS)."""
    if (client_cert is None) != (client_key is None):
        raise ValueError("client_cert and client_key go together")

    def read(p: str | Path | None) -> bytes | None:
        return None if p is None else Path(p).read_bytes()

    return grpc.ssl_channel_credentials(
        root_certificates=read(ca_cert), private_key=read(client_key), certificate_chain=read(client_cert)
    )


class Client:
    def __init__(
        self,
        target: str | Sequence[str] = DEFAULT_SERVER,
        timeout: float | None = 60.0,
        credentials: grpc.ChannelCredentials | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        *,
        tls: bool = False,
        ca_cert: str | Path | None = None,
        client_cert: str | Path | None = None,
        client_key: str | Path | None = None,
        token: str | None = None,
        server_name: str | None = None,
    ):
        """`tls` (implied by `ca_cert` or `client_cert`) uses TLS; `server_name` overrides the name
        the server's certificate is checked against; `token` is sent as `authorization: Bearer`."""
        opts = [("grpc.lb_policy_name", "round_robin"), ("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if credentials is None and (tls or ca_cert or client_cert or client_key):
            credentials = tls_credentials(ca_cert, client_cert, client_key)
        if server_name:
            opts.append(("grpc.ssl_target_name_override", server_name))
        if token:
            metadata = [*metadata, ("authorization", f"Bearer {token}")]
        t = channel_target(target)
        self.channel = (
            grpc.secure_channel(t, credentials, options=opts) if credentials else grpc.insecure_channel(t, options=opts)
        )
        self.stub = pb_grpc.TranslationServiceStub(self.channel)
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.timeout = timeout
        self.metadata = list(metadata)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def wait_ready(self, timeout: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout)

    def translate(
        self,
        texts: Sequence[str],
        model: str = "",
        source_language: str = "",
        target_language: str = "",
        target_prefixes: Sequence[str] = (),
        **opts: Unpack[OptionFields],
    ) -> list[pb.Translation]:
        """`model`: "NAME", "NAME:VERSION", or empty for the server's default model (the response's
        `model`, the version that answered, is in `translate_response`); the languages pick the
        model when `model` is empty, and a multilingual model needs target_language.
        `target_prefixes`: none, or each text's forced start of its translation ("" = none)."""
        return list(
            self.translate_response(
                texts, model, source_language, target_language, target_prefixes, **opts
            ).translations
        )

    def translate_response(
        self,
        texts: Sequence[str],
        model: str = "",
        source_language: str = "",
        target_language: str = "",
        target_prefixes: Sequence[str] = (),
        **opts: Unpack[OptionFields],
    ) -> pb.TranslateResponse:
        """Translate, answered with the whole response: its translations and its `model`."""
        req = pb.TranslateRequest(
            texts=list(texts),
            options=options(**opts),
            model=model,
            source_language=source_language,
            target_language=target_language,
            target_prefixes=list(target_prefixes),
        )
        return self.stub.Translate(req, timeout=self.timeout, metadata=self.metadata)

    def translate_stream(
        self,
        text: str,
        model: str = "",
        source_language: str = "",
        target_language: str = "",
        target_prefix: str = "",
        **opts: Unpack[OptionFields],
    ) -> Iterator[pb.TranslateStreamResponse]:
        req = pb.TranslateStreamRequest(
            text=text,
            options=options(**opts),
            model=model,
            source_language=source_language,
            target_language=target_language,
            target_prefix=target_prefix,
        )
        return self.stub.TranslateStream(req, timeout=self.timeout, metadata=self.metadata)

    def translate_many(self, requests: Iterable[pb.TranslateManyRequest]) -> Iterator[pb.TranslateManyResponse]:
        """The TranslateMany stream as it is: `requests` is read lazily, the responses come in
        completion order, one per request id. No stream deadline: give each item `timeout_ms`."""
        return self.stub.TranslateMany(iter(requests), metadata=self.metadata)

    def translate_all(
        self,
        texts: Sequence[str],
        model: str = "",
        source_language: str = "",
        target_language: str = "",
        target_prefixes: Sequence[str] = (),
        **opts: Unpack[OptionFields],
    ) -> list[pb.Translation]:
        """Each text as its own TranslateMany item over one stream, each with the client's timeout;
        the translations in input order. A failed item raises ItemFailed (the rest still finish).
        `target_prefixes`: none, or one per text. A seed makes each item reproducible on its own
        (every item is its request's text 0)."""
        o = options(**opts)
        timeout_ms = int(self.timeout * 1000) if self.timeout else 0
        reqs = (
            pb.TranslateManyRequest(
                id=str(i),
                request=pb.TranslateRequest(
                    texts=[t],
                    options=o,
                    model=model,
                    source_language=source_language,
                    target_language=target_language,
                    target_prefixes=[target_prefixes[i]] if target_prefixes else [],
                ),
                timeout_ms=timeout_ms,
            )
            for i, t in enumerate(texts)
        )
        out: list[pb.Translation | None] = [None] * len(texts)
        failed: list[tuple[int, pb.ItemError]] = []
        for r in self.translate_many(reqs):
            if r.HasField("error"):
                failed.append((int(r.id), r.error))
            else:
                out[int(r.id)] = r.response.translations[0]
        if failed:
            index, error = min(failed, key=lambda f: f[0])
            raise ItemFailed(index, STATUS_BY_NUMBER.get(error.code), error.message)
        translations = [t for t in out if t is not None]
        if len(translations) != len(out):  # the server answers every id once: a gap is its fault
            raise ItemFailed(out.index(None), None, "the server sent no answer for this text")
        return translations

    def encode(
        self, texts: Sequence[str], return_token_embeddings: bool = False, model: str = "", source_language: str = ""
    ) -> list[dict]:
        req = pb.EncodeRequest(
            texts=list(texts),
            return_token_embeddings=return_token_embeddings,
            model=model,
            source_language=source_language,
        )
        out = []
        for e in self.stub.Encode(req, timeout=self.timeout, metadata=self.metadata).encodings:
            item = {"pooled": np.asarray(e.pooled, dtype=np.float32), "tokens": list(e.tokens)}
            if e.HasField("token_embeddings"):
                item["token_embeddings"] = np.asarray(e.token_embeddings.data, dtype=np.float32).reshape(
                    tuple(e.token_embeddings.shape)
                )
            out.append(item)
        return out

    def model_info(self, model: str = "") -> pb.ModelInfo:
        """The details of `model` (empty: the server's default model); `models` lists every model
        version the server serves."""
        return self.stub.GetModelInfo(pb.GetModelInfoRequest(model=model), timeout=self.timeout, metadata=self.metadata)

    def health(self, service: str = "") -> str:
        resp = self.health_stub.Check(
            health_pb2.HealthCheckRequest(service=service), timeout=self.timeout, metadata=self.metadata
        )
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def alignment_matrix(t: pb.Translation) -> np.ndarray:
    a = t.alignment
    return np.asarray(a.weights, dtype=np.float32).reshape(len(a.target_tokens), len(a.source_tokens))


def to_json(t: pb.Translation) -> str:
    from google.protobuf.json_format import MessageToDict

    return json.dumps(MessageToDict(t), ensure_ascii=False)
