"""The models a server serves, by name and version: routing, the default model, and loading and
unloading while requests run (KServe's repository extension).

The default model is a name: the operator's (MTSERVE_DEFAULT_MODEL), else the first model loaded,
or the last one loaded with `default: true`. It never moves to another model on its own: while it
is unloaded, a request that names no model (and no language pair that another model serves) gets
UNAVAILABLE naming it, until it is loaded again.

Each model version has its own backend (sessions, decode workers, queue and limits) and its own
Engine. A request takes a lease on the version it resolves to, and holds it until its answer is
written; an unload first takes the version out of routing, then waits for its leases to end, so
requests already in flight finish on the version they started on and none fails. Loads and
unloads run one at a time. Knows nothing of gRPC.

On demand (`use`): a version that is available but not loaded (NAME/serving.json's "load":
"on_demand", one that did not fit the memory budget at start, one evicted) is loaded by the first
request that names it; requests arriving meanwhile wait for the same load within their deadlines.
A load that needs room under the budget evicts the least recently used loaded versions first
(service/repository/residency.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from service.engine.backend import Backend
from service.engine.engine import Engine
from service.engine.languages import LanguagePair
from service.errors import DeadlineExceeded, FailedPrecondition, ModelLoadError, NotFound, Unavailable, quote
from service.metrics import Metrics
from service.repository.layout import VersionDir, parse_model_ref, scan
from service.repository.residency import MB, Residency, now, rss_bytes
from service.runtime.memory import collect_all, freeze_loaded

log = logging.getLogger("mtserve.repository")

# UTF-8 bytes of what the served models serve in a NOT_FOUND for a language pair, before "…".
LISTED_MESSAGE_BYTES = 900


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


class ModelRegistry:
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

    # -- routing ----------------------------------------------------------------------------

    def resolve(self, ref: str, field: str = "model", pair: LanguagePair = LanguagePair()) -> ServedModel:
        """The model version `ref` ('NAME', 'NAME:VERSION', or empty for the default) names; with
        `ref` empty and a language `pair`, the default model if it serves the pair, else the first
        served one that does (by name and version). A pair that the model (named or found) does
        not serve: NOT_FOUND naming the pair's fields (beside `field`: request.source_language...).
        `ref` empty while the default model is not loaded: UNAVAILABLE naming it."""
        name, version = parse_model_ref(ref, field)
        if not name and pair:
            return self._by_pair(pair, field)
        name = name or self._loaded_default(field)
        if not version:
            version = self.default_versions.get(name, "")
        served = self.served.get((name, version))
        if served is None:
            raise NotFound(f"{field}: {self._unknown(name, version)}")
        langs = served.engine.languages
        if pair and not langs.serves(pair):
            fields = self._pair_fields(field, pair)
            raise NotFound(
                f"{fields}: model {served.ref} does not translate {pair}: {langs.why_not(pair)} "
                f"(it serves {langs.describe()})"
            )
        return served

    @staticmethod
    def _pair_fields(field: str, pair: LanguagePair) -> str:
        """The request's language fields, beside its model field `field` ("model", "request.model";
        KServe's "model_name" has them as parameters): both, but for a call without a target
        language (Encode, `LanguagePair.encoding`) the source language alone."""
        prefix = field[: -len("model")] if field.endswith("model") else "parameters."
        if pair.encoding:
            return f"{prefix}source_language"
        return f"{prefix}source_language/{prefix}target_language"

    def routable(self) -> list[ServedModel]:
        """The versions a request that names no model is routed to by its language pair, in the
        order they are tried: the default model, then each other name's default version."""
        default = self.default_or_none()
        return ([default] if default is not None else []) + [
            s for s in self.all() if s is not default and self.default_versions.get(s.name) == s.version
        ]

    def _by_pair(self, pair: LanguagePair, field: str) -> ServedModel:
        candidates = self.routable()
        for served in candidates:
            if served.engine.languages.serves(pair):
                return served
        raise NotFound(
            f"{self._pair_fields(field, pair)}: no served model translates {pair} (served: {_served_languages(candidates)})"
        )

    def _loaded_default(self, field: str) -> str:
        """The default model's name; UNAVAILABLE while it is not loaded (never another model)."""
        if any(n == self.default_name for n, _ in self.served):
            return self.default_name
        served = ", ".join(sorted({n for n, _ in self.served})) or "none"
        if not self.default_name:
            raise Unavailable(f"{field}: no model is loaded, so there is no default model (served: {served})")
        raise Unavailable(
            f"{field}: the default model {self.default_name!r} is not loaded; name a model (served: {served}) "
            "or load the default again"
        )

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

    @contextmanager
    def lease(self, ref: str, field: str = "model", pair: LanguagePair = LanguagePair()) -> Iterator[ServedModel]:
        """Hold the model version that `ref` and the language `pair` pick (`resolve`) for one
        request: an unload waits for it."""
        served = self.resolve(ref, field, pair)
        served.leases += 1
        served.last_used = now()
        try:
            yield served
        finally:
            served.leases -= 1
            self._leases_changed.set()

    @asynccontextmanager
    async def use(
        self, ref: str, field: str = "model", pair: LanguagePair = LanguagePair(), timeout: float | None = None
    ) -> AsyncIterator[ServedModel]:
        """`lease`, loading the version `ref` names first when it is available but not loaded.
        The load is shared with the other requests waiting for it; DEADLINE_EXCEEDED when
        `timeout` passes first (the load goes on), FAILED_PRECONDITION with the reason when it
        fails (the version stays available: the next request tries again), RESOURCE_EXHAUSTED
        when it does not fit the memory budget. The version cannot be evicted between its load
        and the lease."""
        key = self._unloaded(ref, field)
        if key is None:
            with self.lease(ref, field, pair) as served:
                yield served
            return
        self._waiting[key] = self._waiting.get(key, 0) + 1
        waiting = True
        try:
            await self._load_within(key, field, timeout)
            with self.lease(ref, field, pair) as served:
                waiting = self._unwait(key)
                yield served
        finally:
            if waiting:
                self._unwait(key)

    def _unwait(self, key: tuple[str, str]) -> bool:
        self._waiting[key] -= 1
        if not self._waiting[key]:
            del self._waiting[key]
        return False

    def _unloaded(self, ref: str, field: str) -> tuple[str, str] | None:
        """The available version that `ref` names (by name: the name's default version, else its
        latest available one), when it is not loaded; None otherwise (`resolve` answers)."""
        name, version = parse_model_ref(ref, field)
        name = name or self.default_name
        version = version or self.default_versions.get(name, "")
        if version:
            key = (name, version)
            return key if key in self.available and key not in self.served else None
        if any(n == name for n, _ in self.served):
            return None
        found = sorted((v for n, v in self.available if n == name), key=int)
        return (name, found[-1]) if found else None

    async def _load_within(self, key: tuple[str, str], field: str, timeout: float | None) -> None:
        source = self.available[key]
        try:
            await asyncio.wait_for(asyncio.shield(self._load_task(source, False)), timeout)
        except TimeoutError:
            raise DeadlineExceeded(
                f"{field}: the deadline passed while {key[0]}:{key[1]} was loading on demand "
                "(the load goes on: a later request finds it loaded)"
            ) from None
        except ModelLoadError as e:
            raise FailedPrecondition(f"{field}: {key[0]}:{key[1]} cannot be loaded: {e}") from e

    def default(self) -> ServedModel:
        return self.resolve("")

    def default_or_none(self) -> ServedModel | None:
        """The default model's default version, None while it is not loaded."""
        return self.served.get((self.default_name, self.default_versions.get(self.default_name, "")))

    def versions(self, name: str) -> list[ServedModel]:
        return sorted((s for (n, _), s in self.served.items() if n == name), key=lambda s: int(s.version))

    def all(self) -> list[ServedModel]:
        return sorted(self.served.values(), key=lambda s: (s.name, int(s.version)))

    # -- the repository ---------------------------------------------------------------------

    def index(self) -> list[IndexEntry]:
        """Every version on disk and every one served, with its state."""
        entries: dict[tuple[str, str], IndexEntry] = {}
        if self.repository is not None:
            for name, versions in scan(self.repository).items():
                for v in versions:
                    entries[(name, v.version)] = IndexEntry(name, v.version, "UNAVAILABLE", "unloaded")
        budget = f"memory_budget_mb={self.residency.budget_mb}"
        for key in self.available:
            reason, residency = "available: loaded on its first request", "available"
            if key in self.evicted:
                reason, residency = f"evicted (least recently used, {budget}): loaded on its next request", "evicted"
            entries[key] = IndexEntry(key[0], key[1], "UNAVAILABLE", reason, residency)
        for key, served in self.served.items():
            entries[key] = IndexEntry(served.name, served.version, "READY", residency="loaded")
        for key, state in self.busy.items():
            entries[key] = IndexEntry(key[0], key[1], state, residency=state.lower())
        return sorted(entries.values(), key=lambda e: (e.name, int(e.version)))

    def _on_disk(self, name: str, version: str, field: str) -> VersionDir:
        if self.repository is None:
            raise FailedPrecondition(f"{field}: this server serves one model directory, not a repository")
        found = scan(self.repository)
        if name not in found:
            raise NotFound(f"{field}: {quote(name)} is not in the repository (found: {', '.join(found) or 'none'})")
        versions = found[name]
        match = [v for v in versions if v.version == version] if version else versions[-1:]
        if not match:
            have = ", ".join(v.version for v in versions)
            raise NotFound(f"{field}: {quote(name)} has no version {quote(version)} in the repository (found: {have})")
        return match[0]

    # -- load and unload --------------------------------------------------------------------

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
            t0, before = time.perf_counter(), rss_bytes()
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
        served.resident_bytes = self.residency.record(key, before, rss_bytes())
        self.metrics.model_loads.labels(*key, "loaded").inc()
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
        await self._retire(victims, evicted=True)

    async def _changed(self) -> None:
        if self.on_change is not None:
            await self.on_change()

    async def load(self, name: str, version: str = "", make_default: bool = False) -> ServedModel:
        """RepositoryModelLoad: the version from disk (the latest when none is named). One that
        cannot be loaded (no export, a corrupt graph, a checksum mismatch) is FAILED_PRECONDITION
        with the reason, which the caller needs to fix it (not an INTERNAL that hides it)."""
        source = self._on_disk(name, version, "model_name")
        try:
            return await self.add(source, make_default)
        except ModelLoadError as e:
            raise FailedPrecondition(f"model_name: {source.name}:{source.version} cannot be loaded: {e}") from e

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
        # The last references to the sessions go here; then the heap's free pages go back to
        # the kernel, so the process returns to the footprint of what is still loaded.
        del doomed, s
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

    # -- the whole server -------------------------------------------------------------------

    def stop_accepting(self) -> None:
        for s in self.served.values():
            s.backend.stop_accepting()

    def wait_idle(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        return all(s.backend.wait_idle(max(0.0, end - time.monotonic())) for s in list(self.served.values()))

    def shutdown(self) -> None:
        for task in list(self._loads.values()):
            task.cancel()
        for s in list(self.served.values()):
            s.backend.shutdown()


def _served_languages(models: list[ServedModel], limit: int = LISTED_MESSAGE_BYTES) -> str:
    """What each of `models` serves: the pairs of one-pair models ("de->en (de-en:1)"), a
    multilingual model's languages ("m2m:1: 8 languages to 8: cs, de, ..."), cut with "…" and how
    many models there are before the text passes `limit` UTF-8 bytes."""
    shown: list[str] = []
    size = 0
    for s in models:
        langs = s.engine.languages
        if langs.multilingual:
            parts = [f"{s.ref}: {langs.describe()}"]
        else:
            parts = [f"{a}->{b} ({s.ref})" for a, b in langs.pairs]
        for part in parts:
            size += len(part.encode("utf-8")) + 2
            if size > limit:
                return "; ".join(shown) + f"; … ({len(models)} models in all)"
            shown.append(part)
    return "; ".join(shown) or "none"
