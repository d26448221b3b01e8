"""The model versions a server has loaded, and their loads, evictions and unloads (the registry's
lower half; service/repository/registry.py routes requests to them).

Each model version has its own backend (sessions, decode workers, queue and limits) and its own
Engine. Loads and unloads run one at a time. A load that needs room under the memory budget
evicts the least recently used versions first (service/repository/residency.py); an evicted
version stays available, loaded again by its next request. An unload first takes the version out
of routing, then waits for its leases to end, so requests already in flight finish on the
version they started on and none fails."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from service.engine.backend import Backend
from service.engine.engine import Engine
from service.errors import NotFound, quote
from service.metrics import Metrics
from service.repository.layout import VersionDir
from service.repository.residency import MB, Residency, now, rss_bytes
from service.runtime.memory import collect_all, freeze_loaded, heap_in_use_bytes

log = logging.getLogger("mtserve.repository")


@dataclass
class ServedModel:
    """One loaded model version: its engine, the backend under it, and the requests holding it."""

    source: VersionDir
    engine: Engine
    backend: Backend
    provider: str
    graph: str
    sessions: int
    leases: int = 0
    loaded_at: float = field(default_factory=time.time)
    last_used: float = field(default_factory=now)  # the last lease taken (least recently used: evicted first)
    resident_bytes: int = 0  # measured by its load (service/repository/residency.py)

    @property
    def name(self) -> str:
        return self.source.name

    @property
    def version(self) -> str:
        return self.source.version

    @property
    def ref(self) -> str:
        return f"{self.name}:{self.version}"


@dataclass(frozen=True)
class IndexEntry:
    """A row of RepositoryIndex: Triton's states READY, LOADING, UNLOADING, UNAVAILABLE; `residency`
    is mtserve.v1's (ServedModel.state): loaded, loading, unloading, available (loaded on its
    first request), evicted (loaded on its next request) or unloaded (by RepositoryModelLoad only)."""

    name: str
    version: str
    state: str
    reason: str = ""
    residency: str = "unloaded"


Loader = Callable[[VersionDir], Awaitable[ServedModel]]
"""Builds, starts and warms up one version's backend and engine (the server's, which knows the
backends); raises ModelLoadError."""


class LoadedVersions:
    """The loaded versions by (name, version), those available on demand, and the default model."""

    def __init__(
        self,
        repository: Path | None,
        loader: Loader,
        metrics: Metrics,
        unload_timeout_s: float,
        residency: Residency | None = None,
    ):
        self.repository = repository  # None: one model dir, nothing to load from
        self.loader, self.metrics = loader, metrics
        self.unload_timeout_s = unload_timeout_s
        self.residency = residency or Residency(0, lambda source: 0)
        self.available: dict[tuple[str, str], VersionDir] = {}  # not loaded; loaded on a request
        self.evicted: set[tuple[str, str]] = set()  # those of `available` that the budget evicted
        self._waiting: dict[tuple[str, str], int] = {}  # requests waiting for a version's load
        self.served: dict[tuple[str, str], ServedModel] = {}
        self.default_versions: dict[str, str] = {}  # name -> the version a request without one gets
        self.default_name = ""  # the default model; set once a model is loaded, then only on purpose
        self.busy: dict[tuple[str, str], str] = {}  # LOADING / UNLOADING
        self.on_change: Callable[[], Awaitable[None]] | None = None  # after a version is served or no more
        self._change = asyncio.Lock()  # loads and unloads, one at a time
        self._leases_changed = asyncio.Event()
        self._loads: dict[tuple[str, str], asyncio.Task[ServedModel]] = {}  # running on after callers gave up
        self._unloads: set[asyncio.Task] = set()  # running on after their callers gave up

    # -- load, evict and unload ---------------------------------------------------------------

    def set_default(self, served: ServedModel | VersionDir) -> None:
        """Make `served` the default model and its version the name's default version; a change
        of default model is logged and shown by the mtserve_default_model gauge."""
        self.default_versions[served.name] = served.version
        if served.name == self.default_name:
            return
        log.info("default model: %s (was %s)", served.name, self.default_name or "none")
        if self.default_name:
            self.metrics.default_model.labels(self.default_name).set(0)
        self.metrics.default_model.labels(served.name).set(1)
        self.default_name = served.name

    def _unknown(self, name: str, version: str) -> str:
        names = sorted({n for n, _ in self.served})
        if name not in names:
            return f"unknown model {quote(name)} (served: {', '.join(names) or 'none'})"
        versions = sorted((v for n, v in self.served if n == name), key=int)
        return f"model {quote(name)} has no version {quote(version)} loaded (loaded: {', '.join(versions)})"

    def versions(self, name: str) -> list[ServedModel]:
        return sorted((s for (n, _), s in self.served.items() if n == name), key=lambda s: int(s.version))

    def all(self) -> list[ServedModel]:
        return sorted(self.served.values(), key=lambda s: (s.name, int(s.version)))

    async def add(self, source: VersionDir, make_default: bool = False) -> ServedModel:
        """Load one version (or find it loaded) and route to it; the first version of a name is
        its default, and the first name loaded the server's default unless one was set;
        `make_default`: the version becomes the default model.

        The load runs in a task of its own, and callers asking for the same version wait for the
        same task. A caller that stops waiting (its deadline, a cancelled RPC) does not stop it
        half-way, which would leave the half-built sessions' memory in the process with nothing
        served: the load completes and is served (READY in RepositoryIndex), or fails and gives
        its memory back."""
        served = await asyncio.shield(self._load_task(source, make_default))
        if make_default:
            self.set_default(served)
        return served

    def _load_task(self, source: VersionDir, make_default: bool) -> asyncio.Task[ServedModel]:
        key = (source.name, source.version)
        task = self._loads.get(key)
        if task is None:
            task = asyncio.ensure_future(self._add(source, make_default))
            self._loads[key] = task
            task.add_done_callback(functools.partial(self._load_ended, key))
        return task

    def offer(self, source: VersionDir) -> None:
        """List `source` as available, to be loaded by its first request (`use`); the first name
        offered or loaded is the default model unless one was set."""
        key = (source.name, source.version)
        if key in self.served:
            return
        self.available[key] = source
        if not self.default_name:
            self.set_default(source)
        self.default_versions.setdefault(source.name, source.version)

    def _load_ended(self, key: tuple[str, str], task: asyncio.Task[ServedModel]) -> None:
        self._loads.pop(key, None)
        if not task.cancelled() and task.exception() is not None:  # retrieved: its callers may be gone
            log.warning("loading %s:%s failed: %s", key[0], key[1], task.exception())

    async def _add(self, source: VersionDir, make_default: bool) -> ServedModel:
        key = (source.name, source.version)
        async with self._change:
            served = self.served.get(key)
            if served is None:
                await self._make_room(source)
                served = await self._load(source)
                self.served[key] = served
                self.available.pop(key, None)
                self.evicted.discard(key)
                await self._evict(self.residency.over_budget(self.all(), set(self._waiting), key))
            if make_default or not self.default_name:
                self.set_default(served)
            elif source.name not in self.default_versions:
                self.default_versions[source.name] = source.version
            await self._changed()
            return served

    async def _load(self, source: VersionDir) -> ServedModel:
        """Run the loader, measuring the load's time and the memory it took."""
        key = (source.name, source.version)
        self.busy[key] = "LOADING"
        try:
            t0, before, heap_before = time.perf_counter(), rss_bytes(), heap_in_use_bytes()
            served = await self.loader(source)
        except BaseException as e:
            # The series its metrics made (a queue depth of 0...) for a version not served.
            self.metrics.forget_model(source.name, source.version)
            if isinstance(e, Exception):
                self.metrics.model_loads.labels(*key, "failed").inc()
            collect_all()
            raise
        finally:
            del self.busy[key]
        seconds = time.perf_counter() - t0
        freeze_loaded()
        served.resident_bytes = self.residency.record(key, before, rss_bytes(), heap_before, heap_in_use_bytes())
        self.metrics.model_loads.labels(*key, "loaded").inc()
        self.metrics.model_evictions.labels(*key)  # its series from the first load, at 0
        self.metrics.model_load_duration.labels(*key).observe(seconds)
        self.metrics.model_resident_bytes.labels(*key).set(served.resident_bytes)
        log.info("loaded %s from %s in %.1fs (%.1f MB)", served.ref, source.path, seconds, served.resident_bytes / MB)
        return served

    async def _make_room(self, source: VersionDir) -> None:
        """Evict the least recently used versions that `source`'s load needs room from (none
        without a budget); RESOURCE_EXHAUSTED naming the budget when they cannot make enough."""
        await self._evict(self.residency.victims(source, self.all(), set(self._waiting)))

    async def _evict(self, victims: list) -> None:
        if not victims:
            return
        for s in victims:
            log.info(
                "evicting %s (least recently used, %.1f MB) to stay within the memory budget",
                s.ref,
                s.resident_bytes / MB,
            )
            self.metrics.model_evictions.labels(s.name, s.version).inc()
        del s  # _retire holds the victims' last references (it empties `victims`)
        await self._retire(victims, evicted=True)

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()

    async def unload(self, name: str, version: str = "") -> list[str]:
        """RepositoryModelUnload: one version, or every version of `name`. Routing stops at once;
        the backend stops once the requests holding it are answered. A caller that stops waiting
        (its deadline, a cancelled RPC) does not stop the unload half-way, which would leave the
        version out of routing with its backend running: it finishes in a task of its own."""
        task = asyncio.ensure_future(self._unload(name, version))
        self._unloads.add(task)
        task.add_done_callback(self._unloads.discard)
        return await asyncio.shield(task)

    async def _unload(self, name: str, version: str) -> list[str]:
        async with self._change:
            doomed = [s for s in self.versions(name) if not version or s.version == version]
            offered = [k for k in self.available if k[0] == name and (not version or k[1] == version)]
            for key in offered:  # no longer loaded on demand either
                del self.available[key]
                self.evicted.discard(key)
            if not doomed and offered:
                return [f"{n}:{v}" for n, v in offered]
            if not doomed:
                raise NotFound(f"model_name: {self._unknown(name, version)}")
            return await self._retire(doomed)

    async def _retire(self, doomed: list[ServedModel], evicted: bool = False) -> list[str]:
        """Take `doomed` (versions of one name, or evicted ones) out of routing, then stop each
        once its leases end; evicted ones stay available, loaded again on their next request
        (their name keeps its default version)."""
        for s in doomed:
            del self.served[(s.name, s.version)]
            self.busy[(s.name, s.version)] = "UNLOADING"
            if evicted:
                self.available[(s.name, s.version)] = s.source
                self.evicted.add((s.name, s.version))
        for name in [] if evicted else sorted({s.name for s in doomed}):
            left = self.versions(name)
            if not left:
                self.default_versions.pop(name, None)
                if name == self.default_name:
                    log.warning(
                        "the default model %s is unloaded: requests that name no model get UNAVAILABLE "
                        "until it is loaded again",
                        name,
                    )
            elif self.default_versions.get(name) not in {s.version for s in left}:
                self.default_versions[name] = left[-1].version
        await self._changed()
        refs = [s.ref for s in doomed]
        try:
            for s in doomed:
                await self._stop(s)
        finally:
            for s in doomed:
                self.busy.pop((s.name, s.version), None)
        # The last references to the sessions go here (the caller's list too: an eviction's
        # victims, which would otherwise be freed only after the trim, and the load that the
        # eviction made room for would come on top of them); then the heap's free pages go back
        # to the kernel, so the process returns to the footprint of what is still loaded.
        doomed.clear()
        del s
        collect_all()
        return refs

    async def _stop(self, served: ServedModel) -> None:
        end = time.monotonic() + self.unload_timeout_s
        while served.leases and time.monotonic() < end:
            self._leases_changed.clear()
            try:
                await asyncio.wait_for(self._leases_changed.wait(), max(0.0, end - time.monotonic()))
            except TimeoutError:
                break
        if served.leases:
            log.warning(
                "%s: %d requests still held it after %.0fs; stopping it",
                served.ref,
                served.leases,
                self.unload_timeout_s,
            )
        backend = served.backend
        backend.stop_accepting()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, backend.wait_idle, max(0.0, end - time.monotonic()))
        await loop.run_in_executor(None, backend.shutdown)
        self.metrics.forget_model(served.name, served.version)
