"""`mtserve train`: train the Transformer on a Multi30k-style corpus, on CPU or CUDA.

Label smoothing, linear warm-up then inverse-square-root or cosine decay, length-bucketed token
batches, gradient clipping, a deterministic seed, resumable from the run directory, validation
loss and BLEU every epoch, and averaging of the last epochs' weights into the final model.
The run directory ends up as a model directory (see `export/checkpoint.py`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import sacrebleu
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tqdm import tqdm

from export.checkpoint import TOKENIZER, average_state_dicts, save_model_dir
from export.data import DEFAULT_DATA_DIR, Batch, read_parallel, token_batches
from export.generate import greedy_search, pad_batch
from export.model import ModelConfig, Transformer, count_parameters
from export.tokenizer import decode_batch, encode_batch, load_tokenizer, special_ids, train_tokenizer

PRESETS: dict[str, dict[str, int | float]] = {
    "tiny": dict(
        vocab_size=500,
        d_model=32,
        n_heads=2,
        n_encoder_layers=1,
        n_decoder_layers=1,
        d_ff=64,
        dropout=0.0,
        max_positions=128,
    ),
    "base": dict(
        vocab_size=8000,
        d_model=256,
        n_heads=4,
        n_encoder_layers=3,
        n_decoder_layers=3,
        d_ff=1024,
        dropout=0.1,
        max_positions=256,
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", default=str(DEFAULT_DATA_DIR), help="dir with SPLIT.LANG[.gz] files")
    p.add_argument("--out", required=True, help="run dir; becomes the model dir")
    p.add_argument("--preset", choices=sorted(PRESETS), default="base")
    p.add_argument("--model-config", help="JSON object overriding ModelConfig fields")
    p.add_argument("--src-lang", default="de")
    p.add_argument("--tgt-lang", default="en")
    p.add_argument("--train-split", default="train")
    p.add_argument("--valid-split", default="val")
    p.add_argument("--max-train-sentences", type=int, help="use only the first N training pairs")
    p.add_argument("--max-valid-sentences", type=int, help="validate on the first N pairs only")
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=3000, help="padded tokens per batch")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    p.add_argument("--warmup-steps", type=int, default=800)
    p.add_argument("--schedule", choices=["inverse_sqrt", "cosine"], default="cosine")
    p.add_argument("--min-lr-ratio", type=float, default=0.02, help="cosine floor, fraction of peak")
    p.add_argument("--label-smoothing", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--clip-norm", type=float, default=1.0)
    p.add_argument("--average-last", type=int, default=5, help="average the last N epochs (1 = off)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = default)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast for matmuls")
    p.add_argument("--resume", action="store_true", help="continue from RUN/checkpoints/last.pt")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--max-steps", type=int, help="stop after this many updates (smoke tests)")


def lr_at(step: int, args: argparse.Namespace) -> float:
    """Linear warm-up to the peak, then decay."""
    if step < args.warmup_steps:
        return args.lr * (step + 1) / args.warmup_steps
    if args.schedule == "inverse_sqrt":
        return args.lr * math.sqrt(args.warmup_steps / (step + 1))
    total = max(args.total_steps, args.warmup_steps + 1)
    progress = min(1.0, (step - args.warmup_steps) / (total - args.warmup_steps))
    floor = args.lr * args.min_lr_ratio
    return floor + (args.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def batch_tensors(
    batch: Batch, cfg: ModelConfig, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    src_ids, src_mask = pad_batch(batch.src, cfg.pad_id, device)
    tgt_in, _ = pad_batch([[cfg.bos_id] + t for t in batch.tgt], cfg.pad_id, device)
    tgt_out, _ = pad_batch([t + [cfg.eos_id] for t in batch.tgt], cfg.pad_id, device)
    return src_ids, src_mask, tgt_in, tgt_out


def loss_fn(
    logits: torch.Tensor, tgt_out: torch.Tensor, cfg: ModelConfig, label_smoothing: float
) -> tuple[torch.Tensor, int]:
    """Label-smoothed cross-entropy summed over non-pad target tokens, and the token count."""
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.size(-1)),
        tgt_out.reshape(-1),
        ignore_index=cfg.pad_id,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    return loss, int((tgt_out != cfg.pad_id).sum())


@torch.no_grad()
def validate(
    model: Transformer,
    src: list[list[int]],
    tgt_ids: list[list[int]],
    tgt_text: list[str],
    tok: Tokenizer,
    cfg: ModelConfig,
    device: torch.device,
    max_tokens: int,
) -> dict[str, float]:
    model.eval()
    total, n = 0.0, 0
    for batch in token_batches(src, tgt_ids, max_tokens, seed=None):
        s, m, ti, to = batch_tensors(batch, cfg, device)
        loss, k = loss_fn(model(s, m, ti), to, cfg, 0.0)
        total, n = total + float(loss), n + k
    hyps = []
    for i in range(0, len(src), 200):
        hyps += [h.tokens for h in greedy_search(model, src[i : i + 200])]
    bleu = sacrebleu.corpus_bleu(decode_batch(tok, hyps), [tgt_text])
    model.train()
    return {
        "valid_loss": total / max(n, 1),
        "valid_ppl": math.exp(min(total / max(n, 1), 50)),
        "valid_bleu": bleu.score,
    }


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


@dataclass
class TrainingData:
    """The tokenizer, the model config it fixes, and the id sequences to train and validate on
    (sources end in EOS; targets get BOS/EOS in `batch_tensors`)."""

    tok: Tokenizer
    cfg: ModelConfig
    train_src: list[list[int]]
    train_tgt: list[list[int]]
    valid_src: list[list[int]]
    valid_tgt: list[list[int]]
    valid_tgt_text: list[str]


@dataclass
class Progress:
    """Where the run stands: the next epoch, the updates done, the epochs' records and training time."""

    start_epoch: int = 1
    step: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0


