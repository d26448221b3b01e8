"""Models loaded on demand and evicted least recently used under a memory budget, over a real gRPC
server on loopback with real ONNX Runtime sessions: a model marked "on_demand" in its
serving.json is listed (GetModelInfo's state, RepositoryIndex's reason) and loaded by its first
request; requests arriving during a load wait for the one load; a deadline that passes during a
load is DEADLINE_EXCEEDED and the load goes on; a failed load answers with its reason and the next
request loads again; under a budget the least recently used versions are evicted, never one with
a request in flight (RESOURCE_EXHAUSTED naming the budget); the metrics of loads, evictions,
resident bytes and load time.

The repository is the tiny test model three times (tiny-a, tiny-b, tiny-c, each version 1 a link
to the same model directory). In the budget tests the process's RSS is read from a counter that
each load raises by 100 MB (`sized_loads`), so that each version measures exactly 100 MB and the
eviction order does not hang on what else the test process allocates; the on-demand tests read
the real RSS."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from service.api.inference import grpc_service_pb2 as kpb
from service.api.inference import grpc_service_pb2_grpc as kpb_grpc
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.errors import DeadlineExceeded, ModelLoadError
from service.repository import loader as loader_module
from service.repository import versions as versions_module

TEXT = "Ein Hund rennt durch den Schnee."
MODEL_MB = 100


def make_repository(root: Path, model_dir: Path, on_demand: tuple[str, ...]) -> Path:
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        (root / name).mkdir()
        (root / name / "1").symlink_to(model_dir, target_is_directory=True)
        if name in on_demand:
            (root / name / "serving.json").write_text(json.dumps({"load": "on_demand"}))
    return root


def serve(make_server, repository: Path, **settings):
    return make_server(model_dir=None, onnx_dir=None, model_repository=repository, **settings)


def measured_loads(monkeypatch, grows: str) -> None:
    """Each load raises by MODEL_MB what the registry reads as `grows` ("rss_bytes" or
    "heap_in_use_bytes"); the other stays where it was."""
    counters = {"rss_bytes": [1 << 30], "heap_in_use_bytes": [1 << 30]}
    load = loader_module.ModelLoader.load

    async def measured(self, source):
        served = await load(self, source)
        counters[grows][0] += MODEL_MB << 20
        return served

    monkeypatch.setattr(loader_module.ModelLoader, "load", measured)
    for name, counter in counters.items():
        monkeypatch.setattr(versions_module, name, lambda counter=counter: counter[0])


@pytest.fixture()
def sized_loads(monkeypatch):
    """Each load raises the RSS the registry reads by MODEL_MB."""
    measured_loads(monkeypatch, "rss_bytes")


@pytest.fixture()
def reused_loads(monkeypatch):
    """Each load takes MODEL_MB from the allocator, and the RSS the registry reads stays where it
    was: the load reuses memory that an earlier unload freed and the allocator kept."""
    measured_loads(monkeypatch, "heap_in_use_bytes")


def slow_loads(monkeypatch, seconds: float, failing: str = "") -> list[str]:
    """Every load sleeps `seconds` first; the first load of the version `failing` names fails.
    Returns the loads' refs."""
    load = loader_module.ModelLoader.load
    started: list[str] = []

    async def slow(self, source):
        ref = f"{source.name}:{source.version}"
        started.append(ref)
        await asyncio.sleep(seconds)
        if ref == failing and started.count(ref) == 1:
            raise ModelLoadError("tiny.onnx: injected failure")
        return await load(self, source)

    monkeypatch.setattr(loader_module.ModelLoader, "load", slow)
    return started


def translate(srv, model: str, timeout: float = 60.0, **kw) -> pb.TranslateResponse:
    with grpc.insecure_channel(srv.address) as ch:
        return pb_grpc.TranslationServiceStub(ch).Translate(
            pb.TranslateRequest(texts=[TEXT], model=model, **kw), timeout=timeout
        )


def refused(fn) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value.code(), e.value.details()


def states(srv, model: str = "tiny-a") -> dict[str, str]:
    """GetModelInfo's state of each version, by name (asking about `model`, a request to it)."""
    with grpc.insecure_channel(srv.address) as ch:
        info = pb_grpc.TranslationServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest(model=model), timeout=60)
    return {m.name: m.state for m in info.models}


def index(srv) -> dict[str, tuple[str, str]]:
    with grpc.insecure_channel(srv.address) as ch:
        rows = kpb_grpc.GRPCInferenceServiceStub(ch).RepositoryIndex(kpb.RepositoryIndexRequest(), timeout=30).models
    return {m.name: (m.state, m.reason) for m in rows if not m.name.endswith("-encoder")}


