"""The real-size benchmark: a random OPUS-MT-sized Marian (benchmarks/real_size_model.py: d_model
512, 6+6 layers, 8 heads, ffn 2048, vocabulary 58,101) on every engine, each forced to the same
number of target tokens a sentence (`--tokens`, 30 by default: benchmarks/real_size_worker.py says
how each engine is told), so that the work per sentence is identical.

    python -m benchmarks.real_size --quick      # a few minutes once the model is built
    python -m benchmarks.real_size              # more sentences and pairs
    python -m benchmarks.real_size_profile      # where a greedy step's time goes (ORT's profiler)
    python -m benchmarks.real_size --quick --shortlist-only    # the shortlist rows alone (no server)
    python -m benchmarks.real_size --quick --size nllb-600m    # NLLB-200-distilled-600M's size instead

`--size nllb-600m` (benchmarks/real_size_nllb.py): a random M2M100 of NLLB-600M's dimensions (d_model
1024, 12+12 layers, 16 heads, ffn 4096, vocabulary 256,206) with NLLB's tokenizer layout, imported
int8 only, translating deu_Latn -> eng_Latn (eng_Latn forced first on every engine, the `tokens`
after it); `nllb_plan`: fewer sentences, the engine, CTranslate2 and the server only.

Engines, each in a process of its own with its model loaded once (real_size_worker.py):
  mtserve       the engine offline: service.decoding.generator over OnnxSeq2Seq int8, at the best of
                the plan's layouts (decode loops x threads), and one sentence on 1 thread
  ct2           CTranslate2 int8 offline (inter_threads = loops), with CT2_FORCE_CPU_ISA unset
                (its own pick: AVX2 on AMD) and AVX512: the faster is used; one sentence on 1 thread
  hf-ort-int8, hf-ort-fp32   optimum's ORTModelForSeq2SeqLM (its own venv: real_size_model.hf_venv),
                1 loop x 2 threads
  hf-torch      transformers' generate in PyTorch fp32, 2 threads
                (--quick runs optimum int8 alone of these three, unless --all-hf)
  service       `mtserve serve` on the imported model (one process, a decode worker per core sharing
                one session set: `benchmarks.plan.served_layout_real_size`), under
                benchmarks/online.py's load generator at concurrency 64 and 1
  shortlist     (greedy) the engine over a vocabulary shortlist (`mtserve shortlist --per-source 50
                --always 100` from the corpus's training pairs: shortlist_copies.prepare_shortlist)
                and CTranslate2 int8 with the same mapping (`use_vmap`), offline and one sentence,
                each against CTranslate2 int8 without a mapping, each other, and the plain engine
Per beam, a choice of layout and ISA (one run each), then `rounds` interleaved pairs (A B, B A, ...)
of each ratio's two sides; a ratio is the median of the pairs'. Peak RSS: VmHWM of each engine's
offline process at its best layout once its model is loaded (`*_after_load`) and after its runs
(the server: once warmed up before any traffic, and after its runs its largest process and all its
processes together); and what each holds once loaded (VmRSS, `*_held`: the server's load measures
its decoder step on batches of up to 64 rows, whose peak VmHWM keeps); `disk_mb`: the imported version's files and CTranslate2's model dir. The last line printed is the JSON object `run.py --quick` nests as
`real_size` (`summary`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmarks.machine import machine
from benchmarks.real_size_memory import precision_set_mb
from benchmarks.real_size_memory import ratios as memory_ratios
from benchmarks.real_size_memory import report_lines as memory_report_lines
from benchmarks.real_size_model import DATA, MARIAN, Dims, Family, Prepared, export_optimum, hf_venv, prepare
from benchmarks.real_size_nllb import NLLB, NLLB_600M
from benchmarks.shortlist_copies import SHORTLIST, prepare_shortlist
from benchmarks.shortlist_copies import candidate_counts as counts

REPO = Path(__file__).resolve().parent.parent
Row = dict[str, Any]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class RealSizePlan:
    """Sentences, pairs and layouts of a real-size run."""

    tokens: int = 30  # target tokens a sentence, every engine
    beams: list[int] = field(default_factory=lambda: [1, 4])
    sentences: dict[int, int] = field(default_factory=lambda: {1: 128, 4: 64})  # offline, by beam
    hf_sentences: dict[int, int] = field(default_factory=lambda: {1: 32, 4: 16})  # optimum and PyTorch
    single: int = 6  # single-sentence calls per latency figure
    rounds: int = 3  # interleaved pairs per ratio
    requests: int = 128  # at concurrency 64
    threads: int = 2
    batch: int = 32
    layouts: list[int] = field(default_factory=lambda: [2, 1])  # the engine's decode loops to choose from
    isas: list[str] = field(default_factory=lambda: ["", "AVX512"])  # CT2_FORCE_CPU_ISA ("": its own pick)
    hf_engines: list[str] = field(default_factory=lambda: ["hf-ort-int8", "hf-ort-fp32", "hf-torch"])
    shortlist_beams: list[int] = field(default_factory=lambda: [1])  # beams of the shortlist rows
    shortlist: list[int] = field(default_factory=lambda: list(SHORTLIST))  # per source token, always


def quick_plan() -> RealSizePlan:
    """`make bench-quick`'s: optimum int8 only of the Hugging Face engines (engine_over_hf), whose
    beam-4 runs alone take minutes on 2 cores."""
    return RealSizePlan(hf_engines=["hf-ort-int8"])


def hf_plan() -> RealSizePlan:
    """The quick plan with every Hugging Face engine (optimum fp32 and PyTorch too)."""
    return RealSizePlan()


def full_plan() -> RealSizePlan:
    return RealSizePlan(sentences={1: 500, 4: 250}, hf_sentences={1: 100, 4: 50}, single=20, rounds=5, requests=500)


def nllb_plan(plan: RealSizePlan, quick: bool) -> RealSizePlan:
    """`plan` for the NLLB-600M size (`--size nllb-600m`), whose steps take about 8 times the
    OPUS-MT size's: a quarter of the sentences (--quick: 32 greedy, 16 beam 4, 3 single, 64
    requests at c64), no Hugging Face engine and no shortlist rows (a version's shortlist is one
    source -> target mapping whatever a request's target language: docs/performance.md)."""
    sentences = {1: 32, 4: 16} if quick else {1: 128, 4: 64}
    single, requests = (3, 64) if quick else (6, 128)
    return replace(plan, sentences=sentences, single=single, requests=requests, hf_engines=[], shortlist_beams=[])


# --size: the model's dimensions and family (how its folder is built and imported)
SIZES = {"opus-mt": (Dims(), MARIAN), "nllb-600m": (NLLB_600M, NLLB)}


class Worker:
    """One real_size_worker.py process: `ask` sends a command and returns its answer."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None = None):
        self.name = name
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, **(env or {})}
        )
        self.ready = self._read()

    def _read(self) -> Row:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited with {self.proc.wait()}")
        answer: Row = json.loads(line)
        return answer

    def ask(self, **cmd: Any) -> Row:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def worker(
    engine: str,
    model_dir: Path,
    hf: Path,
    workers: int,
    threads: int,
    batch: int,
    python: str = sys.executable,
    isa: str = "",
    shortlist: bool = False,
    tgt_lang: str = "",
) -> Worker:
    cmd = [python, "-m", "benchmarks.real_size_worker", "--engine", engine, "--dir", str(model_dir), "--hf", str(hf)]
    cmd += ["--data", str(DATA), "--threads", str(threads), "--workers", str(workers), "--batch", str(batch)]
    cmd += (["--shortlist"] if shortlist else []) + (["--tgt-lang", tgt_lang] if tgt_lang else [])
    name = f"{engine} {workers}x{max(1, threads // workers)}" + (f" ISA {isa}" if isa else "")
    name += " shortlist" if shortlist else ""
    return Worker(name, cmd, {"CT2_FORCE_CPU_ISA": isa} if isa else None)


@dataclass
class Engines:
    """The workers of a run, by role."""

    engine: dict[int, Worker]  # by decode loops
    engine_single: Worker
    ct2: dict[str, Worker]  # by ISA
    ct2_single: dict[str, Worker]
    hf: dict[str, Worker]

    def all(self) -> list[Worker]:
        return [
            *self.engine.values(),
            self.engine_single,
            *self.ct2.values(),
            *self.ct2_single.values(),
            *self.hf.values(),
        ]


def start_engines(plan: RealSizePlan, prep: Prepared, optimum: tuple[Path, Path] | None, python_hf: str) -> Engines:
    t, b, hf = plan.threads, plan.batch, prep.hf
    hf_workers = {}
    for name in plan.hf_engines:
        if name == "hf-torch":
            hf_workers[name] = worker(name, hf, hf, 1, t, b)
        elif optimum is not None:
            hf_workers[name] = worker(name, optimum[0 if name.endswith("fp32") else 1], hf, 1, t, b, python_hf)
    lang = prep.tgt_lang
    return Engines(
        engine={w: worker("mtserve", prep.model, hf, w, t, b, tgt_lang=lang) for w in plan.layouts},
        engine_single=worker("mtserve", prep.model, hf, 1, 1, b, tgt_lang=lang),
        ct2={isa: worker("ct2", prep.ct2, hf, t, t, b, isa=isa, tgt_lang=lang) for isa in plan.isas},
        ct2_single={isa: worker("ct2", prep.ct2, hf, 1, 1, b, isa=isa, tgt_lang=lang) for isa in plan.isas},
        hf=hf_workers,
    )


def offline(w: Worker, plan: RealSizePlan, beam: int, n: int) -> Row:
    out = w.ask(op="offline", beam=beam, tokens=plan.tokens, sentences=n)
    if out["min_tokens"] != plan.tokens or out["max_tokens"] != plan.tokens:
        raise RuntimeError(f"{w.name} emitted {out['min_tokens']}..{out['max_tokens']} tokens, not {plan.tokens}")
    return out


def fastest(workers: dict[Any, Worker], plan: RealSizePlan, beam: int, op: str) -> tuple[Any, Row]:
    """The key of the fastest worker (one run each) and every run's figure."""
    n = plan.sentences[beam] if op == "offline" else plan.single
    figs = {}
    for key, w in workers.items():
        if op == "offline":
            figs[key] = offline(w, plan, beam, n)["sentences_per_s"]
        else:
            figs[key] = w.ask(op="single", beam=beam, tokens=plan.tokens, sentences=n)["p50_ms"]
    best = max(figs, key=lambda k: figs[k]) if op == "offline" else min(figs, key=lambda k: figs[k])
    return best, {str(k): v for k, v in figs.items()}


Part = Callable[[], float]


def pairs(a: Part, b: Part, rounds: int) -> Row:
    """`rounds` interleaved pairs (A B, B A, ...): every pair's figures and the median of a / b."""
    runs = []
    for i in range(rounds):
        if i % 2 == 0:
            x = a()
            y = b()
        else:
            y = b()
            x = a()
        runs.append((x, y))
    return {
        "a": [x for x, _ in runs],
        "b": [y for _, y in runs],
        "ratio": round(statistics.median(x / y for x, y in runs), 3),
    }


def rss_mb(w: Worker) -> float:
    return round(w.ask(op="rss")["vm_hwm_kb"] / 1024, 1)


def _status_mb(pid: int, field: str) -> float:
    """A memory field of /proc/PID/status (VmHWM, VmRSS) in MB; 0 where it has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    return 0.0


def server_rss_mb(pid: int) -> tuple[float, float]:
    """The server's peak RSS: (its largest replica's or its own, all its processes together)."""
    from benchmarks.processes import replica_pids

    figs = [_status_mb(p, "VmHWM") for p in [pid, *replica_pids(pid)]]
    return round(max(figs), 1), round(sum(figs), 1)


def server_held_mb(pid: int) -> float:
    """What the server holds now (VmRSS), its largest process's: after its load, what it keeps."""
    from benchmarks.processes import replica_pids

    return round(max(_status_mb(p, "VmRSS") for p in [pid, *replica_pids(pid)]), 1)


