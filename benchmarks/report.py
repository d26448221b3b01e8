"""The report of a benchmark run: docs/benchmarks.md (or the quick run's benchmarks/results/quick.md),
its sections in order, each from its part of the results, and the latency/throughput plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.machine import cpu_name
from benchmarks.summary import Results, Row, Summary, best_offline

REPO = Path(__file__).resolve().parent.parent


def write_plot(res: Results, path: Path, beam: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5.5))
    for label, rows in _online_series(res, beam).items():
        xs = [lv["sentences_per_s"] for lv in rows]
        ys = [lv["p50_ms"] for lv in rows]
        ax.plot(xs, ys, marker="o", label=f"mtserve {label}")
        for lv in rows:
            ax.annotate(
                f"c{lv['concurrency']}",
                (lv["sentences_per_s"], lv["p50_ms"]),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    engines = sorted({r["engine"] for r in res["offline"] if "error" not in r}, key=str)
    for eng in engines:
        # Per offline engine: one sentence at a time (its single-sentence layout), and whole batches
        # at its best layout (latency = the time of one batch at the measured throughput).
        best = best_offline(res["offline"], eng, beam)
        single = next(
            (r for r in res["offline"] if r.get("engine") == eng and r.get("beam") == beam and "latency_single" in r),
            None,
        )
        if best is None:
            continue
        xs, ys = [], []
        if single:
            lat1 = single["latency_single"]["p50_ms"]
            xs.append(1000.0 / lat1)
            ys.append(lat1)
        xs.append(best["sentences_per_s"])
        ys.append(1000.0 * min(best["batch_size"], best["sentences"]) / best["sentences_per_s"])
        ax.plot(xs, ys, marker="s" if single else "x", linestyle="--", label=f"{eng} offline")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (sentences/s)")
    ax.set_ylabel("latency p50 (ms)")
    ax.set_title(f"Latency against throughput, beam {beam} ({res['mode']} run, {res['environment']['date']})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(res: Results, md: Path) -> None:
    """One latency/throughput plot per online beam: MD.png for the last (the default beam 4),
    MD-beamN.png for the others."""
    beams = res["plan"]["online_beams"]
    for b in beams:
        write_plot(res, md.with_suffix(".png") if b == beams[-1] else md.with_name(f"{md.stem}-beam{b}.png"), b)


def _online_series(res: Results, beam: int) -> dict[str, list[Row]]:
    series = {}
    for r in res.get("online", {}).get("runs", []) + res.get("sweep", []):
        if r.get("beam") == beam:
            api = "" if r.get("api", "unary") == "unary" else f" ({r['api']})"
            series[" ".join(r["server_args"]).replace("--", "") + api] = r["levels"]
    return series


def write_markdown(res: Results, path: Path, plot_name: str) -> None:
    """docs/benchmarks.md (or the quick report): its sections in order, each from its part of `res`;
    every table of this run names the CPU it was measured on."""
    measured = [
        _report_offline(res),
        _report_online(res),
        _report_batcher(res),
        _report_profile(res),
        _report_pairs(res),
        report_tracing(res),
        _report_headline(res, plot_name),
        report_real_size(res.get("real_size")),
    ]
    caption = f"Measured on {cpu_name(res['environment'])}."
    sections = [
        _report_header(res),
        _report_what_is_measured(),
        _report_machine(res),
        *(with_cpu(section, caption) for section in measured),
        report_real_size_nllb(),
        report_elsewhere(),
    ]
    path.write_text("\n".join(line for section in sections for line in section))


def with_cpu(lines: list[str], caption: str) -> list[str]:
    """`lines` with `caption` (and a blank line) before each Markdown table in them."""
    out: list[str] = []
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            if out and out[-1].strip():
                out.append("")
            out += [caption, ""]
        out.append(line)
    return out


def report_real_size(real: Row | None) -> list[str]:
    """The real-size table (benchmarks/real_size.py) beside the toy-size headline ratios."""
    from benchmarks.real_size import report_lines

    return report_lines(real) if real else []


# The NLLB-600M-sized runs (`python -m benchmarks.real_size --size nllb-600m --json ...`): not part of
# `make bench-quick` (the import alone takes minutes); the report shows the newest complete one.
NLLB_RESULTS = Path(__file__).resolve().parent / "results"
NLLB_PATTERN = "real_size-nllb-600m-2*.json"


def report_real_size_nllb(results: Path = NLLB_RESULTS) -> list[str]:
    """The real-size table of the newest NLLB-600M-sized run in `results`, captioned with the
    machine and commit it ran on (empty when there is none)."""
    from benchmarks.real_size import report_lines

    runs = sorted(results.glob(NLLB_PATTERN))
    if not runs:
        return []
    real = json.loads(runs[-1].read_text())
    m = real.get("machine", {})
    caption = f"Measured on {cpu_name(m)}, at commit {m.get('commit', '?')} ({m.get('date', '?')})."
    how = (
        f"`{real.get('command', 'python -m benchmarks.real_size --size nllb-600m')}` "
        f"([{runs[-1].name}](../benchmarks/results/{runs[-1].name}); not part of `make bench-quick`): a random M2M100"
    )
    return with_cpu(report_lines(real, "NLLB-200-distilled-600M's size", how), caption)


def report_translation_service(results: Path = NLLB_RESULTS) -> list[str]:
    """The headline figures of the newest translation-service run of the shipped models (and of the
    OPUS-MT-sized one, where there is one), beside their targets (empty when there is none)."""
    runs = sorted(results.glob("translation-service-2*.json"))
    if not runs:
        return []
    r = json.loads(runs[-1].read_text())
    rows: list[tuple[str, Any, str]] = []
    if "html" in r:
        h, cost = r["html"], r["html"]["cost_html_vs_plain"]
        one_pass = cost.get("median_of_ratios_by_group", {}).get("one_pass")
        rows += [
            ("HTML: same tags and attributes", h["tags_preserved"], "1.0"),
            (
                'HTML: text as the plain translation (no `translate="no"`, no `<br>`)',
                h["text_as_plain_applicable"],
                "1.0",
            ),
            (
                "HTML cost, median of pairs' ratios (one-pass sentences)",
                f"{cost['median_of_ratios']} ({one_pass})",
                "≤ 1.15",
            ),
        ]
    if "placement" in r:
        rows.append(("tag placement, exact", r["placement"]["all"]["exact_share"], "≥ 0.90"))
    if "glossary" in r:
        g = r["glossary"]
        rows += [
            ("glossary target where the model's word stood", g["matched"]["in_place"], "≥ 0.95"),
            ("do-not-translate verbatim", g["do_not_translate"]["verbatim"], "1.0"),
            ("glossary cost at beam 4, median of pairs' ratios", g["matched"]["cost"]["median_of_ratios"], "≤ 1.5"),
        ]
    if "detection" in r:
        rows.append(("detection right", r["detection"]["accuracy"]["all"]["right"], "≥ 0.99"))
    m = r.get("machine", {})
    L = [
        "",
        f"The newest run ([{runs[-1].name}](../benchmarks/results/{runs[-1].name}); {cpu_name(m)}, commit "
        f"{m.get('commit', '?')}, {m.get('date', '?')}; docs/markup.md and docs/terminology.md take the figures apart):",
        "",
        "| figure | value | target |",
        "| --- | --- | --- |",
        *(f"| {name} | {value} | {target} |" for name, value, target in rows),
    ]
    real = sorted(results.glob("translation-service-real-size-2*.json"))
    if real:
        q = json.loads(real[-1].read_text())
        parts = []
        if "glossary_cost" in q:
            parts.append(f"a one-entry glossary {q['glossary_cost']['median_of_ratios']}x")
        if "html" in q:
            parts.append(f"HTML {q['html']['cost_html_vs_plain']['median_of_ratios']}x")
        L += ["", f"At OPUS-MT's size ([{real[-1].name}](../benchmarks/results/{real[-1].name})): {', '.join(parts)}."]
    return L


def report_elsewhere() -> list[str]:
    """What is measured by other commands: perf_analyzer's table (docs/perf_analyzer.md, `make
    perf-analyzer`), carried into every report so that it stays beside the load generator's figures,
    and where the GPU comparison stands."""
    source = REPO / "docs" / "perf_analyzer.md"
    L = ["", "## perf_analyzer against the load generator", ""]
    text = source.read_text() if source.exists() else ""
    if "## Measured" in text:
        measured = text.split("## Measured", 1)[1].split("\n## ", 1)[0].strip()
        L += [
            "Triton's `perf_analyzer`, unchanged, against the server's KServe endpoint, beside "
            "`benchmarks/online.py` on the same server and levels (`make perf-analyzer`; from "
            "[perf_analyzer.md](perf_analyzer.md), which says how it runs; its figures are dated by the commit they were measured at):",
            "",
            measured,
        ]
    else:
        L.append("`make perf-analyzer` writes [perf_analyzer.md](perf_analyzer.md).")
    L += [
        "",
        "## Several models",
        "",
        "Fairness between two models (a c1 client on one while 64 clients flood the other, "
        "`benchmarks/fairness.py`) and hot swap under load (`benchmarks/hot_swap.py`): how they run is in "
        "[repository.md](repository.md), the figures in [performance.md](performance.md#several-models).",
        "",
        "## Translation service",
        "",
        "Markup (HTML), tag placement, glossaries and do-not-translate, and language detection, measured "
        "through the gRPC API on `mtserve serve` serving models/de-en and models/fr-en "
        "(`benchmarks/translation_service.py`, not part of this run): `python -m benchmarks.translation_service "
        "--models models --json FILE` prints one JSON line of figures beside their targets; `--only "
        "html,placement,glossary,detection` picks the parts, `--server-arg` passes flags to the server. "
        "The module's docstring says what each part sends and counts; the hand-made tag placement cases "
        "are `benchmarks/data/tag_placement.tsv`. Two revisions' costs side by side: `python -m "
        "benchmarks.ab_trees --base REV --part glossary|html` serves REV from a temporary git worktree "
        "beside the working tree and calls both in turn, case by case (`benchmarks/ab_trees.py`).",
        *report_translation_service(),
        "",
        "## GPU",
        "",
        "The CUDA comparison (the fp16 graphs on CUDA against CTranslate2 float16) has not been run: "
        '[performance.md](performance.md) ("GPU") says what it needs.',
        "",
    ]
    return L


