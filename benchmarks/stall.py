"""Whether one client can stall a real `mtserve serve` process on loopback (docs/security.md).

    python -m benchmarks.stall --model-dir models/de-en/1 --seconds 20

1. Idle: Health and a one-sentence Translate called back to back, their latencies; the
   server's resident memory (RSS) once warm.
2. Flood: three clients send the worst requests back to back for `--seconds`: ten texts of
   100 kB of sentence openers (`("x Der " * 16667)[:100000]`, 1 MB), forty texts of 25,000
   short sentences (`"Ja. " * 25000`, 4 MB: past max_request_bytes) and one message of 5 MB
   (past max_receive_message_bytes), while the probe goes on calling Health and the small
   Translate. Each request's status is counted. `--flood openers,short,huge` picks the clients.
   The flooding clients run in a process of their own (`--clients process`, the default), so that
   the probe's latencies are the server's and not waits for its own process's GIL; on a machine
   whose cores the clients share with the server, `--clients-nice 19` gives the server the cores
   as clients on other machines would. `--clients threads` runs them as threads of the probe's
   process.
3. A request the server accepts and cannot finish in time (two texts of 97 and 48 kB of prose,
   1,650 sentences) with a 2 s deadline: when it is answered, and how long the server's CPU
   takes to fall idle (under 10% of a core over 100 ms) after.
4. RSS a few seconds after the flood (before step 3), and a few seconds after step 3 (whose
   decoding grows the heap that the server keeps for reuse), against the idle level.

One JSON line on stdout (and `--json FILE`): latencies in seconds (p50, p99, max, n), status
counts, the deadline call's answer time and the CPU's time to idle, RSS in MB. Only 127.0.0.1 is
contacted; every loop ends by itself."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import threading
import time
from collections import Counter
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.figures import print_result
from benchmarks.processes import Server, process_cpu_s
from benchmarks.soak import percentiles, rss_bytes
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
OPENERS = ("x Der " * 16667)[:100000]
SHORT = "Ja. " * 25000
PROSE = "Ein Mann mit einem roten Hut spielt auf der Straße Gitarre, während Kinder zuhören. " * 1100  # 96,800 bytes
SMALL = pb.TranslateRequest(texts=["Ein Hund rennt durch den Schnee."], options=pb.TranslationOptions(beam_size=1))
CHANNEL = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", 64 << 20)]


def probe(address: str, until: threading.Event | float) -> tuple[list[float], list[float]]:
    """Health and the small Translate back to back until `until` (an event set, or a number of
    rounds): their latencies."""
    health, small = [], []
    with grpc.insecure_channel(address, CHANNEL) as ch:
        h, t = health_pb2_grpc.HealthStub(ch), pb_grpc.TranslationServiceStub(ch)
        rounds = 0
        while not (until.is_set() if isinstance(until, threading.Event) else rounds >= until):
            start = time.perf_counter()
            h.Check(health_pb2.HealthCheckRequest(service=""), timeout=60)
            health.append(time.perf_counter() - start)
            start = time.perf_counter()
            t.Translate(SMALL, timeout=60)
            small.append(time.perf_counter() - start)
            rounds += 1
            time.sleep(0.005)
    return health, small


def flood(address: str, request: bytes, stop: threading.Event, codes: Counter[str]) -> None:
    """`request` (a serialised TranslateRequest, serialised once: the client's CPU is not what is
    measured) back to back until `stop`, each answer's status counted."""
    with grpc.insecure_channel(address, CHANNEL) as ch:
        translate = ch.unary_unary("/mtserve.v1.TranslationService/Translate")
        while not stop.is_set():
            try:
                translate(request, timeout=120)
                codes["OK"] += 1
            except grpc.RpcError as e:
                codes[f"{e.code().name}: {(e.details() or '')[:80]}"] += 1


def flood_clients(address: str, kinds: list[str], seconds: float, nice: int, ready, done) -> None:
    """In a process of its own (`--clients process`): one `flood` thread per kind for `seconds`,
    at `nice`; `ready` set once the requests are built, the status counts put on `done`."""
    if nice:
        os.nice(nice)
    worst = [worst_request(k) for k in kinds]
    stop, codes = threading.Event(), Counter[str]()
    clients = [threading.Thread(target=flood, args=(address, r, stop, codes)) for r in worst]
    ready.set()
    for c in clients:
        c.start()
    time.sleep(seconds)
    stop.set()
    for c in clients:
        c.join()
    done.put(dict(codes))


def worst_request(kind: str) -> bytes:
    """The serialised request of a flooding client: openers (1 MB), short (4 MB), huge (5 MB)."""
    texts = {"openers": [OPENERS] * 10, "short": [SHORT] * 40, "huge": ["Ja. " * 1_250_000]}[kind]
    return pb.TranslateRequest(texts=texts).SerializeToString()


