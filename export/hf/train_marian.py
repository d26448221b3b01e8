"""Train a small Marian model (`MarianMTModel`) with transformers on a Multi30k-style corpus, and
score it with sacreBLEU, so that `mtserve import` can be checked on a trained checkpoint.

Training: a joint SentencePiece unigram vocabulary trained on the training split, a seeded
`MarianConfig` (post-norm, sinusoidal positions, shared and tied embeddings, decoding from <pad>),
length-bucketed token batches, Adam with linear warm-up then inverse-square-root decay,
label-smoothed cross-entropy, validation loss every --valid-every updates (the folder is saved each
time), and a wall-clock budget (--minutes) after which it validates, saves and stops. The output
folder loads with `MarianTokenizer.from_pretrained` and `MarianMTModel.from_pretrained`:

    .venv/bin/python -m export.hf.train_marian --out /tmp/marian-de-en --minutes 35

Evaluation (--evaluate): sacreBLEU (13a, as `mtserve evaluate`) of transformers' `generate` on a
split, for each --beams value:

    .venv/bin/python -m export.hf.train_marian --evaluate /tmp/marian-de-en --beams 1 4
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import sentencepiece as spm
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

from export.data import DEFAULT_DATA_DIR, Batch, read_parallel, token_batches

# Piece ids of the joint SentencePiece model, which vocab.json repeats ({piece: id}).
EOS_ID, UNK_ID, PAD_ID = 0, 1, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", help="the Hugging Face folder to write (training)")
    p.add_argument("--evaluate", metavar="DIR", help="score the Hugging Face folder DIR instead of training")
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR), help="dir with SPLIT.LANG[.gz] files")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--minutes", type=float, default=35.0, help="training wall-clock budget")
    p.add_argument("--max-steps", type=int, help="stop after this many updates (smoke runs)")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3, help="encoder and decoder layers each")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=1024)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--max-tokens", type=int, default=2000, help="padded tokens per batch")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=150)
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--valid-every", type=int, default=150, help="updates between validations")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--split", default="test_2016_flickr", help="the split --evaluate scores")
    p.add_argument("--beams", type=int, nargs="+", default=[1, 4], help="beam sizes --evaluate scores")
    p.add_argument("--batch-size", type=int, default=64, help="sentences per generate call (--evaluate)")
    p.add_argument("--max-sentences", type=int, help="score only the first N sentences (--evaluate)")


def train_sentencepiece(src: list[str], tgt: list[str], out: Path, vocab_size: int) -> None:
    """A joint unigram model over both sides, written as source.spm and target.spm, and vocab.json."""
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "joint"
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(src + tgt),
            model_prefix=str(prefix),
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=1.0,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            pad_id=PAD_ID,
            bos_id=-1,
            num_threads=2,
            minloglevel=2,
        )
        shutil.copyfile(f"{prefix}.model", out / "source.spm")
        shutil.copyfile(f"{prefix}.model", out / "target.spm")
    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=1), encoding="utf-8")


def write_tokenizer_config(out: Path, src_lang: str, tgt_lang: str) -> None:
    config = {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": src_lang,
        "target_lang": tgt_lang,
        "separate_vocabs": False,
        "unk_token": "<unk>",
        "eos_token": "</s>",
        "pad_token": "<pad>",
        "model_max_length": 512,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")


def marian_config(args: argparse.Namespace, vocab_size: int) -> MarianConfig:
    return MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        d_model=args.d_model,
        encoder_layers=args.layers,
        decoder_layers=args.layers,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.ffn,
        decoder_ffn_dim=args.ffn,
        activation_function="swish",
        dropout=args.dropout,
        attention_dropout=args.dropout,
        activation_dropout=0.0,
        max_position_embeddings=256,
        scale_embedding=True,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        decoder_start_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        architectures=["MarianMTModel"],
    )


def generation_config() -> GenerationConfig:
    return GenerationConfig(
        bad_words_ids=[[PAD_ID]],
        decoder_start_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        forced_eos_token_id=EOS_ID,
        max_length=256,
        num_beams=4,
    )


def encode(tok: MarianTokenizer, src: list[str], tgt: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """Source ids ending with </s>, and target ids without it (as `token_batches` takes them)."""
    src_ids = tok(src, truncation=True, max_length=200)["input_ids"]
    tgt_ids = tok(text_target=tgt, truncation=True, max_length=200)["input_ids"]
    return src_ids, [t[:-1] for t in tgt_ids]


def batch_tensors(batch: Batch) -> dict[str, torch.Tensor]:
    """input_ids, attention_mask, decoder_input_ids (<pad>-started) and labels (</s>-ended)."""
    src_len = max(len(s) for s in batch.src)
    tgt_len = max(len(t) for t in batch.tgt) + 1
    input_ids = torch.tensor([s + [PAD_ID] * (src_len - len(s)) for s in batch.src])
    labels = torch.tensor([t + [EOS_ID] + [PAD_ID] * (tgt_len - len(t) - 1) for t in batch.tgt])
    decoder_input_ids = torch.tensor([[PAD_ID] + t + [PAD_ID] * (tgt_len - len(t) - 1) for t in batch.tgt])
    return {
        "input_ids": input_ids,
        "attention_mask": (input_ids != PAD_ID).long(),
        "decoder_input_ids": decoder_input_ids,
        "labels": labels,
    }


def batch_loss(model: MarianMTModel, batch: Batch, label_smoothing: float) -> tuple[torch.Tensor, int]:
    """Cross-entropy (label-smoothed if asked) summed over the non-pad target tokens, and their count."""
    t = batch_tensors(batch)
    logits = model(
        input_ids=t["input_ids"], attention_mask=t["attention_mask"], decoder_input_ids=t["decoder_input_ids"]
    ).logits
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        t["labels"].reshape(-1),
        ignore_index=PAD_ID,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return loss, int((t["labels"] != PAD_ID).sum())


@torch.no_grad()
def validation_loss(model: MarianMTModel, batches: list[Batch]) -> float:
    model.eval()
    total, tokens = 0.0, 0
    for batch in batches:
        loss, n = batch_loss(model, batch, 0.0)
        total, tokens = total + float(loss), tokens + n
    model.train()
    return total / max(tokens, 1)


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up to the peak, then inverse-square-root decay."""
    if step < args.warmup_steps:
        return float(args.lr * (step + 1) / args.warmup_steps)
    return float(args.lr * math.sqrt(args.warmup_steps / (step + 1)))