def validate_data(model: Transformer, data: TrainingData, device: torch.device, max_tokens: int) -> dict[str, float]:
    """`validate` on the run's validation split."""
    return validate(model, data.valid_src, data.valid_tgt, data.valid_tgt_text, data.tok, data.cfg, device, max_tokens)


def _read_pair(args: argparse.Namespace, split: str, limit: int | None) -> tuple[list[str], list[str]]:
    src, tgt = read_parallel(args.data, split, args.src_lang, args.tgt_lang)
    return (src[:limit], tgt[:limit]) if limit else (src, tgt)


def prepare_data(args: argparse.Namespace, out: Path) -> TrainingData:
    """Read the splits, train (or reload, when resuming) the tokenizer, fix the model config and
    encode the text, truncated to the model's positions."""
    train_src_text, train_tgt_text = _read_pair(args, args.train_split, args.max_train_sentences)
    valid_src_text, valid_tgt_text = _read_pair(args, args.valid_split, args.max_valid_sentences)
    cfg_fields: dict[str, Any] = dict(PRESETS[args.preset])
    if args.model_config:
        cfg_fields.update(json.loads(args.model_config))
    tok_path = out / TOKENIZER
    if tok_path.exists():
        tok = load_tokenizer(tok_path)
    else:
        tok = train_tokenizer(train_src_text + train_tgt_text, vocab_size=cfg_fields["vocab_size"])
        tok.save(str(tok_path))
    cfg_fields.update(special_ids(tok), vocab_size=tok.get_vocab_size())
    cfg = ModelConfig.from_dict(cfg_fields)
    limit = cfg.max_positions - 1

    def ids(texts: list[str]) -> list[list[int]]:
        return [t[: limit - 1] for t in encode_batch(tok, texts)]

    return TrainingData(
        tok=tok,
        cfg=cfg,
        train_src=[s + [cfg.eos_id] for s in ids(train_src_text)],
        train_tgt=ids(train_tgt_text),
        valid_src=[s + [cfg.eos_id] for s in ids(valid_src_text)],
        valid_tgt=ids(valid_tgt_text),
        valid_tgt_text=valid_tgt_text,
    )


def resume(last: Path, model: Transformer, optim: torch.optim.Optimizer, device: torch.device) -> Progress:
    """Restore the model, the optimizer, the progress and torch's RNG from `last` (checkpoints/last.pt)."""
    state = torch.load(last, map_location=device, weights_only=False)
    model.load_state_dict(state["model"])
    optim.load_state_dict(state["optim"])
    torch.set_rng_state(state["torch_rng"])
    print(f"resumed from {last}: epoch {state['epoch']} done, step {state['step']}")
    return Progress(state["epoch"] + 1, state["step"], state["history"], state["elapsed"])


