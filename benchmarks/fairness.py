"""Fairness between models: a flood on one model must not starve another.

    python -m benchmarks.fairness --repository models --models de-en,fr-en --requests 100 --rounds 2

One real `mtserve serve` process on loopback serves two models of a model repository
(`--models FLOODED,PROBED`, default de-en,fr-en). The probe is one client (c1) that sends
`--requests` single-sentence Translate calls to PROBED back to back, each a test sentence of PROBED's
source language. Two phases, interleaved A, B, A, B, ... for `--rounds` rounds, because the
machine drifts (±30% between runs of the same thing here):

- A, alone: the probe on an otherwise idle server: p50 / p99 latency;
- B, flood: the same probe while `--flood-concurrency` (64) closed-loop clients flood FLOODED with
  single-sentence Translate calls (each sends its next request as soon as its last is answered):
  the probe's p50 / p99 under the flood, and FLOODED's throughput (sentences answered per second
  while the probe ran).

Both models get beam `--beam` (4). The sentences: `--split` (test_2016_flickr) of `--data` in each
model's source language as the server reports it (GetModelInfo.source_language), so fr-en is sent
French and de-en German; the probe takes the same `--requests` sentences in the same order in
every phase (drawn with `--seed`). The flood runs in a child process of its own (this script,
`flood-worker`) so that its client work does not delay the probe's; every call is unary, with a
deadline of `--timeout-s`.

Per round: both phases' latency figures, the flood's throughput and latency, and p50_ratio =
probe p50 under the flood / probe p50 alone (p99_ratio likewise); then the medians over the
rounds (the ratios: the median of the per-round ratios, each round's phases being adjacent in
time). Progress goes to stderr; the result is one JSON line on stdout (and in `--json FILE`). The
exit status is 1 when any call failed. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import grpc

from benchmarks.figures import percentile, print_result
from benchmarks.processes import Server, free_port
from export.data import DEFAULT_DATA_DIR, read_lines, split_path
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent


class RepositoryServer(Server):
    """`mtserve serve --model-repository REPO --models A,B` on 127.0.0.1:<free port>, metrics off,
    warnings only (`extra` flags last, so they override these)."""

    def __init__(self, repository: Path, models: list[str], decode_workers: int, extra: Sequence[str] = ()):
        self.address = f"127.0.0.1:{free_port()}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="mtserve-fairness-", suffix=".log", delete=False)
        self.cmd = [
            sys.executable,
            "-m",
            "mtserve",
            "serve",
            "--address",
            self.address,
            "--metrics-port",
            "0",
            "--model-repository",
            str(repository),
            "--models",
            ",".join(models),
            "--decode-workers",
            str(decode_workers),
            "--log-level",
            "warning",
            *extra,
        ]
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)
        self.pid = self.proc.pid


def request(text: str, model: str, beam: int) -> pb.TranslateRequest:
    return pb.TranslateRequest(texts=[text], model=model, options=pb.TranslationOptions(beam_size=beam))


def latency_figures(seconds: list[float]) -> dict:
    s = sorted(seconds)
    return {
        "n": len(s),
        "p50_ms": round(percentile(s, 0.5) * 1000, 1) if s else None,
        "p99_ms": round(percentile(s, 0.99) * 1000, 1) if s else None,
        "mean_ms": round(statistics.fmean(s) * 1000, 1) if s else None,
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def median(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return round(statistics.median(xs), 3) if xs else None


# -- the flood: a child process of its own --------------------------------------------------------


async def _flood(address: str, model: str, texts: list[str], concurrency: int, beam: int, timeout: float) -> dict:
    """`concurrency` closed loops of Translate calls until a line (or EOF) arrives on stdin; prints
    "ready" once the first answer came back. Returns each answered call's (start, end) on the
    monotonic clock (shared by the processes of one machine) and the failed calls by code."""
    stop, answered, gave_up = asyncio.Event(), asyncio.Event(), asyncio.Event()
    calls: list[tuple[float, float]] = []
    errors: Counter = Counter()
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.TranslationServiceStub(channel)

        async def client(i: int) -> None:
            k = i
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    await stub.Translate(request(texts[k % len(texts)], model, beam), timeout=timeout)
                except grpc.aio.AioRpcError as e:
                    errors[e.code().name] += 1
                    if not answered.is_set() and errors.total() >= concurrency:
                        gave_up.set()  # every client failed before any answer: not worth waiting
                    await asyncio.sleep(0.05)
                else:
                    calls.append((t0, time.monotonic()))
                    answered.set()
                k += concurrency

        tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
        waits = [asyncio.create_task(answered.wait()), asyncio.create_task(gave_up.wait())]
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if not answered.is_set():
            stop.set()
            await asyncio.gather(*tasks)
            return {"calls": calls, "errors": dict(errors), "failed": f"no answer from {model}"}
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        stop.set()  # no new calls; the ones in flight are answered, so the server is idle after
        await asyncio.gather(*tasks)
    return {"calls": calls, "errors": dict(errors)}


def flood_worker(argv: list[str]) -> int:
    p = argparse.ArgumentParser("fairness.py flood-worker")
    p.add_argument("--address", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--texts", required=True, help="a JSON file with the sentences")
    p.add_argument("--concurrency", type=int, default=64)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--timeout-s", type=float, default=120.0)
    a = p.parse_args(argv)
    texts = json.loads(Path(a.texts).read_text(encoding="utf-8"))
    result = asyncio.run(_flood(a.address, a.model, texts, a.concurrency, a.beam, a.timeout_s))
    print(json.dumps(result), flush=True)
    return 0


class Flood:
    """The flood-worker child: started, then `stop()` returns its calls and errors."""

    def __init__(self, address: str, model: str, texts_file: Path, concurrency: int, beam: int, timeout: float):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.fairness",
            "flood-worker",
            "--address",
            address,
            "--model",
            model,
            "--texts",
            str(texts_file),
            "--concurrency",
            str(concurrency),
            "--beam",
            str(beam),
            "--timeout-s",
            str(timeout),
        ]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            rest = line + self.proc.stdout.read()
            self.proc.wait()
            raise RuntimeError(f"the flood did not start (exit {self.proc.returncode}): {rest.strip()[-2000:]}")

    def stop(self, timeout: float) -> dict:
        out, _ = self.proc.communicate(timeout=timeout)  # closes the child's stdin: its signal to stop
        lines = out.strip().splitlines()
        if self.proc.returncode != 0 or not lines:
            raise RuntimeError(f"the flood exited with {self.proc.returncode}: {out.strip()[-2000:]}")
        return json.loads(lines[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# -- the probe and the phases -------------------------------------------------------------------------


def probe(stub, texts: list[str], model: str, beam: int, timeout: float) -> tuple[list[float], Counter, set]:
    """One client, one call at a time: each call's latency in seconds, the failed ones by code,
    and the model versions that answered."""
    seconds: list[float] = []
    errors: Counter[str] = Counter()
    served: set[str] = set()
    for text in texts:
        t0 = time.perf_counter()
        try:
            response = stub.Translate(request(text, model, beam), timeout=timeout)
        except grpc.RpcError as e:
            errors[e.code().name] += 1
            continue
        seconds.append(time.perf_counter() - t0)
        served.add(response.model)
    return seconds, errors, served


def model_language(stub, model: str) -> str:
    try:
        info = stub.GetModelInfo(pb.GetModelInfoRequest(model=model), timeout=30)
    except grpc.RpcError as e:
        raise SystemExit(f"fairness: {model}: {e.code().name}: {e.details()}") from None
    if not info.source_language:  # a multilingual model: its requests must name their languages
        raise SystemExit(f"fairness: {model} has no default language pair (a multilingual model)")
    return info.source_language


def sentences(data: str | Path, split: str, lang: str) -> list[str]:
    found = [s for s in read_lines(split_path(data, split, lang)) if s]
    if not found:
        raise SystemExit(f"fairness: {split}.{lang} in {data} has no sentences")
    return found


def round_figures(alone: list[float], flooded: list[float], flood: dict, window: tuple[float, float]) -> dict:
    t0, t1 = window
    in_window = [(s, e) for s, e in flood["calls"] if t0 <= e <= t1]
    a, b = latency_figures(alone), latency_figures(flooded)
    return {
        "alone": a,
        "flood": b,
        "flooded_model": {
            "sentences_per_s": round(len(in_window) / (t1 - t0), 2) if t1 > t0 else None,
            "answered_in_window": len(in_window),
            "answered": len(flood["calls"]),
            "window_s": round(t1 - t0, 2),
            **{k: v for k, v in latency_figures([e - s for s, e in in_window]).items() if k != "n"},
            "errors": flood["errors"],
        },
        "p50_ratio": ratio(b["p50_ms"], a["p50_ms"]),
        "p99_ratio": ratio(b["p99_ms"], a["p99_ms"]),
    }


def fairness_round(
    r: int,
    stub: pb_grpc.TranslationServiceStub,
    address: str,
    args: argparse.Namespace,
    probed: str,
    flooded: str,
    probe_texts: list[str],
    texts_file: Path,
) -> tuple[dict, Counter[str], set[str]]:
    """Round `r`: the probe alone (A), then under the flood (B). Its figures, the errors of the
    probe and the flood, and the model versions that answered the probe."""
    alone, e_a, s_a = probe(stub, probe_texts, probed, args.beam, args.timeout_s)
    log(f"round {r} A (alone): {probed} {latency_figures(alone)}")
    flood = Flood(address, flooded, texts_file, args.flood_concurrency, args.beam, args.timeout_s)
    try:
        flood.wait_ready()
        time.sleep(args.flood_warmup_s)
        t0 = time.monotonic()
        under, e_b, s_b = probe(stub, probe_texts, probed, args.beam, args.timeout_s)
        t1 = time.monotonic()
        flood_result = flood.stop(args.timeout_s + 60)
    except BaseException:
        flood.kill()
        raise
    figures = {"round": r, **round_figures(alone, under, flood_result, (t0, t1))}
    figures["probe_errors"] = dict(e_a + e_b)
    log(
        f"round {r} B (flood): {probed} {figures['flood']}; {flooded} "
        f"{figures['flooded_model']['sentences_per_s']} sentences/s; p50 ratio {figures['p50_ratio']}"
    )
    return figures, e_a + e_b + Counter(flood_result["errors"]), s_a | s_b


def median_figures(rounds: list[dict]) -> dict:
    """The medians over the rounds of the probe's latency alone and under the flood, the flooded
    model's throughput and the ratios."""
    return {
        "alone_p50_ms": median([r["alone"]["p50_ms"] for r in rounds]),
        "alone_p99_ms": median([r["alone"]["p99_ms"] for r in rounds]),
        "flood_p50_ms": median([r["flood"]["p50_ms"] for r in rounds]),
        "flood_p99_ms": median([r["flood"]["p99_ms"] for r in rounds]),
        "flooded_sentences_per_s": median([r["flooded_model"]["sentences_per_s"] for r in rounds]),
        "p50_ratio": median([r["p50_ratio"] for r in rounds]),
        "p99_ratio": median([r["p99_ratio"] for r in rounds]),
    }


