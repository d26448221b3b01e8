"""Online load against a real `mtserve serve` process on loopback: an async gRPC (grpc.aio) load
generator at fixed concurrency levels, single-sentence Translate requests cycling through the
test sentences.

    python -m benchmarks.online --concurrency 1,8,32,64,128 --beam 4 [--continuous-batching]
        [--api many --streams 1] [--connections 8] [--server-arg=--replicas=2 ...] [--backend ct2]
        [--json out.json]

`--api unary` (the default) sends each sentence as its own Translate call; `--api many` sends the
same single-sentence requests as items of `--streams` long-lived TranslateMany streams (the
concurrency split over them), which saves the per-call cost on both sides. `--backend ct2` loads
the same server decoding with CTranslate2 instead (benchmarks/ct2_server.py: same front, same
flags).

For every level: requests, ok, errors (by status code), seconds, throughput (ok sentences/s and
target tokens/s), latency p50/p95/p99/mean in ms, BLEU of the answers against the references.
Each level starts with a warm-up of 2 x concurrency requests that is not counted. Then it measures
the steady state, as perf_analyzer's windows do: one closed loop of `concurrency` clients sends
concurrency + n + concurrency requests, and the figures are those of the n that finish after the
first `concurrency`, over the time from the last of those finishing to the n-th after it (neither
the clients' start, a burst into an idle server, nor their drain). With `duration` the level is
the requests sent within it, start and drain included. The client runs on the same machine as the
server and uses CPU too (one Python process).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc

from benchmarks.figures import percentile, print_result
from benchmarks.processes import BACKENDS, Server, process_cpu_s
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc
from service.client import STATUS_BY_NUMBER

REPO = Path(__file__).resolve().parent.parent


class ManyStream:
    """One TranslateMany stream shared by several closed-loop workers: `translate` writes an item
    and waits for the answer with its id."""

    def __init__(self, stub: pb_grpc.TranslationServiceStub):
        self.call = stub.TranslateMany()
        self.waiting: dict[str, asyncio.Future] = {}
        self.lock = asyncio.Lock()  # one write at a time on a call
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            async for r in self.call:
                self.waiting.pop(r.id).set_result(r)
        except grpc.aio.AioRpcError as e:
            for f in self.waiting.values():
                f.set_exception(e)

    async def translate(self, id_: str, req: pb.TranslateRequest, timeout: float):
        future = asyncio.get_running_loop().create_future()
        self.waiting[id_] = future
        async with self.lock:
            await self.call.write(pb.TranslateManyRequest(id=id_, request=req, timeout_ms=int(timeout * 1000)))
        r = await future
        if r.HasField("error"):
            code = STATUS_BY_NUMBER.get(r.error.code)
            return code.name if code else "UNKNOWN", None
        return "OK", r.response.translations[0]

    async def close(self) -> None:
        await self.call.done_writing()
        await self.reader


async def _load(
    address: str,
    texts: list[str],
    concurrency: int,
    n_requests: int,
    beam: int,
    timeout: float,
    duration: float | None = None,
    api: str = "unary",
    streams: int = 1,
    connections: int = 1,
    options: dict | None = None,
    fields: dict | None = None,
) -> dict:
    # A subchannel pool of each channel's own: channels with the same arguments would otherwise share
    # one connection, and a server's replicas (SO_REUSEPORT) are spread by connection.
    opts = [("grpc.max_receive_message_length", 16 * 1024 * 1024), ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(address, options=opts) for _ in range(max(1, min(connections, concurrency)))]
    try:
        stubs = [pb_grpc.TranslationServiceStub(ch) for ch in channels]
        request_options = pb.TranslationOptions(beam_size=beam, **(options or {}))
        n_streams = min(streams, concurrency) if api == "many" else 0
        many = [ManyStream(stubs[k % len(stubs)]) for k in range(n_streams)]

        async def one(i: int, w: int):
            req = pb.TranslateRequest(texts=[texts[i % len(texts)]], options=request_options, **(fields or {}))
            t = time.perf_counter()
            try:
                if many:
                    code, translation = await many[i % len(many)].translate(str(i), req, timeout)
                    return i, time.perf_counter() - t, code, translation
                resp = await stubs[w % len(stubs)].Translate(req, timeout=timeout)
                return i, time.perf_counter() - t, "OK", resp.translations[0]
            except grpc.aio.AioRpcError as e:
                return i, time.perf_counter() - t, e.code().name, None

        finished_at: list[float] = []  # drive's results are in the order they finished, these when

        async def drive(start: int, count: int, until: float | None = None) -> list:
            counter = iter(range(start, start + count))
            results = []
            finished_at.clear()

            async def worker(w: int):  # a closed-loop client on connection w % connections
                for i in counter:
                    results.append(await one(i, w))
                    finished_at.append(time.perf_counter())
                    if until is not None and time.perf_counter() > until:
                        break

            await asyncio.gather(*(worker(w) for w in range(concurrency)))
            return results

        await drive(0, 2 * concurrency)  # warm-up: connections, batches at this concurrency
        if duration is not None:
            t0 = time.perf_counter()
            results = await drive(0, n_requests, t0 + duration)
            seconds = time.perf_counter() - t0
        else:
            # The steady state: the measured requests are those that finish after the first
            # `concurrency` of one closed loop, which goes on for `concurrency` more. The window
            # runs from the last of those first ones finishing to the last measured one finishing,
            # so it holds neither the clients' start (a burst from an idle server) nor their drain.
            lead = concurrency
            results = await drive(0, lead + n_requests + concurrency)
            seconds = finished_at[lead + n_requests - 1] - finished_at[lead - 1]
            results = results[lead : lead + n_requests]
        for m in many:
            await m.close()
    finally:
        for ch in channels:
            await ch.close()
    return {"results": results, "seconds": seconds}


def run_level(
    address: str,
    texts: list[str],
    refs: list[str],
    concurrency: int,
    n_requests: int,
    beam: int,
    timeout: float = 120.0,
    duration: float | None = None,
    api: str = "unary",
    streams: int = 1,
    connections: int = 1,
    options: dict | None = None,
    fields: dict | None = None,
) -> dict:
    """`n_requests` single-sentence requests, `concurrency` at a time (or fewer when `duration`
    seconds pass first), as Translate calls or as items of `streams` TranslateMany streams, over
    `connections` client connections (at most one per concurrent request). `options`: more
    TranslationOptions fields of every request (e.g. min_output_tokens); `fields`: TranslateRequest
    fields of every request (a multilingual model's source_language and target_language)."""
    import sacrebleu

    out = asyncio.run(
        _load(
            address, texts, concurrency, n_requests, beam, timeout, duration, api, streams, connections, options, fields
        )
    )
    results, seconds = out["results"], out["seconds"]
    ok = [r for r in results if r[2] == "OK"]
    lat = sorted(r[1] for r in ok)
    errors = Counter(r[2] for r in results if r[2] != "OK")
    tokens = sum(r[3].output_tokens for r in ok)  # </s> included
    bleu = None
    if ok:
        hyp = [r[3].text for r in ok]
        ref = [refs[r[0] % len(refs)] for r in ok]
        bleu = round(sacrebleu.corpus_bleu(hyp, [ref]).score, 2)
    return {
        "concurrency": concurrency,
        "beam": beam,
        "api": api,
        "connections": max(1, min(connections, concurrency)),
        "requests": len(results),
        "ok": len(ok),
        "errors": dict(errors),
        "seconds": round(seconds, 3),
        "sentences_per_s": round(len(ok) / seconds, 2),
        "target_tokens_per_s": round(tokens / seconds, 1),
        "p50_ms": round(1000 * percentile(lat, 0.50), 2),
        "p95_ms": round(1000 * percentile(lat, 0.95), 2),
        "p99_ms": round(1000 * percentile(lat, 0.99), 2),
        "mean_ms": round(1000 * sum(lat) / len(lat), 2) if lat else None,
        "bleu": bleu,
    }


def requests_for(concurrency: int, base: int, rounds: int = 4) -> int:
    """At least `base` requests, and at least `rounds` rounds of the concurrency."""
    return max(base, rounds * concurrency)


def run(
    model_dir: str | Path,
    texts: list[str],
    refs: list[str],
    levels: list[int],
    beam: int,
    base_requests: int,
    server_args: Sequence[str] = (),
    log=print,
    rounds: int = 4,
    api: str = "unary",
    streams: int = 1,
    backend: str = "ort",
    connections: int = 1,
) -> dict:
    with Server(model_dir, list(server_args), backend=backend) as srv:
        rows = []
        for c in levels:
            cpu0, t0 = (process_cpu_s(srv.pid), process_cpu_s()), time.perf_counter()
            row = run_level(
                srv.address,
                texts,
                refs,
                c,
                requests_for(c, base_requests, rounds),
                beam,
                api=api,
                streams=streams,
                connections=connections,
            )
            # CPU used during the level (warm-up included) by the server and by this load generator,
            # in cores: both share the machine.
            wall = time.perf_counter() - t0
            row["server_cpu_cores"] = round((process_cpu_s(srv.pid) - cpu0[0]) / wall, 2)
            row["client_cpu_cores"] = round((process_cpu_s() - cpu0[1]) / wall, 2)
            log(
                f"  online {api:5s} c={c:<4} beam={beam} {row['sentences_per_s']:8.1f} sent/s  p50 {row['p50_ms']:8.1f} ms  "
                f"p99 {row['p99_ms']:8.1f} ms  errors {row['errors'] or 0}  cpu: server {row['server_cpu_cores']:.2f} "
                f"client {row['client_cpu_cores']:.2f} cores"
            )
            rows.append(row)
        rc = srv.stop()
    return {
        "server_args": list(server_args),
        "api": api,
        "streams": streams,
        "connections": connections,
        "backend": backend,
        "levels": rows,
        "server_exit": rc,
    }


def main() -> None:
    from export.data import DEFAULT_DATA_DIR, read_parallel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--concurrency", default="1,8,32,64,128")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--requests", type=int, default=1000, help="requests per level (at least 4 x concurrency)")
    p.add_argument(
        "--continuous-batching",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the server's setting (default off, as the server's own default)",
    )
    p.add_argument(
        "--api",
        choices=["unary", "many"],
        default="unary",
        help="unary: a Translate call per sentence; many: items of TranslateMany streams",
    )
    p.add_argument("--streams", type=int, default=1, help="TranslateMany streams the concurrency is split over")
    p.add_argument(
        "--connections",
        type=int,
        default=1,
        help="client connections the concurrency is spread over (a server's replicas are spread by connection)",
    )
    p.add_argument("--server-arg", action="append", default=[], help="extra `mtserve serve` flag (repeatable)")
    p.add_argument(
        "--backend",
        choices=sorted(BACKENDS),
        default="ort",
        help="ort: `mtserve serve`; ct2: the same server decoding with CTranslate2 (benchmarks/ct2_server.py)",
    )
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    texts, refs = read_parallel(args.data, "test_2016_flickr")
    extra = ["--continuous-batching" if args.continuous_batching else "--no-continuous-batching", *args.server_arg]
    result = run(
        args.model,
        texts,
        refs,
        [int(c) for c in args.concurrency.split(",")],
        args.beam,
        args.requests,
        extra,
        log=lambda m: print(m, file=sys.stderr),
        api=args.api,
        streams=args.streams,
        backend=args.backend,
        connections=args.connections,
    )
    print_result(result, args.json)


if __name__ == "__main__":
    main()
