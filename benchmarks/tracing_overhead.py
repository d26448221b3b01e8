"""What OpenTelemetry tracing costs: throughput at concurrency 64 with tracing off and with every
request sampled, exporting over OTLP/gRPC to a receiver on loopback (in this process: it accepts
and counts the spans, so the exporter's work is real and the network is the loopback).

    python -m benchmarks.tracing_overhead [--concurrency 64] [--beam 4] [--requests 1000]
        [--pairs 2] [--server-arg=--decode-workers=1 ...] [--json out.json]

Each pair starts `mtserve serve` twice (benchmarks/processes.py's Server): once with
OTEL_TRACES_EXPORTER=none, once with OTEL_TRACES_EXPORTER=otlp and OTEL_TRACES_SAMPLER=always_on;
the order alternates from pair to pair. Both run `online.run_level` on the same sentences. The
result (one JSON line) has every run, with the server's CPU time per request; the median
throughputs; `overhead` = 1 - the median over pairs of traced / untraced sentences/s (pairs run
close in time, so a machine busy with other work skews both sides of a pair alike; negative:
within noise, the traced run was faster); and `cpu_overhead` = the median over pairs of traced /
untraced server CPU per request, minus 1 (the cost a busy machine disturbs least).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from benchmarks import online
from benchmarks.figures import print_result
from benchmarks.processes import Server, process_cpu_s

REPO = Path(__file__).resolve().parent.parent


class SpanSink(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver on 127.0.0.1 that counts the spans it is sent."""

    def __init__(self):
        self.spans = 0
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):
        n = sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        with self._lock:
            self.spans += n
        return trace_service_pb2.ExportTraceServiceResponse()

    def __enter__(self) -> SpanSink:
        self._server.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.stop(0)


def tracing_env(sink: SpanSink | None) -> dict[str, str]:
    """The server's environment: tracing off, or every request sampled and exported to `sink`."""
    if sink is None:
        return {"OTEL_TRACES_EXPORTER": "none"}
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sink.port}",
        "OTEL_TRACES_SAMPLER": "always_on",
    }


def measure(
    model_dir: str | Path,
    texts: list[str],
    refs: list[str],
    concurrency: int = 64,
    beam: int = 4,
    requests: int = 1000,
    pairs: int = 2,
    server_args: Sequence[str] = (),
    log=print,
) -> dict:
    """`pairs` x (untraced, traced) servers at `concurrency`: the levels, medians and overhead."""
    n = online.requests_for(concurrency, requests)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with SpanSink() as sink:
        for i in range(pairs):
            order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
            for mode in order:
                spans_before = sink.spans
                env = tracing_env(sink if mode == "on" else None)
                with Server(model_dir, list(server_args), env=env, log_prefix="mtserve-tracing-") as srv:
                    cpu0 = process_cpu_s(srv.pid)
                    row = online.run_level(srv.address, texts, refs, concurrency, n, beam)
                    # warm-up included: run_level sends 2 x concurrency requests first
                    cpu = process_cpu_s(srv.pid) - cpu0
                    row["server_cpu_ms_per_request"] = round(1000 * cpu / (row["requests"] + 2 * concurrency), 3)
                    row["server_exit"] = srv.stop()  # the drain exports the spans still buffered
                row["spans_exported"] = sink.spans - spans_before
                log(
                    f"  tracing {mode:3s} c={concurrency} beam={beam} {row['sentences_per_s']:8.1f} sent/s  "
                    f"p50 {row['p50_ms']:8.1f} ms  p99 {row['p99_ms']:8.1f} ms  "
                    f"cpu {row['server_cpu_ms_per_request']:.2f} ms/request  spans {row['spans_exported']}  "
                    f"errors {row['errors'] or 0}"
                )
                runs[mode].append(row)
    median = {m: statistics.median(r["sentences_per_s"] for r in rows) for m, rows in runs.items()}
    pairs_ = list(zip(runs["off"], runs["on"]))
    speed = statistics.median(on["sentences_per_s"] / off["sentences_per_s"] for off, on in pairs_)
    cpu = statistics.median(on["server_cpu_ms_per_request"] / off["server_cpu_ms_per_request"] for off, on in pairs_)
    return {
        "concurrency": concurrency,
        "beam": beam,
        "requests": n,
        "pairs": pairs,
        "server_args": list(server_args),
        "off": runs["off"],
        "on": runs["on"],
        "off_sentences_per_s": median["off"],
        "on_sentences_per_s": median["on"],
        "overhead": round(1 - speed, 4),
        "cpu_overhead": round(cpu - 1, 4),
    }


def main() -> None:
    from export.data import DEFAULT_DATA_DIR, read_parallel

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=str(REPO / "models" / "de-en" / "1"))
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--requests", type=int, default=1000, help="requests per run (at least 4 x concurrency)")
    p.add_argument("--pairs", type=int, default=2, help="untraced/traced server pairs, order alternating")
    p.add_argument("--server-arg", action="append", default=[], help="extra `mtserve serve` flag (repeatable)")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    texts, refs = read_parallel(args.data, "test_2016_flickr")
    result = measure(
        args.model,
        texts,
        refs,
        args.concurrency,
        args.beam,
        args.requests,
        args.pairs,
        args.server_arg,
        log=lambda m: print(m, file=sys.stderr),
    )
    print_result(result, args.json)


if __name__ == "__main__":
    main()
