"""Loading one model version: its settings, its backend (engine processes, the in-process scheduler,
or the caller's), its Engine, and the warm-up. The registry calls `ModelLoader.load` for every
version it loads; the server only builds the loader.

The batching settings that neither the model's serving.json nor the server's settings set are
derived from the decoder step's cost, measured on the in-process backend's session before its
workers start (`service.batching.calibration`); the other backends keep the settings' values."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import NamedTuple

from contract.manifest import Manifest, load_manifest, resolve_onnx_dir
from service.batching.calibration import Batching, in_force
from service.batching.scheduler import Scheduler
from service.engine.backend import Backend
from service.engine.engine import Engine
from service.engine.glossary import NamedGlossary, load_glossaries
from service.engine.languages import LanguagePair
from service.engine.requests import TranslateOptions
from service.errors import ModelLoadError, StartupError
from service.metrics import Metrics, ModelMetrics
from service.parallel.pool import EnginePool
from service.repository.layout import SERVING_FILE, VersionDir, model_overrides
from service.repository.registry import ServedModel
from service.runtime.loading import load_models
from service.runtime.memory import mapped_allocations, release_freed_memory
from service.runtime.onnx_model import choose_graph, uses_shortlist
from service.runtime.tokenizer import TextTokenizer, load_tokenizer
from service.settings import Settings

log = logging.getLogger("mtserve.repository")


class LoadedModel(NamedTuple):
    """What the engine and the start-up log need from whichever backend loaded a model version."""

    backend: Backend
    manifest: Manifest
    tokenizer: TextTokenizer
    provider: str
    sessions: int  # session pairs, for the start-up log
    graph: str  # the decoder step: "fused", "portable", or the custom backend's name
    settings: Settings  # the version's settings with the batching values in force
    batching: Batching  # those values, where each came from, and the step costs measured


BackendFactory = Callable[[Settings, ModelMetrics, Manifest], Backend]
"""Builds a backend that decodes in place of the ONNX Runtime one, from one model version's
settings, its metrics and its export's manifest (benchmarks/ct2_server.py: CTranslate2). Its
`provider` attribute, when it has one, is what the server reports as the execution provider."""


def read_export(st: Settings, precision: str | None) -> tuple[Manifest, TextTokenizer]:
    """The export's manifest and tokenizer (the graphs are the backend's to load)."""
    try:
        graphs = resolve_onnx_dir(st.graphs_dir)
        manifest = load_manifest(graphs, verify_checksums=False, precision=precision)
        return manifest, load_tokenizer(graphs, manifest)
    except StartupError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{type(e).__name__}: {e}") from e


class ModelLoader:
    """Loads, starts and warms up model versions for a server with these settings and metrics.

    `backend_factory`: decode with the backend it builds instead of the ONNX Runtime sessions
    (in-process scheduler or engine processes)."""

    def __init__(self, settings: Settings, metrics: Metrics, backend_factory: BackendFactory | None = None):
        self.settings = settings
        self.metrics = metrics
        self.backend_factory = backend_factory

    async def load(self, source: VersionDir) -> ServedModel:
        """Load, start and warm up one model version (the registry's loader)."""
        serving = model_overrides(source)
        st = self._version_settings(source, serving)
        # The version's named glossaries first: a file at fault fails the load before any session.
        glossaries = await asyncio.get_running_loop().run_in_executor(None, load_glossaries, source.path)
        metrics = self.metrics.for_model(source.name, source.version)
        with mapped_allocations():  # the model's memory leaves the process when it is unloaded
            return await self._load_mapped(source, st, metrics, glossaries, set(serving))

    def estimate(self, source: VersionDir) -> int:
        """What `source` is expected to take in memory before its first load: the bytes of the
        tokenizer and graph files it would load (its precision, the decoder step chosen for the
        CPU), once per session pair when each decode worker has its own."""
        st = self._version_settings(source, model_overrides(source))
        graphs = resolve_onnx_dir(st.graphs_dir)
        manifest = load_manifest(graphs, verify_checksums=False, precision=st.precision)
        graph = choose_graph(manifest, st.precision, "cpu", st.graph)
        files = manifest.files(st.precision, graph)
        size = sum((graphs / f.file).stat().st_size for f in files)
        return size if st.share_sessions else size * max(1, st.decode_workers)

    def _version_settings(self, source: VersionDir, serving: dict) -> Settings:
        """The server's settings with the version's directories and the model's own values
        (NAME/serving.json), validated together (default_beam_size <= max_beam_size, ...)."""
        values = {
            **self.settings.model_dump(),
            **serving,
            "model_dir": source.path,
            "onnx_dir": source.onnx_dir,
        }
        try:
            return Settings.model_validate(values)
        except ValueError as e:  # pydantic's ValidationError
            raise ModelLoadError(f"{source.path.parent / SERVING_FILE}: {e}") from None

    async def _load_mapped(
        self,
        source: VersionDir,
        st: Settings,
        metrics: ModelMetrics,
        glossaries: dict[str, NamedGlossary],
        serving: set[str],
    ) -> ServedModel:
        loop = asyncio.get_running_loop()
        explicit = self.settings.model_fields_set
        if self.backend_factory is not None:
            loaded = _load_with_factory(st, metrics, self.backend_factory, explicit, serving)
        elif st.engine_process:
            loaded = await _start_engine_processes(st, metrics, explicit, serving)
        else:  # the sessions load off the event loop: other models keep serving meanwhile
            loaded = await loop.run_in_executor(None, _load_in_process, st, metrics, explicit, serving)
        st = loaded.settings
        log.info("%s:%s: batching: %s", source.name, source.version, loaded.batching.describe())
        engine = Engine(st, loaded.manifest, loaded.tokenizer, loaded.backend, metrics, loaded.provider, loaded.graph)
        engine.glossaries = glossaries
        engine.batching = loaded.batching
        engine.notes = graph_notes(loaded.manifest, st, loaded.provider, loaded.graph)
        engine.notes += shortlist_notes(loaded.manifest, st, loaded.graph)
        for note in engine.notes:
            log.warning("%s:%s: %s", source.name, source.version, note)
        default_pair = engine.languages.has_default_pair  # a multilingual model has none
        metrics.model_info.info(
            {
                "provider": loaded.provider,
                "precision": st.precision,
                "graph": loaded.graph,
                "source_language": loaded.manifest.src_lang if default_pair else "",
                "target_language": loaded.manifest.tgt_lang if default_pair else "",
                **batching_info(loaded.batching),
            }
        )
        loaded.backend.start()
        try:
            await self._warm_up(engine)
        except BaseException:
            loaded.backend.shutdown()
            raise
        return ServedModel(source, engine, loaded.backend, loaded.provider, loaded.graph, loaded.sessions)

    async def _warm_up(self, engine: Engine) -> None:
        """One short translation per mode used by default, so the first request is not slow
        (in the model's default pair: a multilingual model needs one)."""
        pair = LanguagePair(engine.manifest.src_lang, engine.manifest.tgt_lang)
        opts = TranslateOptions(beam_size=1, max_output_tokens=4)
        await engine.translate(["Hallo Welt ."] * max(1, self.settings.decode_workers), opts, pair=pair)
        await engine.translate(["Hallo Welt ."], TranslateOptions(max_output_tokens=4), pair=pair)


def batching_info(batching: Batching) -> dict[str, str]:
    """The batching values in force and their sources, as labels of the mtserve_model info metric."""
    info = {}
    for field, value in batching.values.items():
        info[field], info[f"{field}_source"] = f"{value:g}", batching.sources[field]
    return info


def graph_notes(manifest: Manifest, st: Settings, provider: str, graph: str) -> list[str]:
    """What GetModelInfo and the log say when the decoder step is not the fastest one for this
    provider because the export lacks it: never a silent fallback."""
    if graph != "portable" or provider != "cpu":
        return []
    if not manifest.has(st.precision, "fused"):
        return [
            f"no fused variant of {st.precision} in this export: the portable decoder step runs "
            f"(slower on the CPU; `mtserve export` makes the fused graphs)"
        ]
    if st.graph == "portable":
        return ["the portable decoder step runs as configured (MTSERVE_GRAPH=portable), not the fused one"]
    return []


def shortlist_notes(manifest: Manifest, st: Settings, graph: str) -> list[str]:
    """What GetModelInfo says of the version's vocabulary shortlist (`contract.shortlist`), when it has one."""
    spec = manifest.shortlist
    if spec is None:
        return []
    if uses_shortlist(manifest, st.precision, graph, st.shortlist):
        return [
            f"vocabulary shortlist: the output layer ranks each batch's candidate tokens only ({spec.per_source} "
            f"per source token, {spec.always} always; derived from {spec.pairs} {spec.derived_from} sentence pairs); "
            "shortlist=false in serving.json turns it off"
        ]
    why = "shortlist=false" if not st.shortlist else f"the {graph} decoder step of {st.precision} has none"
    return [f"the version's vocabulary shortlist is not used ({why}): the output layer ranks the whole vocabulary"]


async def _start_engine_processes(
    st: Settings, metrics: ModelMetrics, explicit: set[str], serving: set[str]
) -> LoadedModel:
    """Each decode worker in a child process of its own (its own GIL, its own sessions); this
    process keeps the manifest and the tokenizer for validation and tokenisation."""
    st, batching = in_force(st, explicit, serving, None)
    pool = EnginePool(st, metrics)
    await asyncio.get_running_loop().run_in_executor(None, pool.start_process)
    try:
        manifest, tokenizer = read_export(st, st.precision)
    except Exception:
        pool.shutdown()
        raise
    # The children chose their decoder step by the same rule from the same export.
    graph = choose_graph(manifest, st.precision, pool.provider, st.graph)
    return LoadedModel(pool, manifest, tokenizer, pool.provider, pool.sessions, graph, st, batching)


def _load_with_factory(
    st: Settings, metrics: ModelMetrics, factory: BackendFactory, explicit: set[str], serving: set[str]
) -> LoadedModel:
    """The caller's backend over the export's manifest and tokenizer (no ONNX Runtime session)."""
    st, batching = in_force(st, explicit, serving, None)
    manifest, tokenizer = read_export(st, None)
    try:
        backend = factory(st, metrics, manifest)
    except StartupError:
        raise
    except Exception as e:
        raise ModelLoadError(f"{type(e).__name__}: {e}") from e
    return LoadedModel(
        backend,
        manifest,
        tokenizer,
        str(getattr(backend, "provider", "custom")),
        1,
        str(getattr(backend, "graph", "custom")),
        st,
        batching,
    )


def _load_in_process(st: Settings, metrics: ModelMetrics, explicit: set[str], serving: set[str]) -> LoadedModel:
    """The sessions in this process, decoded by the scheduler's worker threads, with the batching
    values measured on the first one."""
    models = load_models(st)
    manifest = models[0].manifest
    try:
        st, batching = in_force(st, explicit, serving, models[0])
        if batching.costs is not None:  # the measurement's batches freed: their pages back to the kernel
            release_freed_memory()
    except Exception as e:  # a step that fails here would fail every request: the load fails instead
        raise ModelLoadError(f"measuring the decoder step: {type(e).__name__}: {e}") from e
    scheduler = Scheduler(models, st, metrics)
    sessions = len({id(m) for m in models})
    return LoadedModel(
        scheduler, manifest, models[0].tokenizer, models[0].provider, sessions, models[0].graph, st, batching
    )
