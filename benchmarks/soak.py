"""Soak and overload runs against a real `mtserve serve` process on loopback.

    python -m benchmarks.soak --model-dir models/de-en/1 --minutes 10                # make soak
    python -m benchmarks.soak --onnx-dir DIR --scenario overload --clients 512    # make overload

`soak`: `--concurrency` clients (64) send requests back to back for the whole run: Translate with
1-4 texts of mixed lengths (60%), TranslateStream (25%), Encode (15%), beam 1-4. 10% of the
requests are cancelled by the client after a random delay, 15% get a tight random deadline; the
rest a generous one. Every request ends in one category: `ok`, `cancelled` (we cancelled it),
`deadline_exceeded` (it had a tight deadline), or `unexpected:CODE` (anything else, including an
OK answer of the wrong shape). The server's resident memory is sampled every second; the
baseline is taken at the end of the warm-up. After the run: queue depth and in-flight RPCs from
/metrics, then SIGTERM and the exit code.

`overload`: the server gets a small queue (`--max-queue-size 32 --max-batch-sentences 16` unless
`--server-arg` says otherwise) and `--clients` single-sentence requests arrive at once, for
`--rounds` rounds: the excess must be refused with RESOURCE_EXHAUSTED at once, every accepted
request answered, and nothing else seen.

The report is one JSON object (stdout, and `--json FILE`); the exit status is 0 when every check
passed: no unexpected outcome, sent == answered, memory growth after warm-up < `--max-rss-growth`
(10%), queue back to 0, exit 0 after SIGTERM (and, for overload, some requests refused). Only
127.0.0.1 is contacted; every loop ends by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import grpc

from benchmarks.figures import percentile
from benchmarks.processes import Server, free_port
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent

SENTENCES = [
    "Ein Hund.",
    "Ein Kind lacht.",
    "Zwei Männer sitzen auf einer Bank.",
    "Ein Hund rennt durch den Schnee.",
    "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße.",
    "Ein kleines Mädchen in einem rosa Kleid klettert auf ein Klettergerüst auf einem Spielplatz.",
    "Mehrere Männer in orangefarbenen Westen arbeiten an einer Straße, während ein Bus vorbeifährt.",
    "Eine Gruppe von Menschen steht vor einem Gebäude und wartet auf den Beginn einer Veranstaltung.",
    "Ein Mann fährt Fahrrad.",
    "Leute am Strand.",
    "Ein älterer Mann mit Brille liest in einem Café eine Zeitung, während draußen die Sonne scheint "
    "und Kinder auf dem Platz Fußball spielen.",
]


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def scrape(port: int) -> dict[str, float]:
    """Queue depth and in-flight RPCs from the Prometheus endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {"queue_depth": 0.0, "in_flight": 0.0}
    for line in text.splitlines():
        if line.startswith(("mtserve_queue_depth ", "mtserve_queue_depth{")):  # summed over the models
            out["queue_depth"] += float(line.split()[-1])
        elif line.startswith("mtserve_requests_in_flight{"):
            out["in_flight"] += float(line.split()[-1])
    return out


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    s = sorted(xs)
    return {
        "p50": round(percentile(s, 0.5), 4),
        "p99": round(percentile(s, 0.99), 4),
        "max": round(s[-1], 4),
        "n": len(s),
    }


class ServerProcess(Server):
    """`mtserve serve` with its metrics on a loopback port (the soak scrapes them) and INFO logs."""

    def __init__(self, args, extra: list[str]):
        self.metrics_port = free_port()
        flags = [
            "--metrics-port",
            str(self.metrics_port),
            "--metrics-address",
            "127.0.0.1",
            "--grace-period-s",
            str(args.grace_period_s),
            "--log-level",
            "info",
        ]
        if args.onnx_dir:
            flags += ["--onnx-dir", str(args.onnx_dir)]
        super().__init__(args.model_dir or REPO / "models" / "de-en" / "1", flags + extra, log_prefix="mtserve-soak-")

    def stop_timed(self, timeout: float) -> tuple[int, float]:
        """SIGTERM; the exit code and how long the drain took (killed after `timeout` s)."""
        t0 = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        return rc, time.perf_counter() - t0


def load_sentences(path: str | None) -> list[str]:
    if not path:
        return SENTENCES
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines or SENTENCES


# ----------------------------------------------------------------------------- soak


def start_call(stub, rng: random.Random, r: float, sentences: list[str], beam: int, timeout: float):
    """One call of the mix (`r` in [0, 1) picks it): 60% Translate of 1-4 texts, 25%
    TranslateStream, 15% Encode; 80% of the texts a sentence, the rest two joined. (kind, call, texts)."""
    opts = pb.TranslationOptions(beam_size=beam)

    def pick() -> str:
        return rng.choice(sentences) if rng.random() < 0.8 else " ".join(rng.sample(sentences, 2))

    if r < 0.60:
        texts = [pick() for _ in range(rng.randint(1, 4))]
        return "translate", stub.Translate(pb.TranslateRequest(texts=texts, options=opts), timeout=timeout), texts
    if r < 0.85:
        texts = [pick()]
        return (
            "stream",
            stub.TranslateStream(pb.TranslateStreamRequest(text=texts[0], options=opts), timeout=timeout),
            texts,
        )
    texts = [pick() for _ in range(rng.randint(1, 4))]
    return "encode", stub.Encode(pb.EncodeRequest(texts=texts), timeout=timeout), texts