def report_tracing(res: Results) -> list[str]:
    t = res.get("tracing")
    if not t:
        return []
    return [
        "## Tracing",
        "",
        f"The server at concurrency {t['concurrency']}, beam {t['beam']}, {t['requests']} requests, with OpenTelemetry "
        f"off and with every request traced (OTLP/gRPC to a receiver on loopback), {t['pairs']} pair(s), order "
        f"alternating (`benchmarks/tracing_overhead.py`): {t['off_sentences_per_s']:.1f} against "
        f"{t['on_sentences_per_s']:.1f} sent/s (medians); overhead {100 * t['overhead']:.1f}% of throughput, "
        f"{100 * t['cpu_overhead']:.1f}% of the server's CPU per request (negative: within the noise).",
        "",
    ]


def _report_header(res: Results) -> list[str]:
    L = [
        f"# Benchmarks ({res['mode']} run)",
        "",
        "Generated by `python -m benchmarks.run` (`make bench`; `make bench-quick` for the short mode). Do not edit by hand: "
        "rerun it.",
        "",
    ]
    if res.get("note"):
        L += [f"> **{res['note']}**", ""]
    return L


def _report_what_is_measured() -> list[str]:
    return [
        "## What is measured",
        "",
        "- **Offline** (one process per engine, `benchmarks/offline.py`): the test sentences sorted by length into "
        "batches, timed after a warm-up. `torch-eager` is the textbook loop without a cache (every step runs "
        "`Transformer.decode` over the whole prefix), over batches and at batch 1 (one sentence at a time); `torch-cache` is the reference search of `export/generate.py`; "
        "`ort-*` is `service.decoding.generator.generate` over the ONNX graphs (what the server runs, without the server); "
        "`ct2-*` is CTranslate2 over the same weights (`benchmarks/ct2_convert.py`). Layout `W x T`: W decode loops "
        "(CTranslate2: `inter_threads`) of T threads each. Single-sentence latency: one sentence per call.",
        "- **Online** (`benchmarks/online.py`): `mtserve serve` on loopback, a grpc.aio client keeps N single-sentence "
        "`Translate` requests in flight (API `unary`), or the same requests as items of one `TranslateMany` stream "
        "(API `many`); a warm-up of 2N requests, then the steady state of one closed loop: the figures of n requests "
        "that finish after its first N, with N more after them (neither the clients' start nor their drain); the "
        "client shares the cores.",
        "- **Batcher** (`benchmarks/batcher.py`): the same scheduler and decode workers in one process with no gRPC, "
        "64 sentences in flight: what batching arrivals of mixed length costs, apart from the RPC layer.",
        "- **Pairs** (`run_pairs`): CTranslate2 int8 offline and the server (a replica per core with one decode "
        "worker each, `--replicas 2 --decode-workers 1` on 2 cores) at concurrency 64 "
        "and 1, one right after the other on the same sentences, several times per beam: the headline ratios. "
        "In the same pairs, the ORT int8 engine offline, and the same server decoding with CTranslate2 int8 "
        "(`benchmarks/ct2_server.py`, the server's front on a CTranslate2 backend) at concurrency 64 and 1.",
        "- **Target tokens**: generated subword tokens, `</s>` included.",
        "",
    ]