def deadline_call(address: str, pid: int) -> dict:
    """Two texts of prose with a 2 s deadline: the status, when it came, and the time from then
    to a server CPU under 10% of a core (sampled every 100 ms)."""
    with grpc.insecure_channel(address, CHANNEL) as ch:
        stub = pb_grpc.TranslationServiceStub(ch)
        start = time.perf_counter()
        try:
            stub.Translate(pb.TranslateRequest(texts=[PROSE, PROSE[: len(PROSE) // 2]]), timeout=2.0)
            code = "OK"
        except grpc.RpcError as e:
            code = e.code().name
        answered = time.perf_counter()
    idle_after = None
    cpu, at = process_cpu_s(pid), time.perf_counter()
    while time.perf_counter() - answered < 30:
        time.sleep(0.1)
        cpu2, at2 = process_cpu_s(pid), time.perf_counter()
        if (cpu2 - cpu) / (at2 - at) < 0.1:
            idle_after = round(at - answered, 3)
            break
        cpu, at = cpu2, at2
    return {"status": code, "answered_s": round(answered - start, 3), "cpu_idle_after_s": idle_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=str(REPO / "models" / "de-en" / "1"))
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the flood")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument(
        "--flood",
        default="openers,short,huge",
        help="the flooding clients, one per name: openers (1 MB), short (4 MB), huge (5 MB message)",
    )
    parser.add_argument(
        "--clients",
        choices=["process", "threads"],
        default="process",
        help="the flooding clients in a process of their own (default), or as threads of the probe's",
    )
    parser.add_argument(
        "--clients-nice", type=int, default=0, help="the nice value of the flooding clients' process (0 to 19)"
    )
    parser.add_argument("--server-arg", action="append", default=[], help="a flag for mtserve serve (repeatable)")
    parser.add_argument(
        "--server-env", action="append", default=[], help="KEY=VALUE in the server's environment (repeatable)"
    )
    args = parser.parse_args()
    env = dict(kv.split("=", 1) for kv in args.server_env)
    flags = ["--decode-workers", "1", *args.server_arg]
    with Server(args.model_dir, flags, env=env, log_prefix="mtserve-stall-") as server:
        probe(server.address, 20)  # warm-up
        idle_health, idle_small = probe(server.address, 200)
        rss_before = rss_bytes(server.pid)
        stop, codes = threading.Event(), Counter[str]()
        kinds = args.flood.split(",")
        if args.clients == "threads":
            worst = [worst_request(k) for k in kinds]
            clients = [threading.Thread(target=flood, args=(server.address, r, stop, codes)) for r in worst]
            for c in clients:
                c.start()
            threading.Timer(args.seconds, stop.set).start()
        else:
            ctx = multiprocessing.get_context("spawn")  # no gRPC state forked from the probe's
            ready, done = ctx.Event(), ctx.Queue()
            flooder = ctx.Process(
                target=flood_clients, args=(server.address, kinds, args.seconds, args.clients_nice, ready, done)
            )
            flooder.start()
            ready.wait(60)
            threading.Timer(args.seconds, stop.set).start()
        peak = [rss_before]
        sampler = threading.Thread(target=sample_rss, args=(server.pid, stop, peak))
        sampler.start()
        flood_health, flood_small = probe(server.address, stop)
        if args.clients == "threads":
            for c in clients:
                c.join()
        else:
            codes.update(done.get(timeout=180))
            flooder.join()
        sampler.join()
        time.sleep(3.0)
        rss_after_flood = rss_bytes(server.pid)
        deadline = deadline_call(server.address, server.pid)
        time.sleep(3.0)
        rss_after = rss_bytes(server.pid)
    idle_p99 = percentiles(idle_small)["p99"]
    result = {
        "benchmark": "stall",
        "model_dir": args.model_dir,
        "server_args": flags,
        "server_env": env,
        "flood_seconds": args.seconds,
        "flood_clients": args.flood.split(","),
        "clients": args.clients if args.clients == "threads" else f"process, nice {args.clients_nice}",
        "idle": {"health": percentiles(idle_health), "small_translate": percentiles(idle_small)},
        "flood": {"health": percentiles(flood_health), "small_translate": percentiles(flood_small)},
        "flood_statuses": dict(codes),
        "small_translate_p99_vs_idle": round(percentiles(flood_small)["p99"] / idle_p99, 2),
        "deadline_2s": deadline,
        "rss_mb": {
            "before": round(rss_before / 2**20, 1),
            "peak": round(peak[0] / 2**20, 1),
            "after_flood": round(rss_after_flood / 2**20, 1),
            "after": round(rss_after / 2**20, 1),
            "after_vs_before": round(rss_after / rss_before, 3),
        },
    }
    print_result(result, args.json)


def sample_rss(pid: int, stop: threading.Event, peak: list[int]) -> None:
    """The largest RSS of `pid` in `peak[0]`, sampled every 200 ms until `stop`."""
    while not stop.wait(0.2):
        peak[0] = max(peak[0], rss_bytes(pid))


if __name__ == "__main__":
    main()