async def outcome_of(kind: str, call, texts: list[str], cancelled: bool, tight: bool) -> str:
    """ "ok", "cancelled" or "deadline_exceeded" where expected (a cancelled call, a tight
    deadline), else "unexpected:CODE"."""
    try:
        if kind == "stream":
            msgs = [m async for m in call]
            good = bool(msgs) and msgs[-1].HasField("final") and all(m.HasField("chunk") for m in msgs[:-1])
        elif kind == "translate":
            good = len((await call).translations) == len(texts)
        else:
            good = len((await call).encodings) == len(texts)
        return "ok" if good else "unexpected:BAD_RESPONSE"
    except asyncio.CancelledError:
        return "cancelled" if cancelled else "unexpected:CANCELLED"
    except grpc.aio.AioRpcError as e:
        code = e.code()
        if code == grpc.StatusCode.CANCELLED and cancelled:
            return "cancelled"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED and tight:
            return "deadline_exceeded"
        return f"unexpected:{code.name}"


async def one_request(stub, rng: random.Random, sentences: list[str], counts: Counter, latencies: dict) -> None:
    r = rng.random()
    beam = rng.choice([1, 1, 2, 4])
    cancel_after = rng.uniform(0.0, 0.5) if rng.random() < 0.10 else None
    tight = cancel_after is None and rng.random() < 0.15 / 0.9
    timeout = rng.uniform(0.02, 0.5) if tight else 60.0
    kind, call, texts = start_call(stub, rng, r, sentences, beam, timeout)
    counts["sent"] += 1
    t0 = time.perf_counter()
    task = asyncio.ensure_future(outcome_of(kind, call, texts, cancel_after is not None, tight))
    if cancel_after is not None:
        done, _ = await asyncio.wait({task}, timeout=cancel_after)
        if not done:
            call.cancel()
    try:
        outcome = await task
    except Exception as e:  # noqa: BLE001 - counted, never raised: the run goes on
        outcome = f"unexpected:{type(e).__name__}"
    counts["answered"] += 1
    counts[outcome] += 1
    if outcome == "ok":
        latencies.setdefault(kind, []).append(time.perf_counter() - t0)


async def soak(args, server: ServerProcess) -> dict:
    rng = random.Random(args.seed)
    sentences = load_sentences(args.data)
    counts: Counter = Counter()
    latencies: dict[str, list[float]] = {}
    duration = args.seconds if args.seconds is not None else args.minutes * 60
    warmup = args.warmup_s if args.warmup_s is not None else min(60.0, 0.2 * duration)
    start = time.perf_counter()
    end = start + duration
    rss = {"start": rss_bytes(server.proc.pid)}
    samples: list[tuple[float, int]] = []

    async def client(i: int) -> None:
        crng = random.Random(rng.random())
        while time.perf_counter() < end:
            await one_request(stub, crng, sentences, counts, latencies)

    async def sampler() -> None:
        while time.perf_counter() < end:
            t = time.perf_counter() - start
            samples.append((t, rss_bytes(server.proc.pid)))
            if "baseline" not in rss and t >= warmup:
                rss["baseline"] = samples[-1][1]
            await asyncio.sleep(1.0)

    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)
        await asyncio.gather(sampler(), *(client(i) for i in range(args.concurrency)))
    elapsed = time.perf_counter() - start
    drain_end = time.time() + 30
    m = scrape(server.metrics_port)
    while (m["queue_depth"] or m["in_flight"]) and time.time() < drain_end:
        time.sleep(0.1)
        m = scrape(server.metrics_port)
    rss["final"] = rss_bytes(server.proc.pid)
    rss.setdefault("baseline", samples[0][1] if samples else rss["start"])
    after = [v for t, v in samples if t >= warmup] + [rss["final"]]
    growth = (rss["final"] - rss["baseline"]) / rss["baseline"]
    unexpected = {k: v for k, v in counts.items() if k.startswith("unexpected:")}
    return {
        "scenario": "soak",
        "duration_s": round(elapsed, 1),
        "warmup_s": warmup,
        "concurrency": args.concurrency,
        "sent": counts["sent"],
        "answered": counts["answered"],
        "ok": counts["ok"],
        "cancelled": counts["cancelled"],
        "deadline_exceeded": counts["deadline_exceeded"],
        "unexpected": sum(unexpected.values()),
        "unexpected_by_code": unexpected,
        "requests_per_s": round(counts["sent"] / elapsed, 1),
        "latency_ok_s": {k: percentiles(v) for k, v in latencies.items()},
        "rss_mib": {
            **{k: round(v / 2**20, 1) for k, v in rss.items()},
            "max_after_warmup": round(max(after) / 2**20, 1),
        },
        "rss_growth_after_warmup": round(growth, 4),
        "queue_depth_after": m["queue_depth"],
        "in_flight_after": m["in_flight"],
        "checks": {
            "no_unexpected": not unexpected,
            "none_lost": counts["sent"] == counts["answered"],
            "rss_growth_ok": growth < args.max_rss_growth,
            "queue_empty": m["queue_depth"] == 0,
            "some_ok": counts["ok"] > 0,
        },
    }


