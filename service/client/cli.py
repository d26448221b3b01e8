"""`mtserve translate` and `mtserve encode`: the command-line client. `--model NAME[:VERSION]`
picks one of the models the server serves (default: the server's default model)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypedDict

import grpc

from contract.glossary import GlossaryFormatError, parse_tsv
from service.api.mtserve.v1 import translation_pb2 as pb
from service.client import DEFAULT_SERVER, Client, to_json
from service.client.alignment_plot import save_alignment


def add_security_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("TLS and authentication (docs/security.md)")
    g.add_argument("--tls", action="store_true", help="use TLS, verifying the server with the system's roots")
    g.add_argument("--ca-cert", help="PEM CA certificate(s) to verify the server with (implies --tls)")
    g.add_argument("--client-cert", help="PEM client certificate for mutual TLS (with --client-key)")
    g.add_argument("--client-key", help="PEM private key of --client-cert")
    g.add_argument("--server-name", help="name to check the server certificate against (default: the host)")
    g.add_argument(
        "--token-file",
        help="file whose first line is the bearer token (default: the MTSERVE_TOKEN environment variable)",
    )
    g.add_argument("--token", help="bearer token (visible in ps: prefer MTSERVE_TOKEN or --token-file)")


def add_model_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default="",
        metavar="NAME[:VERSION]",
        help="the served model to use, or one version of it (default: the server's default model)",
    )


def connect(args: argparse.Namespace) -> Client:
    token = args.token or os.environ.get("MTSERVE_TOKEN") or None
    if args.token_file:
        with open(args.token_file, encoding="utf-8") as f:
            token = f.readline().strip() or None
    if bool(args.client_cert) != bool(args.client_key):
        raise argparse.ArgumentTypeError("--client-cert and --client-key go together")
    return Client(
        args.server,
        timeout=args.timeout,
        tls=args.tls,
        ca_cert=args.ca_cert,
        client_cert=args.client_cert,
        client_key=args.client_key,
        token=token,
        server_name=args.server_name,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="*", help="texts to translate (or use --input)")
    p.add_argument("--server", default=DEFAULT_SERVER, help="address, comma-separated addresses, or dns:///name")
    add_model_argument(p)
    add_security_arguments(p)
    p.add_argument("--input", help="file with one source sentence per line ('-' = stdin)")
    p.add_argument(
        "--document",
        metavar="FILE",
        help="translate FILE as one text ('-' = stdin): sentence by sentence, its paragraphs and line breaks kept",
    )
    p.add_argument(
        "--split",
        choices=["sentences", "newlines", "none"],
        default="",
        help="how the server cuts each text into rows (default: sentences; docs/documents.md)",
    )
    p.add_argument("--output", help="write translations here, one per line (default stdout)")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight with --input")
    p.add_argument("--batch-size", type=int, default=16, help="lines per request with --input")
    p.add_argument("--beam", type=int, default=0, help="beam size (0 = server default)")
    p.add_argument("--max-output-tokens", type=int, default=0)
    p.add_argument(
        "--min-output-tokens", type=int, default=0, help="at least this many tokens before </s> (0 = no minimum)"
    )
    p.add_argument(
        "--source-language",
        default="",
        help="language of the texts (with --target-language, picks the model); auto: detect it (docs/language_detection.md)",
    )
    p.add_argument(
        "--detect-per-segment",
        action="store_true",
        help="with --source-language auto, detect and route each sentence instead of each text",
    )
    p.add_argument("--target-language", default="", help="language to translate into (required by multilingual models)")
    add_decoding_arguments(p)
    add_service_arguments(p)
    p.add_argument("--stream", action="store_true", help="print tokens as they are decoded")
    p.add_argument("--json", action="store_true", help="print each result as JSON (scores, tokens)")
    p.add_argument(
        "--alignment",
        metavar="PICTURE",
        help="also draw each translation's target x source attention into PICTURE (.png, .svg, .pdf; "
        "several texts: PICTURE-1.png, ...); needs the plot extra (matplotlib)",
    )
    p.add_argument("--timeout", type=float, default=60.0)


def add_service_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("markup and terminology (docs/markup.md, docs/terminology.md)")
    kind = g.add_mutually_exclusive_group()
    kind.add_argument("--html", action="store_true", help="the texts are HTML: tags kept around the translated words")
    kind.add_argument("--xml", action="store_true", help="the texts are XML")
    g.add_argument(
        "--glossary",
        metavar="FILE",
        help="terms translated one fixed way: a TSV file of source<TAB>target[<TAB>forms separated by |]",
    )
    g.add_argument(
        "--dnt", metavar="PHRASE", action="append", default=[], help="a phrase kept verbatim (repeat for more)"
    )
    g.add_argument("--glossary-id", default="", help="a glossary the model ships (GetModelInfo lists them)")


def add_decoding_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding (README: Decoding options)")
    g.add_argument(
        "--num-hypotheses", type=int, default=0, help="n-best list of this many hypotheses (at most the beam size)"
    )
    g.add_argument("--target-prefix", default="", help="forced start of every translation (part of it)")
    g.add_argument("--sampling-topk", type=int, default=0, help="sample among the k most likely tokens (k > 1)")
    g.add_argument("--sampling-topp", type=float, default=None, help="nucleus sampling: in (0, 1]")
    g.add_argument("--sampling-temperature", type=float, default=None, help="divides the logits when sampling (> 0)")
    g.add_argument("--seed", type=int, default=0, help="seed of sampling (0 = random)")


def _fail(e: grpc.RpcError) -> None:
    sys.exit(f"mtserve: {e.code().name}: {e.details()}")


def run(args: argparse.Namespace) -> None:
    args.glossary_terms = _glossary(args.glossary)  # read once, for every request
    try:
        with connect(args) as client:
            if args.alignment and (args.input or args.stream):
                raise argparse.ArgumentTypeError("--alignment works with texts given as arguments, without --stream")
            if args.document:
                _translate_document(client, args)
            elif args.input:
                _translate_file(client, args)
            elif args.texts:
                _translate_texts(client, args)
            else:
                raise argparse.ArgumentTypeError("give texts or --input FILE")
    except grpc.RpcError as e:
        _fail(e)


class _RequestFields(TypedDict):
    model: str
    source_language: str
    target_language: str
    beam_size: int
    max_output_tokens: int
    min_output_tokens: int
    num_hypotheses: int
    sampling_topk: int
    sampling_topp: float | None
    sampling_temperature: float | None
    seed: int
    split: str
    text_type: str
    glossary: list[tuple[str, str, tuple[str, ...]]]
    do_not_translate: list[str]
    glossary_id: str
    detect_per_segment: bool


def _glossary(path: str | None) -> list[tuple[str, str, tuple[str, ...]]]:
    """--glossary FILE's terms (contract.glossary's format)."""
    if not path:
        return []
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"--glossary: cannot read {path}: {e}") from None
    try:
        return [(source, target, forms) for _, source, target, forms in parse_tsv(text, path)]
    except GlossaryFormatError as e:
        raise argparse.ArgumentTypeError(f"--glossary: {e}") from None


def _request_fields(args: argparse.Namespace) -> _RequestFields:
    """The model, languages and options every translate request of the command carries."""
    return _RequestFields(
        model=args.model,
        source_language=args.source_language,
        target_language=args.target_language,
        beam_size=args.beam,
        max_output_tokens=args.max_output_tokens,
        min_output_tokens=args.min_output_tokens,
        num_hypotheses=args.num_hypotheses,
        sampling_topk=args.sampling_topk,
        sampling_topp=args.sampling_topp,
        sampling_temperature=args.sampling_temperature,
        seed=args.seed,
        split=args.split,
        text_type="html" if args.html else "xml" if args.xml else "",
        glossary=args.glossary_terms,
        do_not_translate=args.dnt,
        glossary_id=args.glossary_id,
        detect_per_segment=args.detect_per_segment,
    )


def _prefixes(args: argparse.Namespace, n: int) -> list[str]:
    """--target-prefix for each of `n` texts (none without it)."""
    return [args.target_prefix] * n if args.target_prefix else []


def _translate_texts(client: Client, args: argparse.Namespace) -> None:
    if args.stream:
        for text in args.texts:
            for msg in client.translate_stream(text, target_prefix=args.target_prefix, **_request_fields(args)):
                if msg.HasField("chunk"):
                    print(msg.chunk.text, end="", flush=True)
            print()
        return
    results = client.translate(
        args.texts,
        target_prefixes=_prefixes(args, len(args.texts)),
        **_request_fields(args),
        return_scores=args.json or args.num_hypotheses > 1,
        return_tokens=args.json,
        return_alignment=bool(args.alignment),
    )
    for r in results:
        print(to_json(r) if args.json else r.text)
        if r.hypotheses and not args.json:  # the n-best list, best first: score, tab, text
            print("".join(f"  {h.score:.4f}\t{h.text}\n" for h in r.hypotheses), end="")
    if args.alignment:
        _draw_alignments(args.alignment, args.texts, results)


def _draw_alignments(picture: str, texts: list[str], results: list[pb.Translation]) -> None:
    path = Path(picture)
    for i, (text, r) in enumerate(zip(texts, results), start=1):
        out = path if len(texts) == 1 else path.with_name(f"{path.stem}-{i}{path.suffix}")
        save_alignment(r, out, source_text=text)
        print(f"alignment: {out}", file=sys.stderr)


def _translate_document(client: Client, args: argparse.Namespace) -> None:
    """--document: the whole file as one text; the translation keeps its paragraphs."""
    src = sys.stdin if args.document == "-" else open(args.document, encoding="utf-8")
    with src:
        text = src.read()
    dst = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with dst if args.output else open(1, "w", closefd=False) as f:
        if args.stream:
            for msg in client.translate_stream(text, target_prefix=args.target_prefix, **_request_fields(args)):
                if msg.HasField("chunk"):
                    f.write(msg.chunk.text)
                    f.flush()
        else:
            (result,) = client.translate([text], target_prefixes=_prefixes(args, 1), **_request_fields(args))
            f.write(result.text)


def _translate_file(client: Client, args: argparse.Namespace) -> None:
    from tqdm import tqdm

    src = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
    with src:
        lines = [line.rstrip("\n") for line in src]
    chunks = [lines[i : i + args.batch_size] for i in range(0, len(lines), args.batch_size)]

    def work(chunk: list[str]) -> list[str]:
        # Blank lines stay blank instead of being sent (the server rejects empty texts).
        keep = [i for i, t in enumerate(chunk) if t.strip()]
        out = [""] * len(chunk)
        if keep:
            for i, r in zip(
                keep,
                client.translate(
                    [chunk[i] for i in keep], target_prefixes=_prefixes(args, len(keep)), **_request_fields(args)
                ),
            ):
                out[i] = r.text
        return out

    results: list[list[str]] = []
    with (
        ThreadPoolExecutor(max(1, args.concurrency)) as pool,
        tqdm(total=len(lines), unit="sent", disable=not sys.stderr.isatty() and args.output is None) as bar,
    ):
        for out in pool.map(work, chunks):
            results.append(out)
            bar.update(len(out))
    dst = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with dst if args.output else open(1, "w", closefd=False) as f:
        for out in results:
            f.writelines(t + "\n" for t in out)


def add_encode_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="+")
    p.add_argument("--server", default=DEFAULT_SERVER)
    add_model_argument(p)
    p.add_argument("--tokens", action="store_true", help="also print per-token vectors")
    add_security_arguments(p)
    p.add_argument("--timeout", type=float, default=60.0)


def run_encode(args: argparse.Namespace) -> None:
    try:
        with connect(args) as client:
            for text, e in zip(
                args.texts, client.encode(args.texts, return_token_embeddings=args.tokens, model=args.model)
            ):
                item = {"text": text, "tokens": e["tokens"], "pooled": [round(float(x), 6) for x in e["pooled"]]}
                if args.tokens:
                    item["token_embeddings"] = [[round(float(x), 6) for x in row] for row in e["token_embeddings"]]
                print(json.dumps(item, ensure_ascii=False))
    except grpc.RpcError as e:
        _fail(e)
