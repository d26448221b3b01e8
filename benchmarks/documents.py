"""Texts as documents, measured with the shipped model through `mtserve serve` (docs/documents.md).

    python -m benchmarks.documents --quality   # paragraphs of five test sentences, one text each
    python -m benchmarks.documents --speed     # a 2,000-word text in one request vs its sentences

--quality: the test_2016_flickr sentences joined five to a paragraph, each paragraph translated as
one text (split SENTENCES, then NONE), against the same sentences translated one by one. It checks
that every paragraph comes back as one paragraph of five segments, and prints sacreBLEU with the
paragraph translations scored against the references joined the same way.

--speed: a text of at least --words words (test sentences in order, paragraphs of five with blank
lines between) in one Translate request, against the same sentences sent one request each by a
client with 8 in flight and with 1 in flight (one after another). Prints each one's wall time,
throughput and the server's CPU time (with the cores it kept busy: on a shared machine the text
gets only the cores that others leave), and how many times sooner the document finishes than the
sentences one after another.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import sacrebleu

from benchmarks.processes import Server, process_cpu_s
from export.data import DEFAULT_DATA_DIR, read_parallel
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import Client

PARAGRAPH = 5


def paragraphs(sentences: list[str]) -> list[str]:
    """Sentences joined by a space, PARAGRAPH to a paragraph."""
    return [" ".join(sentences[i : i + PARAGRAPH]) for i in range(0, len(sentences), PARAGRAPH)]


def translate_each(client: Client, texts: list[str], in_flight: int, beam: int, split: str = "") -> list[str]:
    """Each text in a Translate request of its own, `in_flight` requests at a time."""

    def one(text: str) -> str:
        (t,) = client.translate([text], beam_size=beam, split=split)
        return t.text

    with ThreadPoolExecutor(in_flight) as pool:
        return list(pool.map(one, texts))


def _in_requests(client: Client, texts: list[str], beam: int, split: str, per_request: int = 8) -> list[pb.Translation]:
    """The translations of `texts`, `per_request` texts a Translate request, one at a time."""
    out = []
    for i in range(0, len(texts), per_request):
        out += client.translate(texts[i : i + per_request], beam_size=beam, split=split)
    return out


def quality(client: Client, sources: list[str], refs: list[str], beam: int) -> None:
    src_paragraphs, ref_paragraphs = paragraphs(sources), paragraphs(refs)
    print(f"{len(sources)} sentences, {len(src_paragraphs)} paragraphs of {PARAGRAPH}, beam {beam}")
    start = time.perf_counter()
    alone = translate_each(client, sources, 8, beam)
    rows = [("sentences one by one, joined into paragraphs", paragraphs(alone), time.perf_counter() - start)]
    split_results: list[pb.Translation] = []
    for split, segments in (("sentences", PARAGRAPH), ("none", 1)):
        start = time.perf_counter()
        results = _in_requests(client, src_paragraphs, beam, split)
        if split == "sentences":
            split_results = results
        wall = time.perf_counter() - start
        kept = sum(len(r.segments) == segments and "\n" not in r.text and bool(r.text.strip()) for r in results)
        print(f"split {split}: {kept}/{len(results)} paragraphs came back as one paragraph of {segments} segment(s)")
        rows.append((f"paragraphs, one text each, split {split.upper()}", [r.text for r in results], wall))
    start = time.perf_counter()
    (whole,) = client.translate(["\n\n".join(src_paragraphs)], beam_size=beam)
    wall = time.perf_counter() - start
    out = whole.text.split("\n\n")
    same = len(out) == len(src_paragraphs) and all(p.strip() and "\n" not in p for p in out)
    print(
        f"all {len(src_paragraphs)} paragraphs as one text, blank lines between: {len(out)} paragraphs came back, "
        f"{'each a paragraph' if same else 'NOT the same paragraphs'}; the same as one text each: {out == rows[1][1]}"
    )
    rows.append(("all the paragraphs as one text (blank lines between)", out, wall))
    print("| translated as | BLEU (paragraphs) | wall s |")
    print("|---|---|---|")
    for name, hyps, wall in rows:
        print(f"| {name} | {sacrebleu.corpus_bleu(hyps, [ref_paragraphs]).score:.2f} | {wall:.1f} |")
    print(f"sentences one by one, scored as sentences: BLEU {sacrebleu.corpus_bleu(alone, [refs]).score:.2f}")
    found = [i for i, r in enumerate(split_results) if len(r.segments) == PARAGRAPH]
    refs_found = [ref_paragraphs[i] for i in found]
    bleu = [sacrebleu.corpus_bleu([rows[k][1][i] for i in found], [refs_found]).score for k in (0, 1)]
    print(
        f"the {len(found)} paragraphs whose {PARAGRAPH} sentences the splitter found: BLEU one by one "
        f"{bleu[0]:.2f}, split SENTENCES {bleu[1]:.2f}"
    )


def speed(client: Client, sources: list[str], words: int, beam: int, rounds: int, server_pid: int | None) -> None:
    n, count = 0, 0
    while count < words and n < len(sources):
        count += len(sources[n].split())
        n += 1
    sentences = sources[:n]
    document = "\n\n".join(paragraphs(sentences))
    print(f"a text of {count} words, {n} sentences, {len(document.encode())} bytes; beam {beam}; median of {rounds}")
    translate_each(client, sentences[:16], 8, beam)  # warm-up
    (doc,) = client.translate([document], beam_size=beam)
    print(f"the text came back in {len(doc.segments)} segments (a sentence without final punctuation joins the next)")
    ways: dict[str, Callable[[], object]] = {
        "the text in one request": lambda: client.translate([document], beam_size=beam),
        "its sentences, one request each, 8 in flight": lambda: translate_each(client, sentences, 8, beam),
        "its sentences, one request each, 1 in flight": lambda: translate_each(client, sentences, 1, beam),
    }
    walls: dict[str, list[float]] = {name: [] for name in ways}
    cpus: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(rounds):  # interleaved, so that a change of load hits all three alike
        for name, way in ways.items():
            start, cpu0 = time.perf_counter(), _server_cpu_s(server_pid)
            way()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(_server_cpu_s(server_pid) - cpu0)
    wall = {name: statistics.median(w) for name, w in walls.items()}
    cpu = {name: statistics.median(c) for name, c in cpus.items()}
    print("| sent as | wall s (median) | sentences/s | words/s | server CPU s | server cores busy |")
    print("|---|---|---|---|---|---|")
    for name, w in wall.items():
        used = f"{cpu[name]:.2f} | {cpu[name] / w:.2f}" if server_pid else "- | -"
        print(f"| {name} | {w:.2f} | {n / w:.1f} | {count / w:.0f} | {used} |")
    one_by_one, text = "its sentences, one request each, 1 in flight", "the text in one request"
    print(
        f"the text in one request finishes {wall[one_by_one] / wall[text]:.1f}x sooner than its sentences one after another"
    )
    if server_pid:
        print(f"and takes {cpu[one_by_one] / cpu[text]:.1f}x less server CPU time")


def _server_cpu_s(pid: int | None) -> float:
    """The server's CPU seconds so far (0 for a server this process did not start)."""
    return process_cpu_s(pid) if pid else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quality", action="store_true")
    p.add_argument("--speed", action="store_true")
    p.add_argument("--model-dir", default="models/de-en/1")
    p.add_argument("--precision", default="int8", help="graph variant the server loads (mtserve serve --precision)")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR))
    p.add_argument("--n", type=int, default=1000, help="test sentences for --quality")
    p.add_argument("--words", type=int, default=2000, help="words of the text for --speed")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5, help="--speed: each way measured this many times (median)")
    p.add_argument("--server", help="an mtserve server to use instead of starting one")
    p.add_argument(
        "--serve-args",
        default="",
        help="more `mtserve serve` flags for the server it starts, e.g. '--decode-workers 1'",
    )
    args = p.parse_args()
    if not (args.quality or args.speed):
        p.error("give --quality, --speed or both")
    sources, refs = read_parallel(args.data, "test_2016_flickr")
    if args.server:
        run(args, args.server, sources, refs, None)
        return
    with Server(args.model_dir, ["--precision", args.precision, *shlex.split(args.serve_args)]) as server:
        run(args, server.address, sources, refs, server.pid)


def run(args: argparse.Namespace, address: str, sources: list[str], refs: list[str], server_pid: int | None) -> None:
    with Client(address, timeout=3600) as client:
        if args.quality:
            quality(client, sources[: args.n], refs[: args.n], args.beam)
        if args.speed:
            speed(client, sources, args.words, args.beam, args.rounds, server_pid)


if __name__ == "__main__":
    main()