def prepare(
    args: argparse.Namespace, out: Path
) -> tuple[MarianTokenizer, list[list[int]], list[list[int]], list[Batch]]:
    """The tokenizer files in `out`, the encoded training pairs and the validation batches."""
    src, tgt = read_parallel(args.data, "train", args.src_lang, args.tgt_lang)
    train_sentencepiece(src, tgt, out, args.vocab_size)
    write_tokenizer_config(out, args.src_lang, args.tgt_lang)
    tok = MarianTokenizer.from_pretrained(str(out))
    train_src, train_tgt = encode(tok, src, tgt)
    val_src, val_tgt = encode(tok, *read_parallel(args.data, "val", args.src_lang, args.tgt_lang))
    return tok, train_src, train_tgt, token_batches(val_src, val_tgt, args.max_tokens, None)


def save(model: MarianMTModel, out: Path, history: list[dict[str, Any]]) -> None:
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "training.json").write_text(json.dumps(history, indent=1), encoding="utf-8")


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def train(args: argparse.Namespace) -> Path:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    deadline = start + args.minutes * 60
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    tok, train_src, train_tgt, val_batches = prepare(args, out)
    log(f"data: {len(train_src)} training pairs, {len(val_batches)} validation batches, vocab {len(tok)}")
    model = MarianMTModel(marian_config(args, len(tok)))
    model.generation_config = generation_config()
    model.train()
    log(f"model: {sum(p.numel() for p in model.parameters())} parameters")
    optim = torch.optim.Adam(model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    history: list[dict[str, Any]] = []
    step, epoch, done = 0, 0, False
    while not done:
        epoch += 1
        for batch in token_batches(train_src, train_tgt, args.max_tokens, args.seed, epoch):
            for group in optim.param_groups:
                group["lr"] = lr_at(step, args)
            loss, n_tokens = batch_loss(model, batch, args.label_smoothing)
            optim.zero_grad()
            (loss / n_tokens).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
            optim.step()
            step += 1
            if step % 50 == 0:
                log(
                    f"epoch {epoch} step {step} train loss {float(loss.detach()) / n_tokens:.3f} lr {lr_at(step, args):.2e}"
                )
            done = time.monotonic() >= deadline or (args.max_steps is not None and step >= args.max_steps)
            if done or step % args.valid_every == 0:
                minutes = (time.monotonic() - start) / 60
                val = validation_loss(model, val_batches)
                history.append({"step": step, "epoch": epoch, "minutes": round(minutes, 2), "valid_loss": val})
                log(f"epoch {epoch} step {step} valid loss {val:.4f} (ppl {math.exp(val):.2f}) after {minutes:.1f} min")
                save(model, out, history)
            if done:
                break
    log(f"saved {out} after {(time.monotonic() - start) / 60:.1f} min, {step} updates, {epoch} epochs")
    return out


def same_length_batches(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped by source length (at most `batch_size` each), so that each sentence gets
    `mtserve evaluate`'s own output cap, int(1.5 * source tokens + 10), </s> included."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if not batches or len(batches[-1]) == batch_size or lengths[batches[-1][0]] != lengths[i]:
            batches.append([])
        batches[-1].append(i)
    return batches


@torch.no_grad()
def translate(
    model: MarianMTModel, tok: MarianTokenizer, sentences: list[str], beams: int, batch_size: int
) -> list[str]:
    """transformers' generate over batches of equal source length, in the input order."""
    lengths = [len(ids) for ids in tok(sentences)["input_ids"]]
    hyps: dict[int, str] = {}
    for idx in same_length_batches(lengths, batch_size):
        enc = tok([sentences[j] for j in idx], return_tensors="pt", padding=True)
        max_new = min(255, int(1.5 * lengths[idx[0]] + 10))
        out = model.generate(**enc, num_beams=beams, length_penalty=1.0, max_new_tokens=max_new, max_length=None)
        for j, text in zip(idx, tok.batch_decode(out, skip_special_tokens=True), strict=True):
            hyps[j] = text
    return [hyps[i] for i in range(len(sentences))]


def evaluate(args: argparse.Namespace) -> list[dict[str, Any]]:
    """sacreBLEU of transformers' translations of --split, one row per beam size, printed as JSON."""
    tok = MarianTokenizer.from_pretrained(args.evaluate)
    model = MarianMTModel.from_pretrained(args.evaluate).eval()
    src, refs = read_parallel(args.data, args.split, args.src_lang, args.tgt_lang)
    src, refs = src[: args.max_sentences], refs[: args.max_sentences]
    rows = []
    for beams in args.beams:
        start = time.perf_counter()
        hyps = translate(model, tok, src, beams, args.batch_size)
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hyps, [refs])
        rows.append(
            {
                "engine": "transformers",
                "split": args.split,
                "sentences": len(src),
                "beam": beams,
                "bleu": round(bleu.score, 2),
                "signature": str(metric.get_signature()),
                "seconds": round(time.perf_counter() - start, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.evaluate:
        evaluate(args)
    elif args.out:
        train(args)
    else:
        p.error("give --out DIR to train or --evaluate DIR to score")


if __name__ == "__main__":
    main()
