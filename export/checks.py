"""The checks an export runs on its graphs: onnx.checker and the contract's inputs and outputs, and
parity with the PyTorch model under ONNX Runtime."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch

from contract.graphs import EOS_BIAS
from contract.manifest import TensorSpec
from export import onnx_files
from export.model import ModelConfig, Transformer

# The bound on the fp32 graphs' parity with PyTorch checked at export time: max |Δ log_probs| with
# both sides clipped at LOG_PROB_FLOOR, and max |Δ| of the encoder's memory and keys/values.
FP32_TOLERANCE = 1e-4
# Log-probabilities are compared above this floor only: a token below e^-50 (about 2e-22) can change
# no search and no sample, while its log-prob can be in the thousands (a trained model's unlikely
# tokens; the -1e4 logits bias of a banned token), where fp32 rounding alone is 2^-10 ≈ 1e-3.
LOG_PROB_FLOOR = -50.0


_ELEM_TYPE_NAMES: dict[int, str] = {
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
}


def _elem_type_name(t: int) -> str:
    return _ELEM_TYPE_NAMES.get(t, str(t))


def _cpu_session(path: Path) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _max_diff(current: float, got: np.ndarray, want: np.ndarray) -> float:
    return max(current, float(np.abs(got - want).max()))


def log_prob_diff(got: np.ndarray, want: np.ndarray) -> float:
    """max |Δ log p| with both sides clipped at LOG_PROB_FLOOR: every difference that can change a
    search or a sample, and none below the floor (clipping never enlarges a difference)."""
    return float(np.abs(np.maximum(got, LOG_PROB_FLOOR) - np.maximum(want, LOG_PROB_FLOOR)).max())


def source_vocab_size(cfg: ModelConfig) -> int:
    """The encoder's vocabulary: its own where the model has a separate one, else the shared one."""
    return cfg.vocab_size if cfg.src_vocab_size is None else cfg.src_vocab_size


