"""The models a server serves, by name and version: routing, the default model, and loading and
unloading while requests run (KServe's repository extension).

The default model is a name: the operator's (MTSERVE_DEFAULT_MODEL), else the first model loaded,
or the last one loaded with `default: true`. It never moves to another model on its own: while it
is unloaded, a request that names no model (and no language pair that another model serves) gets
UNAVAILABLE naming it, until it is loaded again.

A request takes a lease on the version it resolves to, and holds it until its answer is written;
an unload waits for the leases to end (the loads, evictions and unloads themselves are in
service/repository/versions.py). Knows nothing of gRPC.

On demand (`use`): a version that is available but not loaded (NAME/serving.json's "load":
"on_demand", one that did not fit the memory budget at start, one evicted) is loaded by the first
request that names it; requests arriving meanwhile wait for the same load within their deadlines.
A load that needs room under the budget evicts the least recently used loaded versions first
(service/repository/residency.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

from service.engine.languages import LanguagePair
from service.errors import DeadlineExceeded, FailedPrecondition, ModelLoadError, NotFound, Unavailable, quote
from service.repository.layout import VersionDir, parse_model_ref, scan
from service.repository.residency import now
from service.repository.versions import IndexEntry, LoadedVersions, Loader, ServedModel

__all__ = ["IndexEntry", "Loader", "ModelRegistry", "ServedModel"]

log = logging.getLogger("mtserve.repository")

# UTF-8 bytes of what the served models serve in a NOT_FOUND for a language pair, before "…".
LISTED_MESSAGE_BYTES = 900


class ModelRegistry(LoadedVersions):
    """Routing requests to the loaded versions, loading on demand, and the repository calls."""

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

    async def load(self, name: str, version: str = "", make_default: bool = False) -> ServedModel:
        """RepositoryModelLoad: the version from disk (the latest when none is named). One that
        cannot be loaded (no export, a corrupt graph, a checksum mismatch) is FAILED_PRECONDITION
        with the reason, which the caller needs to fix it (not an INTERNAL that hides it)."""
        source = self._on_disk(name, version, "model_name")
        try:
            return await self.add(source, make_default)
        except ModelLoadError as e:
            raise FailedPrecondition(f"model_name: {source.name}:{source.version} cannot be loaded: {e}") from e

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