def run(args) -> dict:
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if len(models) != 2 or models[0] == models[1]:
        raise SystemExit("fairness: --models takes two different models, FLOODED,PROBED")
    flooded, probed = models
    repository = Path(args.repository).resolve()
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    server = RepositoryServer(repository, models, args.decode_workers, args.server_arg)
    texts_file = None
    try:
        try:
            server.wait_ready(args.ready_timeout_s)
        except RuntimeError as e:
            raise SystemExit(f"fairness: {e}") from None
        channel = grpc.insecure_channel(server.address)
        stub = pb_grpc.TranslationServiceStub(channel)
        langs = {m: model_language(stub, m) for m in models}
        rng = random.Random(args.seed)
        pool = sentences(args.data, args.split, langs[probed])
        picked = rng.sample(pool, min(args.requests, len(pool)))
        probe_texts = [picked[i % len(picked)] for i in range(args.requests)]
        flood_texts = sentences(args.data, args.split, langs[flooded])
        rng.shuffle(flood_texts)
        with tempfile.NamedTemporaryFile("w", prefix="fairness-flood-", suffix=".json", delete=False) as f:
            json.dump(flood_texts, f)
            texts_file = Path(f.name)
        # Warm-up, not counted: the channel, and both models' first calls.
        probe(stub, probe_texts[:3], probed, args.beam, args.timeout_s)
        probe(stub, flood_texts[:3], flooded, args.beam, args.timeout_s)

        rounds: list[dict] = []
        errors: Counter[str] = Counter()
        served: set[str] = set()
        for r in range(1, args.rounds + 1):
            figures, round_errors, round_served = fairness_round(
                r, stub, server.address, args, probed, flooded, probe_texts, texts_file
            )
            rounds.append(figures)
            errors += round_errors
            served |= round_served
        channel.close()
    finally:
        server_exit = server.stop()
        if texts_file is not None:
            texts_file.unlink(missing_ok=True)
    result = {
        "benchmark": "fairness",
        "repository": str(args.repository),
        "flooded": flooded,
        "probed": probed,
        "source_languages": langs,
        "probe_answered_by": sorted(served),
        "split": args.split,
        "beam": args.beam,
        "requests": args.requests,
        "flood_concurrency": args.flood_concurrency,
        "decode_workers": args.decode_workers,
        "server_args": list(args.server_arg),
        "rounds": rounds,
        "median": median_figures(rounds),
        "errors": dict(errors),
        "cpu_count": os.cpu_count(),
        "loadavg_1m": {"start": round(load_start[0], 2), "end": round(os.getloadavg()[0], 2)},
        "server_exit_code": server_exit,
        "seconds": round(time.perf_counter() - t_start, 1),
    }
    if errors or server_exit != 0:
        result["server_log_tail"] = server.tail()
    os.unlink(server.log.name)
    return result


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["flood-worker"]:
        return flood_worker(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", default="models", help="model repository, NAME/VERSION/ (Triton's layout)")
    p.add_argument("--models", default="de-en,fr-en", help="FLOODED,PROBED: the flood's model, then the probe's")
    p.add_argument("--requests", type=int, default=100, help="probe calls per phase")
    p.add_argument("--rounds", type=int, default=2, help="A, B pairs (alone, flood)")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--decode-workers", type=int, default=2, help="the server's decode workers (per model)")
    p.add_argument("--flood-concurrency", type=int, default=64, help="closed-loop clients of the flood")
    p.add_argument("--flood-warmup-s", type=float, default=2.0, help="flood time before the probe starts")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR), help="dir with SPLIT.LANG[.gz] files")
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=120.0, help="deadline of every call")
    p.add_argument("--ready-timeout-s", type=float, default=300.0, help="wait this long for the server's SERVING")
    p.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra `mtserve serve` argument, e.g. --server-arg=--precision=fp32 (repeatable)",
    )
    p.add_argument("--json", help="also write the result here")
    args = p.parse_args(argv)
    if args.requests < 1 or args.rounds < 1 or args.flood_concurrency < 1:
        p.error("--requests, --rounds and --flood-concurrency must be at least 1")
    result = run(args)
    print_result(result, args.json)
    return 1 if result["errors"] or result["server_exit_code"] != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