def sample(srv, name: str, **labels: str) -> float:
    value = srv.server.metrics.registry.get_sample_value(name, labels)
    return value or 0.0


def test_an_on_demand_model_is_listed_then_loaded_by_its_first_request(make_server, tmp_path, tiny_onnx_dir):
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-b",))
    srv = serve(make_server, repo, models="tiny-a,tiny-b")
    assert set(srv.server.models.served) == {("tiny-a", "1")}
    assert states(srv) == {"tiny-a": "loaded", "tiny-b": "available"}
    assert index(srv)["tiny-b"] == ("UNAVAILABLE", "available: loaded on its first request")
    with grpc.insecure_channel(srv.address) as ch:  # KServe: listed, not ready until loaded
        stub = kpb_grpc.GRPCInferenceServiceStub(ch)
        assert not stub.ModelReady(kpb.ModelReadyRequest(name="tiny-b"), timeout=30).ready

    assert translate(srv, "tiny-b").model == "tiny-b:1"
    assert states(srv) == {"tiny-a": "loaded", "tiny-b": "loaded"}
    assert index(srv)["tiny-b"] == ("READY", "")
    b = srv.server.models.served[("tiny-b", "1")]
    assert b.resident_bytes > 0  # its sessions are in memory
    with grpc.insecure_channel(srv.address) as ch:
        info = pb_grpc.TranslationServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest(model="tiny-b"), timeout=60)
    assert {m.name: m.resident_bytes for m in info.models}["tiny-b"] == b.resident_bytes
    assert sample(srv, "mtserve_model_resident_bytes", model="tiny-b", version="1") == b.resident_bytes
    assert sample(srv, "mtserve_model_loads_total", model="tiny-b", version="1", outcome="loaded") == 1
    assert sample(srv, "mtserve_model_load_duration_seconds_count", model="tiny-b", version="1") == 1
    assert sample(srv, "mtserve_model_evictions_total", model="tiny-b", version="1") == 0


def test_requests_during_a_load_wait_for_it_within_their_deadlines(make_server, tmp_path, tiny_onnx_dir, monkeypatch):
    """Eight requests arrive while tiny-b loads (for 1.5 s at least): one load, all answered;
    one with a 0.3 s deadline gets DEADLINE_EXCEEDED and the load goes on."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-b",))
    loads = slow_loads(monkeypatch, 1.5)
    srv = serve(make_server, repo, models="tiny-a,tiny-b")
    assert loads == ["tiny-a:1"]
    with ThreadPoolExecutor(8) as pool:
        waiting = [pool.submit(translate, srv, "tiny-b") for _ in range(8)]
        time.sleep(0.2)
        assert states(srv)["tiny-b"] == "loading"
        assert index(srv)["tiny-b"][0] == "LOADING"
        code, message = refused(lambda: translate(srv, "tiny-b", timeout=0.3))
        assert all(f.result(60).model == "tiny-b:1" for f in waiting)
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert loads == ["tiny-a:1", "tiny-b:1"]  # one load for all of them
    assert sample(srv, "mtserve_model_loads_total", model="tiny-b", version="1", outcome="loaded") == 1


def test_a_deadline_during_a_load_and_the_load_goes_on(make_server, tmp_path, tiny_onnx_dir, monkeypatch):
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-b",))
    loads = slow_loads(monkeypatch, 1.0)
    srv = serve(make_server, repo, models="tiny-a,tiny-b")
    code, message = refused(lambda: translate(srv, "tiny-b", timeout=0.5))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = time.monotonic() + 30
    while ("tiny-b", "1") not in srv.server.models.served and time.monotonic() < deadline:
        time.sleep(0.05)
    assert states(srv)["tiny-b"] == "loaded"
    assert translate(srv, "tiny-b").model == "tiny-b:1"
    assert loads == ["tiny-a:1", "tiny-b:1"]


def test_the_registry_answers_deadline_exceeded_naming_the_load(make_server, tmp_path, tiny_onnx_dir, monkeypatch):
    """The server's own answer (a gRPC client's timer fires at the deadline too): the registry's
    wait for a 2 s load with 0.3 s left, on the server's event loop."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-b",))
    slow_loads(monkeypatch, 2.0)
    srv = serve(make_server, repo, models="tiny-a,tiny-b")

    async def use() -> str:
        try:
            async with srv.server.models.use("tiny-b", "request.model", timeout=0.3):
                return "served"
        except DeadlineExceeded as e:
            return e.message

    assert srv.call(use()) == (
        "request.model: the deadline passed while tiny-b:1 was loading on demand "
        "(the load goes on: a later request finds it loaded)"
    )


