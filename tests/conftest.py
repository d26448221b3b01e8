"""Shared fixtures: the shipped corpus (data/multi30k/), and a tiny model trained for a few seconds."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from pathlib import Path

import pytest

from export.data import DEFAULT_DATA_DIR

REPO = Path(__file__).resolve().parent.parent
SHIPPED_MODEL = REPO / "models" / "de-en" / "1"


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The Multi30k corpus: the one the project ships (data/multi30k/), or MTSERVE_DATA_DIR's. A
    missing corpus fails the tests that need it, naming where it was looked for."""
    missing = [f for f in ("train.de.gz", "test_2016_flickr.de.gz") if not (DEFAULT_DATA_DIR / f).is_file()]
    if missing:
        pytest.fail(f"Multi30k corpus not found: no {', '.join(missing)} in {DEFAULT_DATA_DIR}", pytrace=False)
    return DEFAULT_DATA_DIR


def train_args(out: Path, data: Path, *extra: str) -> argparse.Namespace:
    from export.train import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(
        [
            "--out",
            str(out),
            "--data",
            str(data),
            "--preset",
            "tiny",
            "--no-progress",
            "--max-train-sentences",
            "3000",
            "--max-valid-sentences",
            "64",
            "--epochs",
            "3",
            "--warmup-steps",
            "30",
            "--lr",
            "3e-3",
            "--average-last",
            "2",
            "--threads",
            "1",
            "--model-config",
            '{"n_encoder_layers": 2, "n_decoder_layers": 2}',
            *extra,
        ]
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, data_dir) -> Path:
    """A 2+2-layer d_model-32 model trained for three short epochs on 3,000 pairs (a few seconds):
    small, but its outputs are peaked enough for token-for-token comparisons."""
    from export.train import run

    return run(train_args(tmp_path_factory.mktemp("tiny") / "model", data_dir))


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir):
    from export.checkpoint import load_model

    return load_model(tiny_model_dir)


@pytest.fixture(scope="session")
def test_split(data_dir):
    from export.data import read_parallel

    return read_parallel(data_dir, "test_2016_flickr")