def check_graph(path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """onnx.checker (full check, from the file: `onnx_files.check`) plus the graph's I/O against the
    contract: names, order, dtypes, ranks and symbolic axes."""
    onnx_files.check(path, full_check=True)
    model = onnx_files.load_graph(path)
    for kind, got, want in (("input", model.graph.input, inputs), ("output", model.graph.output, outputs)):
        got_names = [v.name for v in got]
        if got_names != [t.name for t in want]:
            raise RuntimeError(f"{path.name}: {kind}s {got_names} != {[t.name for t in want]}")
        for v, spec in zip(got, want):
            dtype = _elem_type_name(v.type.tensor_type.elem_type)
            dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            if dtype != spec.dtype or len(dims) != len(spec.shape):
                raise RuntimeError(f"{path.name}: {kind} {v.name} is {dtype}{dims}, expected {spec.dtype}{spec.shape}")
            for d, s in zip(dims, spec.shape):
                if isinstance(s, int) and d != s:
                    raise RuntimeError(f"{path.name}: {kind} {v.name} has dims {dims}, expected {spec.shape}")
                if isinstance(s, str) and isinstance(d, int) and d > 0:
                    raise RuntimeError(f"{path.name}: {kind} {v.name} axis {s} frozen to {d}")


def parity_check(model: Transformer, enc_path: Path, dec_path: Path, seed: int = 0) -> dict[str, float]:
    """Run both graphs with ORT on a random padded batch, first step (past_len 0) and a later step
    with a padded past, against PyTorch. Returns the max abs differences ("log_probs": above
    LOG_PROB_FLOOR, `log_prob_diff`)."""
    cfg = model.cfg
    enc, dec = _cpu_session(enc_path), _cpu_session(dec_path)
    g = torch.Generator().manual_seed(seed)
    B, S, L = 4, 7, cfg.n_decoder_layers
    lengths = torch.tensor([7, 3, 1, 5])
    src_mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    src_ids = torch.randint(4, source_vocab_size(cfg), (B, S), generator=g) * src_mask
    diffs = {"encoder_memory": 0.0, "log_probs": 0.0, "present_kv": 0.0, "cross_attention": 0.0}
    k = 2 * 4  # what beam search with 4 beams asks for
    out_names = [o.name for o in dec.get_outputs()]
    with torch.no_grad():
        memory = model.encode(src_ids, src_mask)
        cross = model.cross_kv(memory)
        eo = enc.run(None, {"src_ids": src_ids.numpy(), "src_mask": src_mask.numpy()})
        diffs["encoder_memory"] = float(np.abs(eo[0] - memory.numpy()).max())
        for P, n in ((0, B), (3, B // 2)):  # the second step: n sentences of B // n beams each
            tokens = torch.randint(4, cfg.vocab_size, (B, 1), generator=g)
            positions = torch.full((B,), P, dtype=torch.long)
            past = [
                (
                    torch.randn(B, cfg.n_heads, P, cfg.d_k, generator=g),
                    torch.randn(B, cfg.n_heads, P, cfg.d_k, generator=g),
                )
                for _ in range(L)
            ]
            past_mask = torch.ones(B, P)
            if P:
                past_mask[1, 1:] = 0
            # The reference repeats each sentence's keys/values for its rows (no folding involved).
            rep = torch.arange(n).repeat_interleave(B // n)
            lp, new_kv, w = model.decode_step(
                tokens,
                positions,
                past,
                past_mask,
                [(ck[rep], cv[rep]) for ck, cv in cross],
                src_mask[rep],
                need_weights=True,
            )
            feed = {
                "tokens": tokens.numpy(),
                "positions": positions.numpy(),
                "past_mask": past_mask.numpy(),
                "src_mask": src_mask[:n].numpy(),
                "top_k": np.array([k], dtype=np.int64),
            }
            for i in range(L):
                feed[f"past_key_{i}"], feed[f"past_value_{i}"] = past[i][0].numpy(), past[i][1].numpy()
                feed[f"cross_key_{i}"], feed[f"cross_value_{i}"] = eo[1 + 2 * i][:n], eo[2 + 2 * i][:n]
            do = dict(zip(out_names, dec.run(None, feed)))
            if not all(np.isfinite(x).all() for x in do.values()):
                raise RuntimeError(f"{dec_path.name}: non-finite outputs")
            lp_ort = do["log_probs"]
            diffs["log_probs"] = max(diffs["log_probs"], log_prob_diff(lp_ort, lp.numpy()))
            # The search outputs are exact functions of the graph's own log_probs.
            want_top = -np.sort(-lp_ort, axis=1)[:, :k]
            if (
                do["top_ids"].shape != (B, k)
                or not np.array_equal(do["top_log_probs"], want_top)
                or not np.array_equal(np.take_along_axis(lp_ort, do["top_ids"], axis=1), want_top)
                or not np.array_equal(do["eos_log_prob"], lp_ort[:, cfg.eos_id])
            ):
                raise RuntimeError(f"{dec_path.name}: top_k / eos_log_prob disagree with log_probs")
            for i in range(L):
                for j, name in enumerate(("key", "value")):
                    present = torch.cat([past[i][j], new_kv[i][j]], dim=2).numpy()
                    diffs["present_kv"] = max(
                        diffs["present_kv"], float(np.abs(do[f"present_{name}_{i}"] - present).max())
                    )
            diffs["cross_attention"] = max(
                diffs["cross_attention"], float(np.abs(do["cross_attention"] - w.numpy()).max())
            )
    return diffs


def encoder_parity_check(model: Transformer, enc_path: Path, portable_path: Path, seed: int = 0) -> dict[str, float]:
    """The fused encoder against `Transformer.encode` and `cross_kv` on random padded batches (one
    source filling its batch's length, one of a single token), and against the portable encoder of
    the same precision (`portable_path`). Returns the max abs differences: "encoder_memory" and
    "cross_kv" from PyTorch, "encoder_vs_portable" over all outputs."""
    enc, portable = _cpu_session(enc_path), _cpu_session(portable_path)
    g = torch.Generator().manual_seed(seed)
    diffs = {"encoder_memory": 0.0, "cross_kv": 0.0, "encoder_vs_portable": 0.0}
    for lengths in ([7, 3, 1, 5], [12], [2, 9, 9]):
        S = max(lengths)
        src_mask = (torch.arange(S)[None, :] < torch.tensor(lengths)[:, None]).long()
        src_ids = torch.randint(4, source_vocab_size(model.cfg), (len(lengths), S), generator=g) * src_mask
        feed = {"src_ids": src_ids.numpy(), "src_mask": src_mask.numpy()}
        out, ref = enc.run(None, feed), portable.run(None, feed)
        if not all(np.isfinite(x).all() for x in out):
            raise RuntimeError(f"{enc_path.name}: non-finite outputs")
        with torch.no_grad():
            memory = model.encode(src_ids, src_mask)
            cross = [t.numpy() for kv in model.cross_kv(memory) for t in kv]
        diffs["encoder_memory"] = max(diffs["encoder_memory"], float(np.abs(out[0] - memory.numpy()).max()))
        diffs["cross_kv"] = max(diffs["cross_kv"], *(float(np.abs(a - b).max()) for a, b in zip(out[1:], cross)))
        diffs["encoder_vs_portable"] = max(
            diffs["encoder_vs_portable"], *(float(np.abs(a - b).max()) for a, b in zip(out, ref))
        )
    return diffs


# The fused step's states, one per (sentences n, beams K, past length P, cache slots M, source length S).
_FUSED_CASES = ((4, 1, 0, 8, 7), (3, 1, 5, 12, 9), (2, 4, 6, 16, 9), (3, 2, 10, 11, 5))


@dataclass
class _FusedReference:
    """`Transformer.decode_step`'s outputs for one fused state: log_probs, the new self-attention
    keys/values per layer and the cross-attention weights."""

    log_probs: torch.Tensor
    new_kv: list[tuple[torch.Tensor, torch.Tensor]]
    cross_attention: torch.Tensor


def _fused_state(
    model: Transformer, case: tuple[int, int, int, int, int], g: torch.Generator, rng: np.random.Generator
) -> tuple[dict[str, np.ndarray], _FusedReference]:
    """A random state of the fused step's contract (rows that joined at later slots, junk past P,
    histories from other beams through cache_indirection): the graph's feed and PyTorch's reference."""
    cfg = model.cfg
    n, K, P, M, S = case
    H, dk, L = cfg.n_heads, cfg.d_k, cfg.n_decoder_layers
    B = n * K
    lengths = torch.randint(1, S + 1, (n,), generator=g)
    lengths[0] = S
    src_mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    src_ids = torch.randint(4, source_vocab_size(cfg), (n, S), generator=g) * src_mask
    start = torch.randint(0, P + 1, (n,), generator=g).repeat_interleave(K)  # a sentence's first slot
    start[0] = 0
    positions = P - start
    tokens = torch.randint(4, cfg.vocab_size, (B, 1), generator=g)
    cache = [torch.randn(B, H, M, dk, generator=g) for _ in range(2 * L)]
    indirection = rng.integers(0, K, (n, K, M)).astype(np.int32)
    # Row b's slot t lives in row (b // K) * K + indirection[b // K, b % K, t].
    owner = (np.arange(B) // K * K)[:, None] + indirection.reshape(B, M)  # (B, M)
    slots = np.arange(P)
    past = [c[owner[:, :P], :, slots].permute(0, 2, 1, 3) for c in cache]  # (B, H, P, d_k)
    past_mask = (torch.arange(P)[None, :] >= start[:, None]).float()
    with torch.no_grad():
        cross = model.cross_kv(model.encode(src_ids, src_mask))
        rep = torch.arange(n).repeat_interleave(K)
        lp, new_kv, w = model.decode_step(
            tokens,
            positions,
            list(zip(past[0::2], past[1::2])),
            past_mask,
            [(ck[rep], cv[rep]) for ck, cv in cross],
            src_mask[rep],
            need_weights=True,
        )
    junk = rng.integers(0, 2, (B, M - P - 1))  # columns past P: never read
    self_mask = np.concatenate([past_mask.numpy(), np.ones((B, 1)), junk], axis=1).astype(np.int32)
    feed = {
        "tokens": tokens.numpy(),
        "positions": positions[:, None].numpy(),
        "past_sequence_length": np.array([P], np.int32),
        "self_mask": self_mask,
        "src_mask": src_mask.numpy().astype(np.int32),
        "top_k": np.array([2 * K], np.int64),
        "beam_width": np.array([K], np.int32),
        "cache_indirection": indirection,
    }
    for i in range(L):
        feed[f"cache_key_{i}"], feed[f"cache_value_{i}"] = cache[2 * i].numpy(), cache[2 * i + 1].numpy()
        feed[f"cross_key_{i}"], feed[f"cross_value_{i}"] = cross[i][0].numpy(), cross[i][1].numpy()
    return feed, _FusedReference(lp, new_kv, w)


def _compare_fused(out: dict[str, np.ndarray], ref: _FusedReference, P: int, diffs: dict[str, float]) -> None:
    """Fold one state's differences between the fused step's outputs and PyTorch into `diffs`."""
    diffs["log_probs"] = max(diffs["log_probs"], log_prob_diff(out["log_probs"], ref.log_probs.numpy()))
    diffs["cross_attention"] = _max_diff(diffs["cross_attention"], out["cross_attention"], ref.cross_attention.numpy())
    for i, layer_kv in enumerate(ref.new_kv):
        for name, new in zip(("key", "value"), layer_kv):
            got = out[f"present_{name}_{i}"][:, :, P]
            diffs["present_kv"] = _max_diff(diffs["present_kv"], got, new[:, :, 0].numpy())


def _check_fused_search(out: dict[str, np.ndarray], top_k: int, eos_id: int, dec_name: str) -> None:
    """The search outputs are exact functions of the graph's own log_probs (ties: the lower id first)."""
    want_top = -np.sort(-out["log_probs"], axis=1)[:, :top_k]
    want_ids = np.argsort(-out["log_probs"], axis=1, kind="stable")[:, :top_k]
    if (
        not np.array_equal(out["top_log_probs"], want_top)
        or not np.array_equal(out["top_ids"], want_ids)
        or not np.array_equal(out["eos_log_prob"], out["log_probs"][:, eos_id])
    ):
        raise RuntimeError(f"{dec_name}: top_k / eos_log_prob disagree with log_probs")


def _compare_unscored(
    unscored: ort.InferenceSession,
    unscored_name: str,
    feed: dict[str, np.ndarray],
    out: dict[str, np.ndarray],
    dec_name: str,
    eos_id: int,
    diffs: dict[str, float],
) -> None:
    """Run the unscored step on the scored step's state, with eos_bias 0 and again with every other
    row's </s> banned (-inf): its top_ids must be the argmax of the scored log_probs, without </s>
    in the banned rows, and its other outputs are folded into diffs["unscored"]."""
    feed = {k: v for k, v in feed.items() if k != "top_k"}
    rows = len(feed["tokens"])
    banned = np.arange(rows) % 2 == 1
    for bias in (np.zeros((rows, 1), np.float32), np.where(banned, -np.inf, 0).astype(np.float32)[:, None]):
        got = dict(zip([o.name for o in unscored.get_outputs()], unscored.run(None, feed | {EOS_BIAS: bias})))
        want = out["log_probs"].copy()
        want[:, eos_id] += bias[:, 0]
        if not np.array_equal(got["top_ids"][:, 0], want.argmax(axis=1)):
            raise RuntimeError(f"{unscored_name}: top_ids are not the argmax of {dec_name}'s log_probs with eos_bias")
        for name, value in got.items():
            if name != "top_ids":
                diffs["unscored"] = _max_diff(diffs["unscored"], value, out[name])


def fused_parity_check(
    model: Transformer, dec_path: Path, seed: int = 0, unscored_path: Path | None = None
) -> dict[str, float]:
    """The fused decoder step against `Transformer.decode_step` on random states that exercise
    its contract: rows that joined at later slots (masked), junk in the slots past P and in the
    mask's unused columns, sentences of K beams whose histories come from other beams through
    cache_indirection, and the first step (P = 0). Returns the max abs differences ("log_probs":
    above LOG_PROB_FLOOR, `log_prob_diff`).

    With `unscored_path` (the same step built with `scored=False`), that graph runs on the same
    states too: its top_ids must be the argmax of `dec_path`'s log-probabilities, and its caches and
    cross-attention are compared with `dec_path`'s ("unscored")."""
    dec = _cpu_session(dec_path)
    names = [o.name for o in dec.get_outputs()]
    unscored = _cpu_session(unscored_path) if unscored_path else None
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    diffs = {"log_probs": 0.0, "present_kv": 0.0, "cross_attention": 0.0} | ({"unscored": 0.0} if unscored else {})
    for case in _FUSED_CASES:
        feed, ref = _fused_state(model, case, g, rng)
        out = dict(zip(names, dec.run(None, feed)))
        if not all(np.isfinite(x).all() for x in out.values()):
            raise RuntimeError(f"{dec_path.name}: non-finite outputs")
        _compare_fused(out, ref, case[2], diffs)
        _check_fused_search(out, 2 * case[1], model.cfg.eos_id, dec_path.name)
        if unscored is not None and unscored_path is not None:
            _compare_unscored(unscored, unscored_path.name, feed, out, dec_path.name, model.cfg.eos_id, diffs)
    return diffs