def train_epoch(
    model: Transformer,
    optim: torch.optim.Optimizer,
    data: TrainingData,
    args: argparse.Namespace,
    epoch: int,
    progress: Progress,
    device: torch.device,
) -> dict[str, Any]:
    """One pass over the epoch's shuffled token batches (fewer with --max-steps); advances
    `progress.step` and `progress.elapsed` and returns the epoch's training figures."""
    cfg = data.cfg
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    t0 = time.time()
    batches = token_batches(data.train_src, data.train_tgt, args.max_tokens, args.seed, epoch)
    bar = tqdm(batches, desc=f"epoch {epoch}/{args.epochs}", disable=args.no_progress, mininterval=2)
    ep_loss, ep_tokens, seen = 0.0, 0, 0
    for batch in bar:
        src_ids, src_mask, tgt_in, tgt_out = batch_tensors(batch, cfg, device)
        for g in optim.param_groups:
            g["lr"] = lr_at(progress.step, args)
        with autocast:
            logits = model(src_ids, src_mask, tgt_in)
        loss, n_tok = loss_fn(logits, tgt_out, cfg, args.label_smoothing)
        optim.zero_grad(set_to_none=True)
        (loss / n_tok).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        optim.step()
        progress.step += 1
        ep_loss, ep_tokens = ep_loss + loss.item(), ep_tokens + n_tok
        seen += int(src_mask.sum()) + n_tok
        bar.set_postfix(
            loss=f"{ep_loss / ep_tokens:.3f}",
            tok_s=f"{seen / (time.time() - t0):.0f}",
            lr=f"{lr_at(progress.step, args):.2e}",
        )
        if args.max_steps and progress.step >= args.max_steps:
            break
    train_secs = time.time() - t0
    progress.elapsed += train_secs
    return {
        "epoch": epoch,
        "step": progress.step,
        "train_loss": ep_loss / max(ep_tokens, 1),
        "tokens_per_s": seen / train_secs,
        "epoch_seconds": train_secs,
    }


def save_epoch(
    model: Transformer, optim: torch.optim.Optimizer, progress: Progress, record: dict[str, Any], out: Path
) -> None:
    """The epoch's weights (for averaging), the resumable state and a line of train_log.jsonl."""
    ckpt_dir = out / "checkpoints"
    epoch = record["epoch"]
    save_file(
        {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
        str(ckpt_dir / f"epoch{epoch:03d}.safetensors"),
    )
    torch.save(
        {
            "model": model.state_dict(),
            "optim": optim.state_dict(),
            "epoch": epoch,
            "step": progress.step,
            "history": progress.history,
            "elapsed": progress.elapsed,
            "torch_rng": torch.get_rng_state(),
        },
        ckpt_dir / "last.pt",
    )
    with open(out / "train_log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def average_and_save(
    model: Transformer, data: TrainingData, args: argparse.Namespace, progress: Progress, device: torch.device
) -> None:
    """Average the last --average-last epochs' weights, validate the average and write the model dir."""
    out = Path(args.out)
    done_epochs = [h["epoch"] for h in progress.history]
    use = done_epochs[-max(1, args.average_last) :]
    states = [load_file(str(out / "checkpoints" / f"epoch{e:03d}.safetensors")) for e in use]
    model.load_state_dict(average_state_dicts(states))
    final = validate_data(model, data, device, args.max_tokens)
    print(json.dumps({"averaged_epochs": use, **final}), flush=True)
    training = {
        "data": str(args.data),
        "src_lang": args.src_lang,
        "tgt_lang": args.tgt_lang,
        "preset": args.preset,
        "epochs": len(done_epochs),
        "steps": progress.step,
        "parameters": count_parameters(model),
        "train_seconds": round(progress.elapsed, 1),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "averaged_epochs": use,
        "final_valid": final,
        "history": progress.history,
        "hyperparameters": {
            k: getattr(args, k)
            for k in ("max_tokens", "lr", "warmup_steps", "schedule", "label_smoothing", "clip_norm", "seed", "bf16")
        },
    }
    save_model_dir(model.cpu(), out, extra={"src_lang": args.src_lang, "tgt_lang": args.tgt_lang, "training": training})


def run(args: argparse.Namespace) -> Path:
    """Train as `args` asks (see `add_arguments`), resuming from the run directory with --resume,
    and leave a model directory at --out."""
    out = Path(args.out)
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = pick_device(args.device)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)

    data = prepare_data(args, out)
    model = Transformer(data.cfg).to(device)
    optim = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=args.weight_decay
    )
    steps_per_epoch = len(token_batches(data.train_src, data.train_tgt, args.max_tokens, args.seed, 0))
    args.total_steps = steps_per_epoch * args.epochs
    last = out / "checkpoints" / "last.pt"
    progress = resume(last, model, optim, device) if args.resume and last.exists() else Progress()
    print(
        f"model: {count_parameters(model) / 1e6:.2f}M parameters, vocab {data.cfg.vocab_size}, device {device}, "
        f"{len(data.train_src)} training pairs, {steps_per_epoch} steps/epoch"
    )

    model.train()
    for epoch in range(progress.start_epoch, args.epochs + 1):
        record = train_epoch(model, optim, data, args, epoch, progress, device)
        record.update(validate_data(model, data, device, args.max_tokens))
        progress.history.append(record)
        print(json.dumps(record), flush=True)
        save_epoch(model, optim, progress, record, out)
        if args.max_steps and progress.step >= args.max_steps:
            break

    average_and_save(model, data, args, progress, device)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser("mtserve train")
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