def server_level(
    address: str, texts: list[str], plan: RealSizePlan, beam: int, concurrency: int, languages: dict | None = None
) -> Row:
    """The server at `concurrency` on `texts`, every sentence forced to the plan's tokens; `languages`:
    the source_language and target_language a multilingual model's requests name."""
    from benchmarks import online

    n = plan.requests if concurrency > 1 else plan.single
    options = {"min_output_tokens": plan.tokens, "max_output_tokens": plan.tokens + 1}  # + the final </s>
    row = online.run_level(
        address, texts, texts, concurrency, n, beam, connections=8, options=options, fields=languages
    )
    if row["errors"] or row["ok"] == 0:
        raise RuntimeError(f"server at c{concurrency}: errors {row['errors']}")
    # output_tokens counts the </s>; the figures are rounded, so compare the mean per sentence
    if round(row["target_tokens_per_s"] * row["seconds"] / row["ok"]) != plan.tokens + 1:
        raise RuntimeError(f"server at c{concurrency}: not {plan.tokens} tokens a sentence")
    return row


def choose_layouts(plan: RealSizePlan, eng: Engines, beam: int) -> Row:
    """A beam's row begun with each engine's best: the engine's decode loops, CTranslate2's ISA
    offline and for one sentence, and the figures behind the choices."""
    loops, layout_figs = fastest(eng.engine, plan, beam, "offline")
    isa, isa_figs = fastest(eng.ct2, plan, beam, "offline")
    single_isa, single_isa_figs = fastest(eng.ct2_single, plan, beam, "single")
    log(
        f"real size beam {beam}: engine loops {layout_figs} sent/s -> {loops}; CT2 ISA {isa_figs} sent/s -> "
        f"{isa or 'default'}, single {single_isa_figs} ms -> {single_isa or 'default'}"
    )
    row: Row = {"beam": beam, "engine_loops": loops, "ct2_isa": isa or "default"}
    row["ct2_single_isa"], row["isas_single_p50_ms"] = single_isa or "default", single_isa_figs
    row["layouts_sentences_per_s"], row["isas_sentences_per_s"] = layout_figs, isa_figs
    return row