@pytest.fixture(scope="module")
def one_torch_thread():
    """The PyTorch reference on one thread (use with pytest.mark.usefixtures): tiny matrices,
    and on a busy machine torch's spinning worker threads are very slow."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def make_train_args():
    """Arguments of a tiny training run: make_train_args(out_dir, data_dir, *extra_flags)."""
    return train_args


@pytest.fixture(scope="session")
def tiny_onnx_dir(tiny_model_dir) -> Path:
    """`tiny_model_dir/onnx`: the tiny model exported (torch.onnx dynamo exporter) in all three
    precisions, fp32, int8 and fp16 (one torch export; the variants are derived from it)."""
    from export.to_onnx import export_model

    out = tiny_model_dir / "onnx"
    export_model(tiny_model_dir, out, ["fp32", "int8", "fp16"])
    return out


@pytest.fixture(scope="session")
def shortlisted_copy(tmp_path_factory, tiny_model_dir, tiny_onnx_dir, tiny_model):
    """make(rows, always, params) -> a copy of the tiny model and its export with the vocabulary
    shortlist `Shortlist.from_rows(rows, always, V, params)` installed (its `.shortlist` steps)."""
    import shutil

    from contract.manifest import load_manifest
    from contract.shortlist import Shortlist
    from export.shortlist import install

    def make(rows: list[list[int]], always, params: dict) -> Path:
        model_dir = tmp_path_factory.mktemp("shortlisted") / "model"
        shutil.copytree(tiny_model_dir, model_dir)
        manifest = load_manifest(model_dir / "onnx", verify_checksums=False)
        shortlist = Shortlist.from_rows(rows, always, manifest.dims.vocab_size, params)
        install(tiny_model, model_dir / "onnx", manifest, shortlist)
        return model_dir

    return make


@pytest.fixture(scope="session")
def tiny_onnx(tiny_onnx_dir):
    """The fp32 export's portable graphs loaded with ONNX Runtime (CPU, one thread): `step` feeds
    the decoder graph directly (tests/service/decoding/test_generator.py runs the fused one too)."""
    from service.runtime.onnx_model import OnnxSeq2Seq

    return OnnxSeq2Seq(tiny_onnx_dir, precision="fp32", graph="portable")


class RunningServer:
    """A Server on its own event loop thread, as `mtserve serve` runs it."""

    def __init__(self, settings):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        from service.server import Server

        self.server = Server(settings)
        self.call(self.server.start(), timeout=120)
        self.address = f"127.0.0.1:{self.server.port}"

    def call(self, coro, timeout=60):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def client(self, **kw):
        from service.client import Client

        return Client(self.address, **kw)

    def wait_idle(self, seconds: float = 5.0) -> bool:
        """Until the scheduler holds no sentence (answers go out just before their rows' bookkeeping
        ends); whether it got there within `seconds`."""
        end = time.time() + seconds
        while not self.server.scheduler.idle and time.time() < end:
            time.sleep(0.01)
        return self.server.scheduler.idle

    def intercept_steps(self, before) -> None:
        """Fault injection: `before(rows)` runs before every decoder step of every worker, on
        either graph (the portable one's `step`, the fused one's bound steps), and may sleep or
        raise. Batches bound before the call keep their steps as they were."""
        for model in {id(m): m for m in self.server.scheduler.models}.values():  # workers may share one

            def step(tokens, *a, _orig=model.step, **kw):
                before(len(tokens))
                return _orig(tokens, *a, **kw)

            def bind_step(inputs, outputs, *args, _orig=model.bind_step):
                bound = _orig(inputs, outputs, *args)
                run, rows = bound.run, len(inputs["tokens"])

                def checked_run():
                    before(rows)
                    run()

                bound.run = checked_run
                return bound

            model.step, model.bind_step = step, bind_step

    def slow_down(self, seconds: float) -> None:
        """Fault injection for timing tests: every decoder step of every worker sleeps first."""
        self.intercept_steps(lambda rows: time.sleep(seconds))

    def stop(self) -> None:
        self.stopped = True
        self.call(self.server.drain())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def make_server(tiny_onnx_dir):
    """make_server(**settings_overrides) -> RunningServer on 127.0.0.1 (an ephemeral port), serving
    the tiny fp32 export with metrics off; every server made is drained when the module ends. The
    scheduler runs in the server's process (engine_process=False), where tests can reach into it
    (slow_down, fault injection); tests/service/parallel/test_engine_process.py covers the child process.
    Continuous batching is on, unlike the server's default, so that the server tests exercise
    admission into running batches; `mtserve serve` process tests run the defaults."""
    started = []

    def make(**overrides) -> RunningServer:
        fields = dict(
            address="127.0.0.1:0",
            model_dir=tiny_onnx_dir.parent,
            onnx_dir=tiny_onnx_dir,
            metrics_port=0,
            decode_workers=1,
            grace_period_s=5.0,
            max_queue_delay_ms=2.0,
            precision="fp32",
            engine_process=False,
            continuous_batching=True,
        )
        from service.settings import Settings

        s = RunningServer(Settings(**{**fields, **overrides}))
        started.append(s)
        return s

    yield make
    for s in started:
        if s.thread.is_alive() and not getattr(s, "stopped", False):
            s.stop()


@pytest.fixture(scope="module")
def server(make_server) -> RunningServer:
    """The tiny model served with two decode workers (modules with other needs define their own)."""
    return make_server(decode_workers=2)


@pytest.fixture()
def client(server):
    with server.client(timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def shipped_int8_export(tmp_path_factory) -> Path:
    """The shipped de-en checkpoint's int8 export (fused step included), made once per session in
    a temporary directory (a clean checkout has no export): for tests that need a real model's size."""
    from export.to_onnx import export_model

    out = tmp_path_factory.mktemp("de-en-int8") / "onnx"
    export_model(SHIPPED_MODEL, out, ["int8"])
    return out


def pytest_terminal_summary(terminalreporter) -> None:
    """Figures a test measured (`record_property("figures", ...)`) at the end of the run."""
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, value in getattr(report, "user_properties", []):
            if key == "figures":
                terminalreporter.write_line(f"{report.nodeid}: {value}")


