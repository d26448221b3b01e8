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

import numpy as np

from service.api.inference import grpc_service_pb2 as pb
from service.api.inference import grpc_service_pb2_grpc as pb_grpc
from service.engine.engine import Engine, TranslateOptions
from service.errors import InvalidArgument, NotFound
from service.grpc.context import deadline
from service.kserve.codec import (
    INPUT,
    PLATFORM,
    ModelSpec,
    accepted_versions,
    check_outputs,
    infer_response,
    input_texts,
    model_config,
    model_specs,
    request_parameters,
    served_version,
    v2_argument_error,
)
from service.metrics import ModelStatistics as ModelStats

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name


def _version() -> str:
    try:
        return metadata.version("mtserve")
    except metadata.PackageNotFoundError:
        return "0"


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    def __init__(self, engine: Engine, ready: Callable[[], bool]):
        self.engine = engine
        self.ready = ready
        self.version = served_version(engine.manifest)
        self.versions = accepted_versions(engine.manifest)
        self.models = model_specs(engine.manifest)

    # -- health and metadata ---------------------------------------------------------------

    async def ServerLive(self, request, context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context) -> pb.ModelReadyResponse:
        known = request.name in self.models and request.version in self.versions
        return pb.ModelReadyResponse(ready=known and self.ready())

    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(
            name="mtserve", version=_version(), extensions=["parameters", "model_configuration", "statistics"]
        )

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:
        spec = self._model(request.name, request.version, "name", "version")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=spec.name,
            versions=[self.version],
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

    def _model(self, name: str, version: str, name_field: str, version_field: str) -> ModelSpec:
        if name not in self.models:
            raise NotFound(f"{name_field}: unknown model {name!r} (served: {', '.join(self.models)})")
        if version not in self.versions:
            raise NotFound(f"{version_field}: model {name!r} has no version {version!r} (served: {self.version})")
        return self.models[name]

    # -- Triton extensions ----------------------------------------------------------------------

    async def ModelConfig(self, request: pb.ModelConfigRequest, context) -> pb.ModelConfigResponse:
        spec = self._model(request.name, request.version, "name", "version")
        e = self.engine
        return pb.ModelConfigResponse(config=model_config(spec, e.manifest, e.settings, e.provider, self.version))

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context) -> pb.ModelStatisticsResponse:
        if request.name:
            names = [self._model(request.name, request.version, "name", "version").name]
        else:
            if request.version not in self.versions:
                raise NotFound(f"version: no model has version {request.version!r} (served: {self.version})")
            names = list(self.models)
        # A scrape of the server's own registry: with engine processes it asks each of them for its
        # decoder steps over a pipe, so off the event loop.
        stats = await asyncio.to_thread(self.engine.metrics.model_statistics)
        return pb.ModelStatisticsResponse(model_stats=[self._statistics(n, stats.get(n)) for n in names])

    def _statistics(self, name: str, st: ModelStats | None) -> pb.ModelStatistics:
        st = st or ModelStats()

        def duration(d: dict[str, float]) -> pb.StatisticDuration:
            return pb.StatisticDuration(count=round(d["count"]), ns=round(d["sum"] * 1e9))

        zero = {"count": 0.0, "sum": 0.0}
        translate = self.models[name].kind == "translate"
        return pb.ModelStatistics(
            name=name,
            version=self.version,
            last_inference=round(st.last_inference * 1000),
            inference_count=round(st.inferences),
            # The translation model's executions are its decoder steps (each a run of the decoder
            # graph over a batch). The encoder model's runs share their metric with the
            # translations' encoder runs, so they are not told apart: 0.
            execution_count=round(st.decoder_steps) if translate else 0,
            inference_stats=pb.InferStatistics(
                success=duration(st.success),
                fail=duration(st.failure),
                queue=duration(st.phases.get("queue", zero)),
                compute_input=duration(st.phases.get("compute_input", zero)),
                compute_infer=duration(st.phases.get("compute_infer", zero)),
                compute_output=duration(st.phases.get("compute_output", zero)),
            ),
        )

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context) -> pb.RepositoryIndexResponse:
        ready = self.ready()
        if request.ready and not ready:
            return pb.RepositoryIndexResponse()
        index = pb.RepositoryIndexResponse.ModelIndex
        state, reason = ("READY", "") if ready else ("UNAVAILABLE", "the server is starting or draining")
        return pb.RepositoryIndexResponse(
            models=[index(name=n, version=self.version, state=state, reason=reason) for n in self.models]
        )

    # -- inference --------------------------------------------------------------------------

    async def ModelInfer(self, request: pb.ModelInferRequest, context) -> pb.ModelInferResponse:
        spec = self._model(request.model_name, request.model_version, "model_name", "model_version")
        index, texts = input_texts(request)
        check_outputs(request, spec)
        params = request_parameters(request, spec)
        output: list[bytes] | np.ndarray
        try:
            if spec.kind == "translate":
                opts = TranslateOptions(**params)
                results = await self.engine.translate(texts, opts, timeout=deadline(context))
                output = [r.text.encode("utf-8") for r in results]
            else:
                encodings = await self.engine.encode(texts, False, timeout=deadline(context))
                output = np.stack([e.pooled for e in encodings]).astype("<f4")
        except InvalidArgument as e:
            raise v2_argument_error(e, index) from None
        return infer_response(request, spec, self.version, output)