def _report_machine(res: Results) -> list[str]:
    """The machine, the versions and the settings; the conversion check and the agreements."""
    env = res["environment"]
    L = [
        "## Machine and settings",
        "",
        f"- date: {env['date']}, commit `{env['commit']}`",
        f"- CPU: {env['cpu']}, {env.get('isa', '')}, {env['cores']} cores, {env['memory_gib']} GiB; load average at start "
        f"{', '.join(f'{x:.1f}' for x in env['load_average'])}",
        f"- Python {env['python']}; " + ", ".join(f"{k} {v}" for k, v in env["versions"].items() if v),
        f"- thread budget: {env['thread_budget']} threads for every engine; test set test_2016_flickr "
        f"(Multi30k), model models/de-en/1 (fp32 weights; int8 = dynamic quantisation at export/load)",
        f"- sentences per offline engine: {json.dumps(res['plan']['limits'])} (0 = all 1,000)",
        "",
    ]
    chk = res.get("ct2_check")
    if chk:
        L += [
            f"CTranslate2 conversion check (greedy, token for token against {chk['against']}): "
            f"**{chk['identical']} / {chk['sentences']} identical**.",
            "",
        ]
    for a in res.get("agreement", []):
        if a:
            L.append(f"- agreement {a['a']} vs {a['b']}: {a['identical']} / {a['sentences']} identical")
    return L


