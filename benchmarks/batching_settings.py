"""The batching settings a server derives at load (service/batching/calibration.py) against hand
settings of the wait, online, as interleaved pairs.

    python -m benchmarks.batching_settings --model DIR [--waits 2,10,25,50] [--rounds 3]
        [--concurrency 64] [--beam 1] [--requests 192] [--tokens 30] [--json out.json]

One `mtserve serve` per setting, all on the model dir DIR (started one after another, so that no
load's measurement runs beside another's; idle meanwhile), each `--decode-workers 2
--intra-op-threads 1` (the real-size layout, benchmarks.plan.served_layout_real_size, less its
wait): "derived" sets nothing else, "wait W" adds `--max-queue-delay-ms W`. Every round runs one
level of benchmarks/online.py's closed loop (single-sentence Translate calls, every sentence forced
to `--tokens` target tokens, as benchmarks/real_size.py does) against each server in turn, the order
rotated from round to round: each hand setting's level right beside one of the derived server's
(which goes first alternates), and the ratio of the derived server's sentences/s to the hand
setting's is taken within that pair; the median over rounds is printed with the figures behind
it. The pairs keep a machine whose load drifts from minute to minute comparable.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import grpc

from benchmarks import online
from benchmarks.processes import Server
from benchmarks.real_size_model import DATA
from benchmarks.real_size_worker import read_test
from service.api.mtserve.v1 import translation_pb2 as pb
from service.api.mtserve.v1 import translation_pb2_grpc as pb_grpc

LAYOUT = ["--decode-workers", "2", "--intra-op-threads", "1"]


def batching_of(address: str) -> dict:
    """The server's GetModelInfo.batching: the values in force, their sources, the step costs."""
    with grpc.insecure_channel(address) as ch:
        b = pb_grpc.TranslationServiceStub(ch).GetModelInfo(pb.GetModelInfoRequest()).batching
    return {
        "max_queue_delay_ms": round(b.max_queue_delay_ms, 2),
        "max_batch_sentences": b.max_batch_sentences,
        "max_batch_tokens": b.max_batch_tokens,
        "sources": dict(b.sources),
        "step_ms": {k: round(v, 2) for k, v in sorted(b.step_ms.items(), key=lambda kv: int(kv[0]))},
    }


def level(address: str, texts: list[str], args: argparse.Namespace) -> float:
    """Sentences/s of one closed-loop level; RuntimeError when a request failed."""
    options = {"min_output_tokens": args.tokens, "max_output_tokens": args.tokens + 1}
    row = online.run_level(
        address, texts, texts, args.concurrency, args.requests, args.beam, connections=8, options=options
    )
    if row["errors"] or not row["ok"]:
        raise RuntimeError(f"{address}: errors {row['errors']}")
    return row["sentences_per_s"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", required=True, help="the model dir every server serves (--model-dir)")
    ap.add_argument("--waits", default="2,10,25,50", help="hand-set max_queue_delay_ms values, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument("--requests", type=int, default=192, help="measured requests a level")
    ap.add_argument("--tokens", type=int, default=30, help="target tokens of every sentence")
    ap.add_argument("--json", help="also write the result here")
    args = ap.parse_args(argv)
    configs = {"derived": LAYOUT} | {
        f"wait {w:g}": [*LAYOUT, "--max-queue-delay-ms", f"{w:g}"] for w in map(float, args.waits.split(","))
    }
    texts = read_test(DATA, 1000)
    servers: dict[str, Server] = {}
    try:
        for name, server_args in configs.items():
            servers[name] = Server(Path(args.model), server_args)
            servers[name].wait_ready()
        settings = {name: batching_of(s.address) for name, s in servers.items()}
        print(json.dumps({"batching": settings["derived"]}), flush=True)
        hands = [n for n in configs if n != "derived"]
        rounds: list[dict[str, dict[str, float]]] = []
        for r in range(args.rounds):
            pairs = {}
            for name in hands[r % len(hands) :] + hands[: r % len(hands)]:
                order = ["derived", name] if r % 2 == 0 else [name, "derived"]
                pairs[name] = {n: level(servers[n].address, texts, args) for n in order}
            rounds.append(pairs)
            print(json.dumps({"round": r, "sentences_per_s": pairs}), flush=True)
    finally:
        for s in servers.values():
            s.stop()
    ratios = {n: round(statistics.median(p[n]["derived"] / p[n][n] for p in rounds), 3) for n in hands}
    result = {
        "model": args.model,
        "concurrency": args.concurrency,
        "beam": args.beam,
        "tokens": args.tokens,
        "requests": args.requests,
        "server_args": LAYOUT,
        "batching": settings,
        "rounds": rounds,
        "median_sentences_per_s": {n: round(statistics.median(p[n][n] for p in rounds), 2) for n in hands},
        "derived_over": ratios,
    }
    print(json.dumps({"median_sentences_per_s": result["median_sentences_per_s"], "derived_over": ratios}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
