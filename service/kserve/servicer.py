"""The Open Inference Protocol (KServe v2, `inference.GRPCInferenceService`), beside mtserve.v1 on
the same port. A thin servicer: it converts v2 tensors to texts and options (`codec`), calls the
same Engine (so the same scheduler, limits and metrics), and converts the results back. Errors
are the service's own (`service.errors`), mapped to status codes by the interceptor; their
messages name the v2 field at fault. The models served and the tensor layouts: see `codec`.

Three of Triton's extensions, which its tools (perf_analyzer, Model Analyzer) call: ModelConfig
(`codec.model_config`), ModelStatistics (read from the per-model Prometheus metrics that the
engine records for every API, `Metrics.model_statistics`), and RepositoryIndex.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from importlib import metadata

import grpc
import numpy as np

from service.api.inference import grpc_service_pb2 as pb
from service.api.inference import grpc_service_pb2_grpc as pb_grpc
from service.engine.engine import model_names
from service.engine.languages import LanguagePair
from service.engine.requests import TranslateOptions
from service.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unavailable, quote
from service.grpc.context import deadline
from service.kserve.codec import (
    INPUT,
    PLATFORM,
    ModelSpec,
    check_outputs,
    infer_response,
    input_texts,
    model_config,
    model_specs,
    request_parameters,
    result_parameters,
    v2_argument_error,
    v2_not_found,
)
from service.metrics import ModelStatistics as ModelStats
from service.repository.layout import check_name, check_version
from service.repository.registry import ModelRegistry, ServedModel
from service.repository.routing import AUTO, translate_detected
from service.settings import Settings

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


def _version() -> str:
    try:
        return metadata.version("mtserve")
    except metadata.PackageNotFoundError:
        return "0"


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models: ModelRegistry, settings: Settings, ready: Callable[[], bool]):
        self.models, self.settings = models, settings
        self.ready = ready

    # -- health and metadata ---------------------------------------------------------------

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready())

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        try:
            _, ref = self._ref(request.name, request.version, "name", "version")
            self.models.resolve(ref, "name")  # NOT_FOUND while it is available but not loaded
        except (NotFound, InvalidArgument, Unavailable):  # no model of that name or version (tools probe with any)
            return pb.ModelReadyResponse(ready=False)
        return pb.ModelReadyResponse(ready=self.ready())

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="mtserve",
            version=_version(),
            extensions=["parameters", "model_configuration", "statistics", "model_repository"],
        )

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        spec, served = await self._model(request.name, request.version, "name", "version", deadline(context))
        tensor = pb.ModelMetadataResponse.TensorMetadata
        versions = [s.version for s in self.models.versions(served.name)]
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=versions,
            platform=PLATFORM,
            # Triton's rule: the batch axis, then ModelConfig's dims ([1] for a text, reshaped to []).
            # perf_analyzer shapes its requests from this, and refuses the empty shape [-1] leaves.
            inputs=[tensor(name=INPUT, datatype="BYTES", shape=[-1, 1])],
            outputs=[
                tensor(
                    name=spec.output,
                    datatype=spec.output_datatype,
                    shape=list(spec.output_shape) if len(spec.output_shape) > 1 else [-1, 1],
                )
            ],
        )

    async def _model(
        self, name: str, version: str, name_field: str, version_field: str, timeout: float | None
    ) -> tuple[ModelSpec, ServedModel]:
        """The KServe model `name` (a served model, or its encoder) at `version` (empty: the
        model's default version), loaded first when it is available on demand."""
        base, ref = self._ref(name, version, name_field, version_field)
        async with self.models.use(ref, name_field, timeout=timeout) as served:
            return model_specs(base, served.engine.manifest)[name], served

    def _ref(self, name: str, version: str, name_field: str, version_field: str) -> tuple[str, str]:
        """The served model `name` is (itself or its encoder) and what the registry calls the
        version: ("NAME", "NAME" or "NAME:VERSION"), loaded or available on demand. A malformed
        name or version is INVALID_ARGUMENT; an unknown one NOT_FOUND."""
        check_name(name, name_field)
        if version:
            check_version(version, version_field)
        keys = set(self.models.served) | set(self.models.available)
        base_of = {kserve: n for n, _ in keys for kserve in model_names(n)}
        if name not in base_of:
            raise NotFound(f"{name_field}: unknown model {quote(name)} (served: {', '.join(sorted(base_of))})")
        base = base_of[name]
        known = sorted({v for n, v in keys if n == base}, key=int)
        if version and version not in known:
            raise NotFound(
                f"{version_field}: model {quote(name)} has no version {quote(version)} (served: {', '.join(known)})"
            )
        return base, f"{base}:{version}" if version else base

    # -- Triton extensions ----------------------------------------------------------------------

    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelConfigResponse:
        spec, served = await self._model(request.name, request.version, "name", "version", deadline(context))
        e = served.engine
        return pb.ModelConfigResponse(config=model_config(spec, e.manifest, e.settings, e.provider, served.version))

    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelStatisticsResponse:
        if request.name:
            spec, served = await self._model(request.name, request.version, "name", "version", deadline(context))
            wanted = [(spec, served)]
        else:
            if request.version:
                check_version(request.version, "version")
            wanted = [
                (spec, s)
                for s in self.models.all()
                if not request.version or s.version == request.version
                for spec in model_specs(s.name, s.engine.manifest).values()
            ]
            if not wanted:
                raise NotFound(f"version: no model has version {quote(request.version)}")
        # A scrape of the server's own registry: with engine processes it asks each of them for its
        # decoder steps over a pipe, so off the event loop.
        stats = await asyncio.to_thread(self.models.metrics.model_statistics)
        return pb.ModelStatisticsResponse(
            model_stats=[self._statistics(spec, s, stats) for spec, s in wanted],
        )

    def _statistics(
        self, spec: ModelSpec, served: ServedModel, stats: dict[tuple[str, str], ModelStats]
    ) -> pb.ModelStatistics:
        st = stats.get((spec.name, served.version)) or ModelStats()
        steps = stats.get((served.name, served.version)) or ModelStats()

        def duration(d: dict[str, float]) -> pb.StatisticDuration:
            return pb.StatisticDuration(count=round(d["count"]), ns=round(d["sum"] * 1e9))

        zero = {"count": 0.0, "sum": 0.0}
        return pb.ModelStatistics(
            name=spec.name,
            version=served.version,
            last_inference=round(st.last_inference * 1000),
            inference_count=round(st.inferences),
            # The translation model's executions are its decoder steps (each a run of the decoder
            # graph over a batch). The encoder model's runs share their metric with the
            # translations' encoder runs, so they are not told apart: 0.
            execution_count=round(steps.decoder_steps) if spec.kind == "translate" else 0,
            inference_stats=pb.InferStatistics(
                success=duration(st.success),
                fail=duration(st.failure),
                queue=duration(st.phases.get("queue", zero)),
                compute_input=duration(st.phases.get("compute_input", zero)),
                compute_infer=duration(st.phases.get("compute_infer", zero)),
                compute_output=duration(st.phases.get("compute_output", zero)),
            ),
        )

    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryIndexResponse:
        _one_repository(request.repository_name)
        index = pb.RepositoryIndexResponse.ModelIndex
        ready = self.ready()
        rows = []
        for e in self.models.index():
            state, reason = e.state, e.reason
            if state == "READY" and not ready:
                state, reason = "UNAVAILABLE", "the server is starting or draining"
            if request.ready and state != "READY":
                continue
            # A model is two KServe models, its translator and its encoder, loaded together.
            for name in model_names(e.name):
                rows.append(index(name=name, version=e.version, state=state, reason=reason))
        return pb.RepositoryIndexResponse(models=rows)

    def _control(
        self, request: pb.RepositoryModelLoadRequest | pb.RepositoryModelUnloadRequest, unload: bool = False
    ) -> tuple[str, bool]:
        """The checks every repository call makes; (version, default) from its parameters."""
        if not self.settings.repository_control:
            raise PermissionDenied("model_name: loading and unloading are off on this server (repository_control)")
        if self.settings.replicas > 1:
            raise FailedPrecondition(
                "model_name: loading and unloading are off with replicas > 1: a call reaches one replica, "
                "so the replicas would serve different models (restart with the MODELS setting instead)"
            )
        _one_repository(request.repository_name)
        if not request.model_name:
            raise InvalidArgument("model_name", "a model name is required")
        check_name(request.model_name, "model_name")
        version, default = "", False
        for key, p in request.parameters.items():
            kind = p.WhichOneof("parameter_choice")
            if key == "version" and kind in ("string_param", "int64_param"):
                version = check_version(str(getattr(p, kind)), 'parameters["version"]')
            elif key == "default" and kind == "bool_param":
                default = p.bool_param
            elif unload and key == "unload_dependents" and kind == "bool_param":
                # Triton's: tritonclient's unload_model always sends it. A model's encoder is
                # loaded and unloaded with it anyway; nothing else depends on a model.
                pass
            else:
                raise InvalidArgument(
                    f"parameters[{quote(key)}]",
                    'unknown or mistyped: "version" (string or int64) and "default" (bool) are accepted',
                )
        return version, default

    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelLoadResponse:
        version, default = self._control(request)
        await self.models.load(request.model_name, version, make_default=default)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: grpc.aio.ServicerContext
    ) -> pb.RepositoryModelUnloadResponse:
        version, default = self._control(request, unload=True)
        if default:
            raise InvalidArgument('parameters["default"]', "applies to RepositoryModelLoad only")
        await self.models.unload(request.model_name, version)
        return pb.RepositoryModelUnloadResponse()

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        spec, served = await self._model(
            request.model_name, request.model_version, "model_name", "model_version", deadline(context)
        )
        index, texts = input_texts(request)
        check_outputs(request, spec)
        params = request_parameters(request, spec)
        pair = LanguagePair(
            params.pop("source_language", ""), params.pop("target_language", ""), encoding=spec.kind == "encode"
        )
        output: list[bytes] | np.ndarray
        parameters: dict[str, str] = {}
        if spec.kind == "translate" and pair.source == AUTO:  # routed within the named model's languages
            opts = TranslateOptions(**params)
            try:
                results = await translate_detected(
                    self.models,
                    texts,
                    opts,
                    deadline(context),
                    pair,
                    self.settings.detection_threshold,
                    model=served.ref,
                    model_field="model_name",
                )
            except InvalidArgument as e:
                raise v2_argument_error(e, index) from None
            except NotFound as e:
                raise v2_not_found(e) from None
            output = [r.text.encode("utf-8") for r in results]
            terms = bool(opts.glossary or opts.do_not_translate or opts.glossary_id)
            return infer_response(
                request, spec, served.version, output, result_parameters(results, terms, detected=True)
            )
        with self.models.lease(served.ref, "model_name", pair):
            engine = served.engine
            try:
                if spec.kind == "translate":
                    opts = TranslateOptions(**params)
                    results = await engine.translate(texts, opts, timeout=deadline(context), pair=pair)
                    output = [r.text.encode("utf-8") for r in results]
                    terms = bool(opts.glossary or opts.do_not_translate or opts.glossary_id)
                    parameters = result_parameters(results, terms, detected=False)
                else:
                    encodings = await engine.encode(texts, False, deadline(context), pair)
                    output = np.stack([e.pooled for e in encodings]).astype("<f4")
            except InvalidArgument as e:
                raise v2_argument_error(e, index) from None
            except NotFound as e:
                raise v2_not_found(e) from None
        return infer_response(request, spec, served.version, output, parameters)


def _one_repository(repository_name: str) -> None:
    """The repository calls' `repository_name`: empty, as this server has one repository."""
    if repository_name:
        raise NotFound(f"repository_name: this server has one repository, unnamed (got {quote(repository_name)})")