# ----------------------------------------------------------------------------- overload


async def overload(args, server: ServerProcess) -> dict:
    sentences = load_sentences(args.data)
    counts: Counter = Counter()
    lat: dict[str, list[float]] = {"ok": [], "refused": []}

    async def one(stub, i: int) -> None:
        t0 = time.perf_counter()
        counts["sent"] += 1
        try:
            resp = await stub.Translate(
                pb.TranslateRequest(
                    texts=[sentences[i % len(sentences)]], options=pb.TranslationOptions(beam_size=args.beam)
                ),
                timeout=120,
            )
            key = "ok" if len(resp.translations) == 1 else "unexpected:BAD_RESPONSE"
        except grpc.aio.AioRpcError as e:
            key = "refused" if e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED else f"unexpected:{e.code().name}"
        counts["answered"] += 1
        counts[key] += 1
        if key in lat:
            lat[key].append(time.perf_counter() - t0)

    start = time.perf_counter()
    async with grpc.aio.insecure_channel(server.address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)
        await channel.channel_ready()
        for _ in range(args.rounds):
            await asyncio.gather(*(one(stub, i) for i in range(args.clients)))
    m = scrape(server.metrics_port)
    unexpected = {k: v for k, v in counts.items() if k.startswith("unexpected:")}
    return {
        "scenario": "overload",
        "clients": args.clients,
        "rounds": args.rounds,
        "beam": args.beam,
        "duration_s": round(time.perf_counter() - start, 1),
        "sent": counts["sent"],
        "answered": counts["answered"],
        "ok": counts["ok"],
        "refused": counts["refused"],
        "unexpected": sum(unexpected.values()),
        "unexpected_by_code": unexpected,
        "latency_refused_s": percentiles(lat["refused"]),
        "latency_ok_s": percentiles(lat["ok"]),
        "queue_depth_after": m["queue_depth"],
        "checks": {
            "no_unexpected": not unexpected,
            "none_lost": counts["sent"] == counts["answered"],
            "excess_refused": counts["refused"] > 0,
            "some_ok": counts["ok"] > 0,
            "queue_empty": m["queue_depth"] == 0,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["soak", "overload"], default="soak")
    p.add_argument("--model-dir", help="model dir to serve (default: the server's, models/de-en/1)")
    p.add_argument("--onnx-dir", help="exported graphs (default MODEL_DIR/onnx)")
    p.add_argument("--minutes", type=float, default=5.0, help="soak duration")
    p.add_argument("--seconds", type=float, help="soak duration in seconds (overrides --minutes)")
    p.add_argument("--warmup-s", type=float, help="memory baseline taken after this (default: 20%%, at most 60 s)")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--clients", type=int, default=512, help="overload: requests sent at once")
    p.add_argument("--rounds", type=int, default=3, help="overload: how many times")
    p.add_argument("--beam", type=int, default=4, help="overload: beam size of every request")
    p.add_argument("--data", help="sentences to send, one per line (.gz ok); default a built-in mix")
    p.add_argument("--max-rss-growth", type=float, default=0.10)
    p.add_argument("--grace-period-s", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the report here")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `mtserve serve` argument, e.g. --server-arg=--decode-workers=2 (repeatable)",
    )
    args = p.parse_args(argv)
    extra = list(args.server_arg)
    if args.scenario == "overload":
        if not any(a.startswith("--max-queue-size") for a in extra):
            extra.append("--max-queue-size=32")
        if not any(a.startswith("--max-batch-sentences") for a in extra):
            extra.append("--max-batch-sentences=16")
    server = ServerProcess(args, extra)
    try:
        try:
            server.wait_ready(180)
        except RuntimeError as e:
            raise SystemExit(str(e)) from None
        t0 = time.perf_counter()
        run = soak if args.scenario == "soak" else overload
        report = asyncio.run(run(args, server))
    finally:
        if server.proc.poll() is None:
            rc, took = server.stop_timed(args.grace_period_s + 10)
        else:
            rc, took = server.proc.returncode, 0.0
    report["server_args"] = extra
    report["server_exit_code"], report["server_exit_s"] = rc, round(took, 2)
    report["checks"]["exit_0"] = rc == 0
    report["passed"] = all(report["checks"].values())
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    if not report["passed"]:
        report["server_log_tail"] = server.tail()
    out = json.dumps(report, indent=2)
    print(out)
    if args.json:
        Path(args.json).write_text(out + "\n")
    os.unlink(server.log.name)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