def measure_beam(
    plan: RealSizePlan, eng: Engines, address: str, texts: list[str], beam: int, languages: dict | None = None
) -> Row:
    """One beam: the choices of layout and ISA, then the pairs behind each ratio (the server's
    requests name `languages`: `server_level`)."""
    n, n_hf, tokens = plan.sentences[beam], plan.hf_sentences[beam], plan.tokens
    row = choose_layouts(plan, eng, beam)
    loops: int = row["engine_loops"]
    isa, single_isa = (row[k].replace("default", "") for k in ("ct2_isa", "ct2_single_isa"))
    ours, ct2 = eng.engine[loops], eng.ct2[isa]

    def off(w: Worker, k: int = n) -> Part:
        return lambda: float(offline(w, plan, beam, k)["sentences_per_s"])

    def single(w: Worker) -> Part:
        return lambda: float(w.ask(op="single", beam=beam, tokens=tokens, sentences=plan.single)["p50_ms"])

    def served(c: int, key: str) -> Part:
        return lambda: float(server_level(address, texts, plan, beam, c, languages)[key])

    row["engine_over_ct2_int8"] = pairs(off(ours), off(ct2), plan.rounds)
    row["engine_latency_over_ct2"] = pairs(single(eng.engine_single), single(eng.ct2_single[single_isa]), plan.rounds)
    row["service_over_ct2_int8"] = pairs(served(64, "sentences_per_s"), off(ct2), plan.rounds)
    row["latency_c1_over_ct2"] = pairs(served(1, "p50_ms"), single(eng.ct2_single[single_isa]), plan.rounds)
    if "hf-ort-int8" in eng.hf:
        row["engine_over_hf"] = pairs(off(ours, n_hf), off(eng.hf["hf-ort-int8"], n_hf), plan.rounds)
    row["hf"] = {
        name: {
            "sentences_per_s": offline(w, plan, beam, n_hf)["sentences_per_s"],
            "single_p50_ms": w.ask(op="single", beam=beam, tokens=tokens, sentences=max(2, plan.single // 2))["p50_ms"],
        }
        for name, w in eng.hf.items()
    }
    for key in (
        "engine_over_ct2_int8",
        "engine_latency_over_ct2",
        "service_over_ct2_int8",
        "latency_c1_over_ct2",
        "engine_over_hf",
    ):
        if key in row:
            log(f"  {key}: {row[key]['a']} / {row[key]['b']} -> {row[key]['ratio']}")
    log(f"  hf: {row['hf']}")
    return row


RATIOS = (
    "engine_over_ct2_int8",
    "engine_latency_over_ct2",
    "service_over_ct2_int8",
    "latency_c1_over_ct2",
    "engine_over_hf",
)


SHORTLIST_RATIOS = (
    "shortlist_engine_over_ct2_int8",
    "shortlist_latency_over_ct2",
    "shortlist_engine_over_ct2_vmap",
    "shortlist_latency_over_ct2_vmap",
    "shortlist_engine_over_engine",
    "shortlist_latency_over_engine",
)


def offline_part(w: Worker, plan: RealSizePlan, beam: int) -> Part:
    return lambda: float(offline(w, plan, beam, plan.sentences[beam])["sentences_per_s"])


def single_part(w: Worker, plan: RealSizePlan, beam: int) -> Part:
    return lambda: float(w.ask(op="single", beam=beam, tokens=plan.tokens, sentences=plan.single)["p50_ms"])


def candidate_counts(prep: Prepared, shortlist_file: Path) -> Row:
    """The mean K a step ranks over the test sentences (shortlist_copies.candidate_counts)."""
    from transformers import AutoTokenizer

    return counts(shortlist_file, AutoTokenizer.from_pretrained(str(prep.hf))(_test_texts()).input_ids)


def measure_shortlist(plan: RealSizePlan, eng: Engines, prep: Prepared, row: Row) -> Row:
    """The shortlist rows of one beam (`row`: its plain row, for the layout and ISAs chosen there):
    the engine over the version's shortlist (prepare_shortlist) and CTranslate2 over the same
    mapping (use_vmap), each in interleaved pairs against CTranslate2 int8 without a mapping, the
    other, and the engine without the shortlist."""
    beam, loops = row["beam"], row["engine_loops"]
    isa, single_isa = (row[k].replace("default", "") for k in ("ct2_isa", "ct2_single_isa"))
    model, ct2_vmap = prepare_shortlist(prep, (plan.shortlist[0], plan.shortlist[1]))
    t, b, hf = plan.threads, plan.batch, prep.hf
    ours = worker("mtserve", model, hf, loops, t, b, shortlist=True)
    ours_single = worker("mtserve", model, hf, 1, 1, b, shortlist=True)
    theirs = worker("ct2", ct2_vmap, hf, t, t, b, isa=isa, shortlist=True)
    theirs_single = worker("ct2", ct2_vmap, hf, 1, 1, b, isa=single_isa, shortlist=True)
    off, single, n = (lambda w: offline_part(w, plan, beam)), (lambda w: single_part(w, plan, beam)), plan.rounds
    try:
        out: Row = {
            "size": plan.shortlist,
            "k": candidate_counts(prep, model / "onnx" / "shortlist.npz"),
            "shortlist_engine_over_ct2_int8": pairs(off(ours), off(eng.ct2[isa]), n),
            "shortlist_latency_over_ct2": pairs(single(ours_single), single(eng.ct2_single[single_isa]), n),
            "shortlist_engine_over_ct2_vmap": pairs(off(ours), off(theirs), n),
            "shortlist_latency_over_ct2_vmap": pairs(single(ours_single), single(theirs_single), n),
            "shortlist_engine_over_engine": pairs(off(ours), off(eng.engine[loops]), n),
            "shortlist_latency_over_engine": pairs(single(ours_single), single(eng.engine_single), n),
            "rss_mb": {"engine_shortlist": rss_mb(ours), "ct2_int8_vmap": rss_mb(theirs)},
        }
    finally:
        for w in (ours, ours_single, theirs, theirs_single):
            w.close()
    for key in SHORTLIST_RATIOS:
        log(f"  {key}: {out[key]['a']} / {out[key]['b']} -> {out[key]['ratio']}")
    log(f"  shortlist {plan.shortlist}: mean K {out['k']}")
    return out


def shortlist_summary(sl: Row) -> Row:
    """The shortlist keys of a beam's `real_size` summary: the ratios and the figures behind them."""
    s: Row = {k: sl[k]["ratio"] for k in SHORTLIST_RATIOS}
    s["shortlist_size"] = sl["size"]
    s["shortlist_k_single"], s["shortlist_k_batch32"] = sl["k"]["k_single"], sl["k"]["k_batch32"]
    for key, name in (("shortlist_engine_over_ct2_int8", "sentences_per_s"), ("shortlist_latency_over_ct2", "p50_ms")):
        s[f"shortlist_engine_{name}"] = statistics.median(sl[key]["a"])
        s[f"shortlist_ct2_int8_{name}"] = statistics.median(sl[key]["b"])
    s["ct2_vmap_sentences_per_s"] = statistics.median(sl["shortlist_engine_over_ct2_vmap"]["b"])
    s["ct2_vmap_p50_ms"] = statistics.median(sl["shortlist_latency_over_ct2_vmap"]["b"])
    return s


def summary(rows: list[Row], rss: dict[str, float]) -> Row:
    """The `real_size` object of `make bench-quick`: per beam the median ratios and the figures
    behind them, and each engine's peak RSS (MB)."""
    by_beam = {}
    for r in rows:
        s: Row = {k: r[k]["ratio"] for k in RATIOS if k in r}
        if "engine_over_ct2_int8" in r:  # a --shortlist-only run has the shortlist rows alone
            s["engine_sentences_per_s"] = statistics.median(r["engine_over_ct2_int8"]["a"])
            s["ct2_int8_sentences_per_s"] = statistics.median(r["engine_over_ct2_int8"]["b"])
            s["engine_single_p50_ms"] = statistics.median(r["engine_latency_over_ct2"]["a"])
            s["ct2_single_p50_ms"] = statistics.median(r["engine_latency_over_ct2"]["b"])
            s["service_c64_sentences_per_s"] = statistics.median(r["service_over_ct2_int8"]["a"])
            s["service_c1_p50_ms"] = statistics.median(r["latency_c1_over_ct2"]["a"])
        s["engine_loops"], s["ct2_isa"] = r["engine_loops"], r["ct2_isa"]
        s["ct2_single_isa"] = r.get("ct2_single_isa", r["ct2_isa"])
        for name, figs in r.get("hf", {}).items():
            s[f"{name.replace('-', '_')}_sentences_per_s"] = figs["sentences_per_s"]
            s[f"{name.replace('-', '_')}_single_p50_ms"] = figs["single_p50_ms"]
        if "shortlist" in r:
            s |= shortlist_summary(r["shortlist"])
        by_beam[str(r["beam"])] = s
    return {"by_beam": by_beam, "peak_rss_mb": rss}


def disk_mb(path: Path) -> float:
    """The bytes of the files under `path` (each hard-linked file once), in MB."""
    seen = {(f.stat().st_dev, f.stat().st_ino): f.stat().st_size for f in path.rglob("*") if f.is_file()}
    return round(sum(seen.values()) / 2**20, 1)


def measure(plan: RealSizePlan, dims: Dims = Dims(), family: Family = MARIAN) -> Row:
    """Build (or reuse) the model, start every engine and the server, measure each beam."""
    from benchmarks.plan import served_layout_real_size
    from benchmarks.processes import Server

    t0 = time.time()
    prep = prepare(dims, family=family)
    optimum, python_hf, hf_error = None, "", ""
    if any(e.startswith("hf-ort") for e in plan.hf_engines):
        try:
            python_hf = str(hf_venv())
            optimum = export_optimum(prep.hf, prep.model.parent.parent.parent, Path(python_hf))
        except (subprocess.CalledProcessError, OSError) as e:
            hf_error = f"optimum unavailable: {e}"
            log(hf_error)
    texts = _test_texts()
    languages = {k: v for k, v in (("source_language", family.src_lang), ("target_language", family.tgt_lang)) if v}
    eng = start_engines(plan, prep, optimum, python_hf)
    try:
        server_args = served_layout_real_size(plan.threads)
        with Server(prep.model, server_args) as srv:
            warm, _ = server_rss_mb(srv.pid)  # the model loaded and warmed up, before any traffic
            held = server_held_mb(srv.pid)
            rows = [measure_beam(plan, eng, srv.address, texts, beam, languages) for beam in plan.beams]
            replica, server_total = server_rss_mb(srv.pid)
        rss = {"service_after_warm_up": warm, "service_replica": replica, "service_all_processes": server_total}
        rss["service_after_warm_up_held"] = held
        ours, theirs = eng.engine[rows[-1]["engine_loops"]], eng.ct2[rows[-1]["ct2_isa"].replace("default", "")]
        rss["engine_after_load"] = round(ours.ready["vm_hwm_kb"] / 1024, 1)  # the layouts of the last beam
        rss["ct2_int8_after_load"] = round(theirs.ready["vm_hwm_kb"] / 1024, 1)
        rss["engine_after_load_held"] = round(ours.ready["vm_rss_kb"] / 1024, 1)
        rss["ct2_int8_after_load_held"] = round(theirs.ready["vm_rss_kb"] / 1024, 1)
        rss["engine"], rss["ct2_int8"] = rss_mb(ours), rss_mb(theirs)
        rss.update({name.replace("-", "_"): rss_mb(w) for name, w in eng.hf.items()})
        for r in rows:
            if r["beam"] in plan.shortlist_beams:
                r["shortlist"] = measure_shortlist(plan, eng, prep, r)
                rss.update(r["shortlist"]["rss_mb"])
    finally:
        for w in eng.all():
            w.close()
    disk = {
        "engine_version": disk_mb(prep.model),
        "engine_int8": precision_set_mb(prep.model / "onnx"),
        "ct2_int8": disk_mb(prep.ct2),
    }
    out = {**result(plan, dims, rows, rss, t0, hf_error), "server_args": server_args, "disk_mb": disk}
    out["summary"]["disk_and_memory"] = memory_ratios(disk, rss)
    return out


def result(plan: RealSizePlan, dims: Dims, rows: list[Row], rss: dict[str, float], t0: float, hf_error: str) -> Row:
    """A run's JSON: its plan and dimensions, the rows per beam, the summary and the seconds it took."""
    return {
        "plan": asdict(plan),
        "dims": asdict(dims),
        "rows": rows,
        "hf_error": hf_error,
        "summary": summary(rows, rss),
        "seconds": round(time.time() - t0, 1),
    }


def measure_shortlist_only(plan: RealSizePlan, dims: Dims = Dims()) -> Row:
    """The shortlist rows alone (`--shortlist-only`, a few minutes): the engine's layout and
    CTranslate2's ISAs chosen as measure_beam chooses them, then measure_shortlist; no server and
    no Hugging Face engine."""
    t0 = time.time()
    prep = prepare(dims)
    plan = RealSizePlan(**{**asdict(plan), "hf_engines": []})
    eng = start_engines(plan, prep, None, "")
    rows: list[Row] = []
    rss: dict[str, float] = {}
    try:
        for beam in plan.shortlist_beams:
            row = choose_layouts(plan, eng, beam)
            row["shortlist"] = measure_shortlist(plan, eng, prep, row)
            rss.update(row["shortlist"]["rss_mb"])
            rows.append(row)
    finally:
        for w in eng.all():
            w.close()
    return result(plan, dims, rows, rss, t0, "")


def report_lines(
    real: Row,
    title: str = "Real size (an OPUS-MT-sized model)",
    how: str = "`python -m benchmarks.real_size` (part of `make bench-quick`): a random Marian",
) -> list[str]:
    """The real-size section of docs/benchmarks.md: per beam the ratios (the medians of the
    interleaved pairs) with the issue's targets, the figures behind them, peak RSS, and disk and
    memory against CTranslate2 (benchmarks/real_size_memory.py)."""
    plan, dims = real["plan"], real["dims"]
    L = [
        f"## {title}",
        "",
        f"{how} of d_model {dims['d_model']}, "
        f"{dims['layers']}+{dims['layers']} layers, {dims['heads']} heads, ffn {dims['ffn']}, vocabulary {dims['vocab']:,}, "
        f"every engine forced to {plan['tokens']} target tokens a sentence; {plan['threads']} threads per engine; "
        f"ratios are the medians of {plan['rounds']} interleaved pairs."
        + (f" The server: `mtserve serve {' '.join(real['server_args'])}`." if real.get("server_args") else ""),
        "",
        "| beam | engine / CT2 int8 offline (>= 1.0) | engine single / CT2 single, 1 thread (<= 1.0) | "
        "server c64 / CT2 int8 offline (>= 0.9) | server c1 p50 / CT2 single (<= 1.15) | engine / optimum int8 | "
        "engine, CT2 int8 (ISA) sent/s | engine, CT2 (ISA) single p50 ms | server c64 sent/s, c1 p50 ms | "
        "optimum int8, fp32, PyTorch sent/s | optimum int8, fp32, PyTorch single p50 ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for beam, s in real["summary"]["by_beam"].items():
        if "engine_over_ct2_int8" not in s:  # a --shortlist-only run's
            continue
        hf = [("hf_ort_int8", "optimum int8"), ("hf_ort_fp32", "optimum fp32"), ("hf_torch", "PyTorch")]
        L.append(
            f"| {beam} | **{s.get('engine_over_ct2_int8')}** | **{s.get('engine_latency_over_ct2')}** | "
            f"**{s.get('service_over_ct2_int8')}** | **{s.get('latency_c1_over_ct2')}** | {s.get('engine_over_hf') or '-'} | "
            f"{s['engine_sentences_per_s']} ({s['engine_loops']} loops), {s['ct2_int8_sentences_per_s']} ({s['ct2_isa']}) | "
            f"{s['engine_single_p50_ms']}, {s['ct2_single_p50_ms']} ({s.get('ct2_single_isa')}) | "
            f"{s['service_c64_sentences_per_s']}, {s['service_c1_p50_ms']} | "
            + ", ".join(str(s.get(f"{k}_sentences_per_s", "-")) for k, _ in hf)
            + " | "
            + ", ".join(str(s.get(f"{k}_single_p50_ms", "-")) for k, _ in hf)
            + " |"
        )
    L += shortlist_report_lines(real["summary"]["by_beam"])
    rss = real["summary"]["peak_rss_mb"]
    L += [
        "",
        "Peak RSS (VmHWM, MB; the server: its largest replica, and all its processes; `_held`: VmRSS once loaded): "
        + ", ".join(f"{k} {v}" for k, v in rss.items())
        + (f". {real['hf_error']}" if real.get("hf_error") else ""),
    ]
    return [*L, *memory_report_lines(real), ""]


def shortlist_report_lines(by_beam: dict[str, Row]) -> list[str]:
    """The shortlist rows (`measure_shortlist`) of the beams that have them, with the issue's targets."""
    beams = {beam: s for beam, s in by_beam.items() if "shortlist_engine_over_ct2_int8" in s}
    if not beams:
        return []
    size = next(iter(beams.values()))["shortlist_size"]
    L = [
        "",
        f"With a vocabulary shortlist (`mtserve shortlist --per-source {size[0]} --always {size[1]}` from the "
        "training pairs; CTranslate2 with the same mapping: `use_vmap`; the forced tokens come from it on both):",
        "",
        "| beam | engine+shortlist / CT2 int8 offline (>= 1.1) | engine+shortlist single / CT2 single (<= 0.5) | "
        "engine+shortlist / CT2+vmap offline | single / CT2+vmap single | engine+shortlist / engine offline | "
        "single / engine single | engine+shortlist, CT2 int8, CT2+vmap sent/s | "
        "engine+shortlist, CT2, CT2+vmap single p50 ms | mean K, 1 sentence / 32 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for beam, s in beams.items():
        L.append(
            f"| {beam} | **{s['shortlist_engine_over_ct2_int8']}** | **{s['shortlist_latency_over_ct2']}** | "
            f"{s['shortlist_engine_over_ct2_vmap']} | {s['shortlist_latency_over_ct2_vmap']} | "
            f"{s['shortlist_engine_over_engine']} | {s['shortlist_latency_over_engine']} | "
            f"{s['shortlist_engine_sentences_per_s']}, {s['shortlist_ct2_int8_sentences_per_s']}, "
            f"{s['ct2_vmap_sentences_per_s']} | {s['shortlist_engine_p50_ms']}, {s['shortlist_ct2_int8_p50_ms']}, "
            f"{s['ct2_vmap_p50_ms']} | {s['shortlist_k_single']} / {s['shortlist_k_batch32']} |"
        )
    return L


def _test_texts() -> list[str]:
    from benchmarks.real_size_worker import read_test

    return read_test(DATA, 1000)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer sentences and pairs (a few minutes)")
    ap.add_argument("--tokens", type=int, default=30, help="target tokens a sentence, every engine")
    ap.add_argument("--no-hf", action="store_true", help="leave out optimum and PyTorch")
    ap.add_argument("--all-hf", action="store_true", help="with --quick: optimum fp32 and PyTorch too")
    ap.add_argument("--json", help="also write the whole result here")
    ap.add_argument(
        "--shortlist",
        default=":".join(map(str, SHORTLIST)),
        help="the shortlist rows' size, PER_SOURCE:ALWAYS (mtserve shortlist --per-source, --always)",
    )
    ap.add_argument("--shortlist-only", action="store_true", help="the greedy shortlist rows alone (no server)")
    ap.add_argument("--size", choices=sorted(SIZES), default="opus-mt", help="the model's size (default opus-mt)")
    args = ap.parse_args(argv)
    plan = (hf_plan() if args.all_hf else quick_plan()) if args.quick else full_plan()
    plan = RealSizePlan(**{**asdict(plan), "tokens": args.tokens, **({"hf_engines": []} if args.no_hf else {})})
    plan = RealSizePlan(**{**asdict(plan), "shortlist": [int(x) for x in args.shortlist.split(":")]})
    dims, family = SIZES[args.size]
    if family is NLLB:
        if args.shortlist_only:
            ap.error("--size nllb-600m has no shortlist rows (nllb_plan says why)")
        plan = nllb_plan(plan, args.quick)
    res = measure_shortlist_only(plan) if args.shortlist_only else measure(plan, dims, family)
    res["machine"] = machine()
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"]))


if __name__ == "__main__":
    main()
