"""Thin gRPC servicers: protobuf in, domain call, protobuf out. No logic lives here."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Iterable

import grpc

from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.engine.languages import LanguagePair, pair_page
from service.engine.many import translate_many
from service.engine.requests import GlossaryEntry, StreamItem, TranslateOptions, TranslationResult
from service.engine.streaming import translate_stream
from service.errors import quote
from service.grpc.context import deadline, request_id
from service.grpc.interceptors import error_status
from service.metrics import Metrics
from service.repository.registry import ModelRegistry
from service.repository.routing import AUTO, stream_detected, translate_detected
from service.settings import Settings


def _options(
    msg: pb.TranslationOptions, target_prefixes: Iterable[str] = (), target_prefix: str = ""
) -> TranslateOptions:
    return TranslateOptions(
        beam_size=msg.beam_size,
        max_output_tokens=msg.max_output_tokens,
        length_penalty=msg.length_penalty if msg.HasField("length_penalty") else None,
        return_scores=msg.return_scores,
        return_tokens=msg.return_tokens,
        return_alignment=msg.return_alignment,
        min_output_tokens=msg.min_output_tokens,
        num_hypotheses=msg.num_hypotheses,
        sampling_topk=msg.sampling_topk,
        sampling_topp=msg.sampling_topp if msg.HasField("sampling_topp") else None,
        sampling_temperature=msg.sampling_temperature if msg.HasField("sampling_temperature") else None,
        seed=msg.seed,
        target_prefix=target_prefix,
        target_prefixes=list(target_prefixes),
        split=SPLITS.get(msg.split, str(msg.split)),  # an unknown number: INVALID_ARGUMENT from the engine
        text_type=TEXT_TYPES.get(msg.text_type, str(msg.text_type)),
        glossary=[GlossaryEntry(e.source, e.target, tuple(e.forms)) for e in msg.glossary],
        do_not_translate=list(msg.do_not_translate),
        glossary_id=msg.glossary_id,
        detect_per_segment=msg.detect_per_segment,
    )


SPLITS = {
    pb.SPLIT_DEFAULT: "sentences",
    pb.SPLIT_SENTENCES: "sentences",
    pb.SPLIT_NEWLINES: "newlines",
    pb.SPLIT_NONE: "none",
}


TEXT_TYPES = {pb.TEXT_TYPE_TEXT: "text", pb.TEXT_TYPE_HTML: "html", pb.TEXT_TYPE_XML: "xml"}


def _pair(msg: pb.TranslateRequest | pb.TranslateStreamRequest) -> LanguagePair:
    return LanguagePair(msg.source_language, msg.target_language)


def translation_pb(r: TranslationResult, opts: TranslateOptions) -> pb.Translation:
    msg = pb.Translation(text=r.text, input_tokens=r.input_tokens, output_tokens=r.output_tokens, model=r.model)
    if r.detected_language:  # source_language "auto"
        msg.detected_language, msg.detected_confidence = r.detected_language, r.detected_confidence or 0.0
    if opts.return_scores and r.score is not None:  # asked for, the search computed it
        msg.score = r.score
    if opts.return_tokens:
        msg.tokens.extend(r.tokens)
        msg.token_ids.extend(r.token_ids)
    if opts.return_alignment and r.alignment is not None:
        msg.alignment.source_tokens.extend(r.alignment.source_tokens)
        msg.alignment.target_tokens.extend(r.alignment.target_tokens)
        msg.alignment.weights.extend(r.alignment.weights.ravel().tolist())
    for h in r.hypotheses:  # num_hypotheses > 1
        msg.hypotheses.add(text=h.text, score=h.score, tokens=h.tokens, token_ids=h.token_ids)
    for t in r.applied_terms:
        msg.applied_terms.add(
            source=t.source,
            target=t.target,
            source_start=t.source_start,
            source_end=t.source_end,
            start=t.start,
            end=t.end,
            origin=t.origin,
        )
    for seg in r.segments:
        part = translation_pb(seg.translation, opts)
        msg.segments.add(
            start=seg.start,
            end=seg.end,
            text=part.text,
            score=part.score,
            tokens=part.tokens,
            token_ids=part.token_ids,
            alignment=part.alignment if part.HasField("alignment") else None,
            input_tokens=part.input_tokens,
            output_tokens=part.output_tokens,
            detected_language=part.detected_language,
            detected_confidence=part.detected_confidence,
        )
    return msg


def _item_request_id(context: grpc.aio.ServicerContext, item_id: str) -> str:
    """A TranslateMany item's request id in the logs: the call's, then the item's id (cut)."""
    return f"{request_id(context)}/{item_id if len(item_id) <= 64 and item_id.isprintable() else quote(item_id)}"