def test_a_failed_load_answers_its_reason_and_the_next_request_loads_again(
    make_server, tmp_path, tiny_onnx_dir, monkeypatch
):
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-b",))
    loads = slow_loads(monkeypatch, 0.0, failing="tiny-b:1")
    srv = serve(make_server, repo, models="tiny-a,tiny-b")
    code, message = refused(lambda: translate(srv, "tiny-b"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert message == "model: tiny-b:1 cannot be loaded: tiny.onnx: injected failure"
    assert states(srv)["tiny-b"] == "available"
    assert sample(srv, "mtserve_model_loads_total", model="tiny-b", version="1", outcome="failed") == 1
    assert translate(srv, "tiny-b").model == "tiny-b:1"
    assert loads == ["tiny-a:1", "tiny-b:1", "tiny-b:1"]
    assert sample(srv, "mtserve_model_loads_total", model="tiny-b", version="1", outcome="loaded") == 1


def test_least_recently_used_versions_are_evicted_first(make_server, tmp_path, tiny_onnx_dir, sized_loads):
    """A budget that holds two versions of 100 MB: tiny-a and tiny-b loaded, tiny-a used again,
    then tiny-c evicts tiny-b (the least recently used), and tiny-b then evicts tiny-a."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-a", "tiny-b", "tiny-c"))
    srv = serve(make_server, repo, memory_budget_mb=2 * MODEL_MB + 50)
    assert not srv.server.models.served
    assert {name: state for name, (state, _) in index(srv).items()} == dict.fromkeys(
        ("tiny-a", "tiny-b", "tiny-c"), "UNAVAILABLE"
    )
    translate(srv, "tiny-a")
    translate(srv, "tiny-b")
    translate(srv, "tiny-a")
    assert translate(srv, "tiny-c").model == "tiny-c:1"
    assert {k[0] for k in srv.server.models.served} == {"tiny-a", "tiny-c"}
    assert index(srv)["tiny-b"] == (
        "UNAVAILABLE",
        f"evicted (least recently used, memory_budget_mb={2 * MODEL_MB + 50}): loaded on its next request",
    )
    assert translate(srv, "tiny-b").model == "tiny-b:1"  # tiny-a was used before tiny-c
    assert {k[0] for k in srv.server.models.served} == {"tiny-b", "tiny-c"}
    assert states(srv, "tiny-c") == {"tiny-a": "evicted", "tiny-b": "loaded", "tiny-c": "loaded"}
    evictions = {n: sample(srv, "mtserve_model_evictions_total", model=n, version="1") for n in ("tiny-a", "tiny-b")}
    assert evictions == {"tiny-a": 1, "tiny-b": 1}
    assert sample(srv, "mtserve_model_loads_total", model="tiny-b", version="1", outcome="loaded") == 2
    assert sample(srv, "mtserve_model_resident_bytes", model="tiny-a", version="1") == 0  # not resident
    assert sample(srv, "mtserve_model_resident_bytes", model="tiny-b", version="1") == MODEL_MB << 20


def test_a_version_with_a_request_in_flight_is_never_evicted(make_server, tmp_path, tiny_onnx_dir, sized_loads):
    """A budget that holds one version: tiny-b's load while a request runs on tiny-a is
    RESOURCE_EXHAUSTED naming the budget; once the request is answered, tiny-b evicts tiny-a."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-a", "tiny-b", "tiny-c"))
    srv = serve(make_server, repo, memory_budget_mb=MODEL_MB + 50, default_model="tiny-a")
    translate(srv, "tiny-b")  # measured: 100 MB, expected so at its next load
    translate(srv, "tiny-a")  # evicts tiny-b before its load (tiny-a is expected at its files' size)
    assert set(srv.server.models.served) == {("tiny-a", "1")}
    gate = threading.Event()
    srv.intercept_steps(lambda rows: gate.wait(30))  # the default model's backend: tiny-a
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(translate, srv, "tiny-a")
        a = srv.server.models.served[("tiny-a", "1")]
        deadline = time.monotonic() + 10
        while not a.leases and time.monotonic() < deadline:
            time.sleep(0.01)
        code, message = refused(lambda: translate(srv, "tiny-b"))
        gate.set()
        assert held.result(30).model == "tiny-a:1"
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message == (
        f"model: tiny-b:1 (expected {MODEL_MB:.1f} MB) does not fit the memory budget "
        f"(memory_budget_mb={MODEL_MB + 50}): tiny-a:1 ({MODEL_MB:.1f} MB) have requests in flight or "
        "waiting and cannot be evicted"
    )
    assert translate(srv, "tiny-b").model == "tiny-b:1"
    assert set(srv.server.models.served) == {("tiny-b", "1")}