# ----------------------------------------------------------------------------- Hugging Face imports
# Tiny random Hugging Face Marian and M2M100 folders, built offline for the `mtserve import` tests:
# their SentencePiece models are trained here on a few thousand corpus lines, their weights are
# seeded and scaled up so that the logits have clear margins (no near-ties for greedy parity).


def _hf_read_lines(data_dir: Path, split: str, lang: str, n: int | None = None) -> list[str]:
    import gzip

    with gzip.open(data_dir / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f]
    return lines[:n] if n else lines


def _hf_train_spm(lines: list[str], prefix: Path, vocab_size: int, model_type: str) -> Path:
    import sentencepiece

    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


def _hf_pieces(spm_file: Path) -> list[str]:
    import sentencepiece

    sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_file))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]


def _hf_scale_weights(model, factor: float) -> None:
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and "embed_positions" not in name:
                p.mul_(factor)


# The dimensions of the tiny Hugging Face models (MarianConfig and M2M100Config take the same names).
_TINY_HF = {
    "d_model": 32,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 128,
    "scale_embedding": True,
    "dropout": 0.0,
    "init_std": 0.1,
}


def _tiny_m2m100(out: Path, vocab_size: int, activation: str, seed: int) -> Path:
    """A seeded M2M100ForConditionalGeneration of 2+2 layers of width 32 saved into `out` (M2M100's
    and NLLB's special ids), its weights scaled up so that its outputs vary."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    config = M2M100Config(
        vocab_size=vocab_size,
        **_TINY_HF,
        activation_function=activation,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = M2M100ForConditionalGeneration(config)
    _hf_scale_weights(model, 2.0)
    model.save_pretrained(str(out))
    return out


def hf_marian_folder(
    out: Path, src_spm: Path, tgt_spm: Path, activation: str, separate: bool, seed: int, bad_words: bool = True
) -> Path:
    import json

    import torch
    from transformers import MarianConfig, MarianMTModel, MarianTokenizer

    out.mkdir(parents=True)
    # Shared: </s> 0, <unk> 1, the pieces of both models, <pad> last (OPUS-MT's layout). Separate:
    # each side its own vocabulary, with <pad> at the same id (Marian has one pad_token_id).
    special = {"</s>": 0, "<unk>": 1}
    if separate:
        src_vocab = {**special, "<pad>": 2, **{p: i + 3 for i, p in enumerate(_hf_pieces(src_spm))}}
        tgt_vocab = {**special, "<pad>": 2, **{p: i + 3 for i, p in enumerate(_hf_pieces(tgt_spm))}}
    else:
        joint = list(dict.fromkeys(_hf_pieces(src_spm) + _hf_pieces(tgt_spm)))
        src_vocab = {**special, **{p: i + 2 for i, p in enumerate(joint)}}
        src_vocab["<pad>"] = len(src_vocab)
        tgt_vocab = src_vocab
    (out / "vocab.json").write_text(json.dumps(src_vocab))
    if separate:
        (out / "target_vocab.json").write_text(json.dumps(tgt_vocab))
    tok = MarianTokenizer(
        source_spm=str(src_spm),
        target_spm=str(tgt_spm),
        vocab=str(out / "vocab.json"),
        target_vocab_file=str(out / "target_vocab.json") if separate else None,
        source_lang="de",
        target_lang="en",
        separate_vocabs=separate,
    )
    tok.save_pretrained(str(out))
    pad = src_vocab["<pad>"]
    config = MarianConfig(
        vocab_size=len(src_vocab),
        decoder_vocab_size=len(tgt_vocab),
        share_encoder_decoder_embeddings=not separate,
        **_TINY_HF,
        activation_function=activation,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=pad,
        forced_eos_token_id=0,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    _hf_scale_weights(model, 2.0)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn_like(model.final_logits_bias) * 2.0)
    model.save_pretrained(str(out))
    if bad_words:  # as OPUS-MT's generation_config.json: never generate <pad>
        gen = json.loads((out / "generation_config.json").read_text())
        (out / "generation_config.json").write_text(json.dumps({**gen, "bad_words_ids": [[pad]]}))
    return out


def hf_m2m100_folder(out: Path, spm: Path, activation: str, seed: int) -> Path:
    import json

    from transformers import M2M100Tokenizer

    out.mkdir(parents=True)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, **{p: i + 4 for i, p in enumerate(_hf_pieces(spm))}}
    (out / "vocab.json").write_text(json.dumps(vocab))
    (out / "sentencepiece.bpe.model").write_bytes(spm.read_bytes())
    tok = M2M100Tokenizer(
        vocab_file=str(out / "vocab.json"),
        spm_file=str(out / "sentencepiece.bpe.model"),
        src_lang="de",
        tgt_lang="en",
        language_codes="wmt21",
    )
    tok.save_pretrained(str(out))
    # and M2M100's 8 made-up words
    return _tiny_m2m100(out, max(tok.lang_code_to_id.values()) + 1 + 8, activation, seed)


@pytest.fixture(scope="session")
def hf_spm_models(tmp_path_factory, data_dir) -> dict[str, Path]:
    """SentencePiece models trained on 3,000 training lines: German and English unigram models
    (Marian's kind) and a joint BPE model (M2M100's)."""
    out = tmp_path_factory.mktemp("hf-spm")
    de, en = _hf_read_lines(data_dir, "train", "de", 3000), _hf_read_lines(data_dir, "train", "en", 3000)
    return {
        "de": _hf_train_spm(de, out / "de", 1000, "unigram"),
        "en": _hf_train_spm(en, out / "en", 1000, "unigram"),
        "joint": _hf_train_spm(de + en, out / "joint", 1500, "bpe"),
    }


@pytest.fixture(scope="session")
def hf_marian_dir(tmp_path_factory, hf_spm_models) -> Path:
    """A Marian folder with one shared vocabulary (<pad> last, as OPUS-MT's) and swish."""
    out = tmp_path_factory.mktemp("hf-marian") / "opus-mt-tiny"
    return hf_marian_folder(out, hf_spm_models["de"], hf_spm_models["en"], "swish", separate=False, seed=1)


@pytest.fixture(scope="session")
def hf_marian_separate_dir(tmp_path_factory, hf_spm_models) -> Path:
    """A Marian folder with separate source and target vocabularies and GELU."""
    out = tmp_path_factory.mktemp("hf-marian-sep") / "opus-mt-tiny-sep"
    return hf_marian_folder(out, hf_spm_models["de"], hf_spm_models["en"], "gelu", separate=True, seed=2)


@pytest.fixture(scope="session")
def hf_m2m100_dir(tmp_path_factory, hf_spm_models) -> Path:
    """An M2M100 folder (8 languages, `wmt21` codes) with ReLU."""
    out = tmp_path_factory.mktemp("hf-m2m100") / "m2m100-tiny"
    return hf_m2m100_folder(out, hf_spm_models["joint"], "relu", seed=3)


NLLB_LANGUAGES = ["deu_Latn", "eng_Latn", "fra_Latn", "ces_Latn"]


def hf_nllb_folder(out: Path, spm: Path, seed: int) -> Path:
    """An NLLB folder as transformers saves one: tokenizer.json and tokenizer_config.json converted
    from the SentencePiece model (fairseq's ids, the language codes added as special tokens), the
    model itself shipped beside them as on the hub, and an M2M100 model with two unused rows."""
    import shutil

    from transformers import NllbTokenizer

    spm_only = out.with_name(out.name + "-spm")
    spm_only.mkdir(parents=True)
    shutil.copyfile(spm, spm_only / "sentencepiece.bpe.model")
    tok = NllbTokenizer.from_pretrained(
        str(spm_only), src_lang="deu_Latn", tgt_lang="eng_Latn", extra_special_tokens=NLLB_LANGUAGES
    )
    tok.save_pretrained(str(out))
    shutil.copyfile(spm, out / "sentencepiece.bpe.model")
    return _tiny_m2m100(out, len(tok) + 2, "relu", seed)


@pytest.fixture(scope="session")
def hf_nllb_dir(tmp_path_factory, hf_spm_models) -> Path:
    """An NLLB folder (4 FLORES-200 language codes) on the joint BPE model, with ReLU."""
    out = tmp_path_factory.mktemp("hf-nllb") / "nllb-tiny"
    return hf_nllb_folder(out, hf_spm_models["joint"], seed=4)