def _report_offline(res: Results) -> list[str]:
    L = [
        "",
        "## Offline",
        "",
        "| engine | beam | layout (loops x threads) | batch | sentences | sent/s | target tok/s | BLEU | single-sentence p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["offline"]:
        if "error" in r:
            L.append(f"| {r['engine']} | {r['beam']} | {r['workers']} | {r['batch_size']} | failed | | | | |")
            continue
        lat = r.get("latency_single", {}).get("p50_ms", "")
        L.append(
            f"| {r['engine']} | {r['beam']} | {r['workers']}x{max(1, r['threads'] // r['workers'])} | "
            f"{r['batch_size']} | {r['sentences']} | {r['sentences_per_s']:.1f} | {r['target_tokens_per_s']:.0f} | "
            f"{r['bleu']:.2f} | {lat} |"
        )
    L += [
        "",
        "BLEU is sacreBLEU (13a, cased) over the sentences translated; it is comparable between rows only "
        "when they translated the same sentences.",
        "",
    ]
    return L


def _report_online(res: Results) -> list[str]:
    L = [
        "## Online (mtserve serve on loopback, async gRPC client, one sentence per request)",
        "",
        "| beam | API | server flags | concurrency | requests | errors | sent/s | target tok/s | p50 ms | p95 ms | p99 ms "
        "| BLEU | CPU cores: server / client |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res.get("online", {}).get("runs", []) + [dict(s, sweep=True) for s in res.get("sweep", [])]:
        flags = " ".join(r["server_args"]) + (" (sweep)" if r.get("sweep") else "")
        for lv in r["levels"]:
            L.append(
                f"| {r['beam']} | {r.get('api', 'unary')} | `{flags}` | {lv['concurrency']} | {lv['requests']} | "
                f"{sum(lv['errors'].values()) if lv['errors'] else 0} | {lv['sentences_per_s']:.1f} | "
                f"{lv['target_tokens_per_s']:.0f} | {lv['p50_ms']:.1f} | {lv['p95_ms']:.1f} | {lv['p99_ms']:.1f} | "
                f"{lv['bleu']} | {lv.get('server_cpu_cores', '')} / {lv.get('client_cpu_cores', '')} |"
            )
    L += [
        "",
        f"Server defaults (flags not listed): {res.get('server_defaults', '')}. The load generator runs on "
        "the same cores as the server; the last column is the CPU each process used during the level.",
        "",
    ]
    return L


def _report_batcher(res: Results) -> list[str]:
    """The batcher alone, and the step-by-step gap to CTranslate2; nothing without a batcher part."""
    if not res.get("batcher"):
        return []
    L = [
        "## The batcher alone (in-process, no gRPC)",
        "",
        "`benchmarks/batcher.py`: the server's scheduler and decode workers (default layout) in one process, "
        "64 sentences in flight, each answer submitting the next test sentence; no RPC, no protobuf, no client "
        "process. Step figures are from the scheduler's own metrics.",
        "",
        "| beam | continuous batching | sentences | sent/s | CPU cores | p50 ms | p99 ms | rows/step | ms/step "
        "| µs/row-step |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in res["batcher"]:
        if "error" in r:
            L.append(f"| {r['beam']} | {'on' if r['continuous_batching'] else 'off'} | failed | | | | | | | |")
            continue
        L.append(
            f"| {r['beam']} | {'on' if r['continuous_batching'] else 'off'} | {r['sentences']} | "
            f"{r['sentences_per_s']:.1f} | {r['cpu_cores']} | {r['p50_ms']} | {r['p99_ms']} | "
            f"{r['rows_per_step']} | {r['ms_per_step']} | {r['us_per_row_step']} |"
        )
    L += [
        "",
        "Where the gap to CTranslate2 is, step by step (best layout or mode of each, sent/s):",
        "",
        "| beam | CT2 int8 offline | ORT int8 offline (sorted batches) | batcher c64 (mixed arrivals) | "
        "service c64 TranslateMany | service c64 Translate (gRPC, client on the same cores) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    summaries: list[Summary] = res["summary_by_beam"]
    for s in summaries:
        L.append(
            f"| {s['beam']} | {s['ct2_int8_sentences_per_s']} ({s['ct2_int8_layout']}) | "
            f"{s.get('ort_int8_sentences_per_s')} ({s.get('ort_int8_layout')}) | "
            f"{s.get('batcher_c64_sentences_per_s')} | {s.get('service_many_c64_sentences_per_s')} | "
            f"{s['service_c64_sentences_per_s']} |"
        )
    L.append("")
    return L


def _report_profile(res: Results) -> list[str]:
    """Where the server's time goes (py-spy); nothing without a profile."""
    if not res.get("profile"):
        return []
    pr = res["profile"]
    L = [
        "## Where the server's time goes",
        "",
        f"py-spy, {pr['seconds']} s at concurrency {pr['concurrency']}, beam {pr['beam']}, "
        f"{pr['samples']} busy samples (all threads):",
        "",
        "| bucket | share |",
        "| --- | --- |",
    ]
    L += [f"| {k} | {100 * v:.1f}% |" for k, v in pr["share"].items()]
    L.append("")
    return L


def _report_pairs(res: Results) -> list[str]:
    """The interleaved pairs, one row each; nothing without pairs."""
    pairs = res.get("pairs", [])
    if not pairs:
        return []
    L = [
        "## Headline ratios in interleaved pairs",
        "",
        "Each pair runs CTranslate2 int8 offline (its best layout from the offline part; single-sentence latency "
        "with 1 thread) and the server (a replica per core, one decode worker each) at concurrency 64 and 1 "
        "over 8 client connections, on the same sentences, one "
        "right after the other, alternating which goes first. The targets' ratios are the medians of the "
        "per-pair ratios.",
        "",
        "| beam | pair | service c64 sent/s | CT2 int8 sent/s | ratio | service c1 p50 ms | CT2 single p50 ms | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in pairs:
        if "error" in r:
            L.append(f"| {r['beam']} | {r['pair']} | failed | | | | | |")
            continue
        L.append(
            f"| {r['beam']} | {r['pair']} | {r['service_c64_sentences_per_s']:.1f} | {r['ct2_sentences_per_s']:.1f} | "
            f"{r['throughput_ratio']:.3f} | {r['service_c1_p50_ms']:.1f} | {r['ct2_single_p50_ms']:.1f} | "
            f"{r['latency_ratio']:.3f} |"
        )
    L.append("")
    if not any(k in r for r in pairs for k in ("engine_sentences_per_s", "ct2_served_c64_sentences_per_s")):
        return L  # results from before the ORT engine and the CTranslate2-served server were paired
    L += [
        "In the same pairs, the ORT int8 engine offline (`service.decoding.generator` over the same sentences, "
        "its best layout from the offline part; single-sentence latency with 1 thread) against CTranslate2 int8 "
        "offline, and the server against the same server decoding with CTranslate2 int8 "
        "(`benchmarks/ct2_server.py`: the same gRPC front, Engine and limits, CTranslate2's best offline layout "
        "and batch size) under the same load generator (blank: that part failed):",
        "",
        "| beam | pair | ORT engine sent/s | CT2 int8 sent/s | ratio | ORT engine single p50 ms | CT2 single p50 ms "
        "| ratio | service c64 sent/s | CT2-served c64 sent/s | ratio | service c1 p50 ms | CT2-served c1 p50 ms "
        "| ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell(r: Row, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else ""

    for r in pairs:
        cols = [
            ("engine_sentences_per_s", ".1f"),
            ("ct2_sentences_per_s", ".1f"),
            ("engine_throughput_ratio", ".3f"),
            ("engine_single_p50_ms", ".1f"),
            ("ct2_single_p50_ms", ".1f"),
            ("engine_latency_ratio", ".3f"),
            ("service_c64_sentences_per_s", ".1f"),
            ("ct2_served_c64_sentences_per_s", ".1f"),
            ("served_throughput_ratio", ".3f"),
            ("service_c1_p50_ms", ".1f"),
            ("ct2_served_c1_p50_ms", ".1f"),
            ("served_latency_ratio", ".3f"),
        ]
        L.append(f"| {r['beam']} | {r['pair']} | " + " | ".join(cell(r, k, f) for k, f in cols) + " |")
    L.append("")
    return L


def _report_headline(res: Results, plot_name: str) -> list[str]:
    """The headline ratios per beam, what they divide, and the plots."""
    L = [
        "## Headline ratios",
        "",
        "| beam | service / CT2 int8 (target >= 1.0) | c1 latency / CT2 (target <= 1.5) | "
        "service / torch eager, batched | service / torch eager, one sentence at a time (target >= 30) | "
        "best samples: service c64 / CT2 int8 | default layout, main levels / CT2 int8 | TranslateMany c64 / CT2 int8 | "
        "best samples: service c1 / CT2 single | ORT engine / CT2 int8, offline | ORT engine single / CT2 single "
        "| service c64 / CT2-served c64 | service c1 / CT2-served c1 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    summaries: list[Summary] = res["summary_by_beam"]
    for s in summaries:
        L.append(
            f"| {s['beam']} | **{s['service_over_ct2_int8']}** | **{s['latency_c1_over_ct2']}** | "
            f"{s['service_over_torch_eager']} | **{s.get('service_over_torch_eager_single')}** | "
            f"{s['service_c64_sentences_per_s']} / {s['ct2_int8_sentences_per_s']} ({s['ct2_int8_layout']}) "
            f"= {s.get('service_best_over_ct2_int8')} | "
            f"{s.get('service_default_c64_sentences_per_s')} → {s.get('service_default_over_ct2_int8')} | "
            f"{s.get('service_many_over_ct2_int8')} | "
            f"{s['service_c1_p50_ms']} / {s['ct2_single_p50_ms']} = {s.get('latency_c1_best_over_ct2')} | "
            + " | ".join(
                "not measured" if s.get(k) is None else str(s[k])
                for k in (
                    "engine_over_ct2_int8",
                    "engine_latency_over_ct2",
                    "service_over_ct2_served",
                    "latency_c1_over_ct2_served",
                )
            )
            + " |"
        )
    L += [
        "",
        "The first two columns are the medians of the interleaved pairs above (for results without pairs, the "
        "best samples). The textbook-loop ratios divide the pairs' median service throughput (or the best sample) "
        'by the PyTorch loop without a cache, run over length-sorted batches of 64 ("batched") and one sentence '
        'at a time as the Annotated Transformer does (about 20 sent/s). "best samples": the best '
        "service figure over the online levels and the sweep, against CTranslate2's figures from the offline part "
        '(minutes apart: on a drifting machine they read high or low). "TranslateMany" sends the same sentences '
        "as items of one stream. The last four columns are the medians of the pairs' second table: the ORT engine "
        "offline against CTranslate2 offline (sent/s, and single-sentence p50 with 1 thread each), and the server "
        "against the same server decoding with CTranslate2 (c64 sent/s, c1 p50). "
        "Where the time goes and why: [performance.md](performance.md).",
        "",
        f"![latency against throughput, beam 4]({plot_name})",
        "",
    ]
    for b in res["plan"]["online_beams"][:-1]:
        L += [f"![latency against throughput, beam {b}]({Path(plot_name).stem}-beam{b}.png)", ""]
    return L