def test_a_budget_full_at_start_leaves_the_rest_available(make_server, tmp_path, tiny_onnx_dir, sized_loads):
    """A budget of 5 MB: the first model loads at start (its files fit), the others are listed."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=())
    srv = serve(make_server, repo, memory_budget_mb=5)
    assert set(srv.server.models.served) == {("tiny-a", "1")}
    assert set(srv.server.models.available) == {("tiny-b", "1"), ("tiny-c", "1")}
    # tiny-b's load needs room: tiny-a (100 MB measured) goes; tiny-b then takes 100 MB alone.
    assert translate(srv, "tiny-b").model == "tiny-b:1"
    assert set(srv.server.models.served) == {("tiny-b", "1")}
    code, message = refused(lambda: translate(srv, "tiny-a"))  # measured: larger than the budget on its own
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert message.endswith("(memory_budget_mb=5): it is larger than the budget on its own")


def test_hot_swap_under_a_budget(make_server, tmp_path, tiny_onnx_dir, sized_loads):
    """RepositoryModelLoad of a second version under a budget for two; the unload of the first."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=())
    (repo / "tiny-a" / "2").symlink_to(tiny_onnx_dir.parent, target_is_directory=True)
    srv = serve(make_server, repo, models="tiny-a:1", memory_budget_mb=2 * MODEL_MB + 50)
    with grpc.insecure_channel(srv.address) as ch:
        stub = kpb_grpc.GRPCInferenceServiceStub(ch)
        req = kpb.RepositoryModelLoadRequest(model_name="tiny-a")
        req.parameters["version"].string_param = "2"
        stub.RepositoryModelLoad(req, timeout=60)
        assert set(srv.server.models.served) == {("tiny-a", "1"), ("tiny-a", "2")}
        unload = kpb.RepositoryModelUnloadRequest(model_name="tiny-a")
        unload.parameters["version"].string_param = "1"
        stub.RepositoryModelUnload(unload, timeout=60)
    assert set(srv.server.models.served) == {("tiny-a", "2")}
    assert translate(srv, "tiny-a").model == "tiny-a:2"
    assert index(srv)["tiny-a"] == ("READY", "")


def test_a_load_that_reuses_freed_memory_is_measured_by_what_it_allocated(
    make_server, tmp_path, tiny_onnx_dir, reused_loads
):
    """The RSS does not grow (the load reuses freed memory) but the allocator hands out 100 MB: the
    version measures 100 MB, and a budget of one and a half versions holds one, not all three."""
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-a", "tiny-b", "tiny-c"))
    srv = serve(make_server, repo, memory_budget_mb=MODEL_MB + 50)
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        translate(srv, name)
        assert {k[0] for k in srv.server.models.served} == {name}
    assert sample(srv, "mtserve_model_resident_bytes", model="tiny-c", version="1") == MODEL_MB << 20


def test_an_evicted_version_is_freed_when_the_heap_is_trimmed(
    make_server, tmp_path, tiny_onnx_dir, sized_loads, monkeypatch
):
    """Under a budget of one version: tiny-a, then tiny-b (which evicts tiny-a once it has measured
    itself), then tiny-a again, measured before, whose load evicts tiny-b first. When the eviction
    collects and trims the heap, nothing holds tiny-b's served version any more: its memory goes
    back to the kernel before tiny-a's load, instead of staying in the heap on top of it (the
    RSS then rose a version's size over the budget)."""
    import weakref

    evicted: list[weakref.ref] = []
    freed: list[bool] = []  # after each collection and trim, once tiny-b is watched
    collect = versions_module.collect_all

    def watched() -> None:
        collect()
        if evicted:
            freed.append(evicted[0]() is None)

    monkeypatch.setattr(versions_module, "collect_all", watched)
    repo = make_repository(tmp_path, tiny_onnx_dir.parent, on_demand=("tiny-a", "tiny-b", "tiny-c"))
    srv = serve(make_server, repo, memory_budget_mb=MODEL_MB + 50)
    translate(srv, "tiny-a")
    translate(srv, "tiny-b")
    evicted.append(weakref.ref(srv.server.models.served[("tiny-b", "1")]))
    translate(srv, "tiny-a")
    assert {k[0] for k in srv.server.models.served} == {"tiny-a"}
    assert freed == [True]