class TranslationServicer(pb_grpc.TranslationServiceServicer):
    def __init__(self, models: ModelRegistry, settings: Settings, metrics: Metrics):
        self.models, self.settings, self.metrics = models, settings, metrics

    async def Translate(self, request: pb.TranslateRequest, context: grpc.aio.ServicerContext) -> pb.TranslateResponse:
        opts, pair = _options(request.options, request.target_prefixes), _pair(request)
        if pair.source == AUTO:
            threshold, timeout = self.settings.detection_threshold, deadline(context)
            found = await translate_detected(
                self.models, list(request.texts), opts, timeout, pair, threshold, "", request.model
            )
            return pb.TranslateResponse(translations=[translation_pb(r, opts) for r in found], model=found[0].model)
        async with self.models.use(request.model, pair=pair, timeout=deadline(context)) as served:
            results = await served.engine.translate(list(request.texts), opts, timeout=deadline(context), pair=pair)
            return pb.TranslateResponse(
                translations=[translation_pb(r, opts) for r in results], model=served.engine.model_name
            )

    async def TranslateStream(
        self, request: pb.TranslateStreamRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TranslateStreamResponse]:
        opts, pair = _options(request.options, target_prefix=request.target_prefix), _pair(request)
        async with contextlib.AsyncExitStack() as lease:
            if pair.source == AUTO:
                events = stream_detected(
                    self.models,
                    request.text,
                    opts,
                    deadline(context),
                    pair,
                    self.settings.detection_threshold,
                    request.model,
                )
            else:
                served = await lease.enter_async_context(
                    self.models.use(request.model, pair=pair, timeout=deadline(context))
                )
                events = translate_stream(served.engine, request.text, opts, deadline(context), pair)
            async for event in events:
                if isinstance(event, TranslationResult):
                    yield pb.TranslateStreamResponse(final=translation_pb(event, opts))
                else:
                    yield pb.TranslateStreamResponse(
                        chunk=pb.TranslationChunk(text=event.text, token_ids=event.token_ids)
                    )

    async def TranslateMany(
        self, request_iterator: AsyncIterator[pb.TranslateManyRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TranslateManyResponse]:
        async def items() -> AsyncIterator[StreamItem]:
            async for r in request_iterator:
                yield StreamItem(
                    id=r.id,
                    texts=list(r.request.texts),
                    options=_options(r.request.options, r.request.target_prefixes),
                    timeout=r.timeout_ms / 1000.0 if r.timeout_ms else None,
                    model=r.request.model,
                    pair=_pair(r.request),
                )

        names: dict[str, str] = {}  # item id -> the model:version that answered it

        async def translate(item: StreamItem, limit: float | None) -> list[TranslationResult]:
            if item.pair.source == AUTO:
                threshold = self.settings.detection_threshold
                found = await translate_detected(
                    self.models,
                    item.texts,
                    item.options,
                    limit,
                    item.pair,
                    threshold,
                    "request.",
                    item.model,
                    "request.model",
                )
                names[item.id] = found[0].model
                return found
            async with self.models.use(item.model, "request.model", item.pair, limit) as served:
                names[item.id] = served.engine.model_name
                return await served.engine.translate(item.texts, item.options, limit, item.pair, "request.")

        answers = translate_many(items(), translate, self.settings, self.metrics, timeout=deadline(context))
        async for item, outcome in answers:
            model = names.pop(item.id, "")
            if isinstance(outcome, Exception):
                rid = functools.partial(_item_request_id, context, item.id)
                code, message = error_status(outcome, "TranslateMany", rid)
                yield pb.TranslateManyResponse(id=item.id, error=pb.ItemError(code=code.value[0], message=message))
            else:
                yield pb.TranslateManyResponse(
                    id=item.id,
                    response=pb.TranslateResponse(
                        translations=[translation_pb(r, item.options) for r in outcome], model=model
                    ),
                )

    async def Encode(self, request: pb.EncodeRequest, context: grpc.aio.ServicerContext) -> pb.EncodeResponse:
        pair = LanguagePair(request.source_language, encoding=True)
        async with self.models.use(request.model, pair=pair, timeout=deadline(context)) as served:
            encodings = await served.engine.encode(
                list(request.texts), request.return_token_embeddings, deadline(context), pair
            )
            out = pb.EncodeResponse(model=served.engine.model_name)
        for e in encodings:
            msg = out.encodings.add(pooled=e.pooled.tolist(), tokens=e.tokens)
            if e.token_embeddings is not None:
                msg.token_embeddings.shape.extend(e.token_embeddings.shape)
                msg.token_embeddings.data.extend(e.token_embeddings.ravel().tolist())
        return out

    async def GetModelInfo(self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext) -> pb.ModelInfo:
        async with self.models.use(request.model, timeout=deadline(context)) as named:
            info = named.engine.model_info()
        limits = info.pop("limits")
        files = info.pop("files_sha256")
        tools = info.pop("tool_versions")
        batching = info.pop("batching")
        default = self.models.default_or_none()
        served = sorted(self.models.all(), key=lambda s: s is not default)
        models = []
        for s in served:
            langs = s.engine.languages
            page, next_token = pair_page(langs.pairs, request.page_size, request.page_token)
            default_pair = langs.has_default_pair  # a multilingual model has none: no pair is shown as one
            listed = langs.multilingual or not default_pair
            models.append(
                pb.ServedModel(
                    name=s.name,
                    version=s.version,
                    source_language=s.engine.manifest.src_lang if default_pair else "",
                    target_language=s.engine.manifest.tgt_lang if default_pair else "",
                    default_version=self.models.default_versions.get(s.name) == s.version,
                    default_model=s is default,
                    language_pairs=[pb.LanguagePair(source_language=a, target_language=b) for a, b in page],
                    language_pair_count=len(langs.pairs),
                    next_page_token=next_token,
                    source_languages=langs.spec.source if listed else [],
                    target_languages=langs.spec.target if listed else [],
                    decoder_graph=s.engine.graph,
                    glossaries=sorted(s.engine.glossaries),
                    state="loaded",
                    resident_bytes=s.resident_bytes,
                )
            )
        for e in self.models.index():
            if e.residency not in ("loaded", "unloaded"):
                models.append(
                    pb.ServedModel(
                        name=e.name,
                        version=e.version,
                        default_version=self.models.default_versions.get(e.name) == e.version,
                        default_model=e.name == self.models.default_name and not default,
                        state=e.residency,
                    )
                )
        return pb.ModelInfo(
            **info,
            limits=pb.Limits(**limits),
            files_sha256=files,
            tool_versions=tools,
            models=models,
            batching=pb.Batching(**batching),
        )
