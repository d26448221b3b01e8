"""`mtserve export`: a model dir -> a self-contained ONNX export dir for the serving path.

Two graphs per precision, cut where the serving loop needs them:
- encoder:      src_ids, src_mask (B, S) -> memory (B, S, d_model) and every decoder layer's
                cross-attention keys/values cross_key_{i} / cross_value_{i} (B, H, S, d_k);
- decoder step: one incremental step of `Transformer.decode_step` with an explicit key/value
                cache over B rows of n sentences (each sentence's beams are consecutive rows; n == B
                for greedy search): tokens (B, 1), positions (B,), past_key_{i} / past_value_{i}
                (B, H, P, d_k), past_mask (B, P), cross_key_{i} / cross_value_{i} (n, H, S, d_k) and
                src_mask (n, S) once per sentence (the beams are folded into the cross-attention
                query, one attention per sentence and head instead of one per row), top_k (1,)
                -> log_probs (B, V); the search's inputs computed in the graph, so that the
                serving loop never scans the vocabulary in numpy: top_log_probs / top_ids (B, k),
                the k best tokens of each row best first, and eos_log_prob (B,); present_key_{i} /
                present_value_{i} (B, H, P + 1, d_k), the cache with this step appended (the
                attention builds it anyway; returning it spares the host a copy per step); and
                cross_attention (B, S), the last layer's cross-attention averaged over heads.
                The output projection has its own copy of the (tied) embedding matrix, so that
                int8 quantisation reaches it: at batch 32 it is a third of a decoder step.
Axes batch, sentences, src_len and past_len are dynamic (past_len may be 0, the first step); rows of a call
may be at different positions, their past padded and masked by past_mask.

Exporter: `torch.onnx.export(dynamo=True)` (torch.export + onnxscript, the default and maintained
exporter since torch 2.9) with named dynamic dims; the legacy TorchScript tracer (`dynamo=False`,
deprecated) is kept behind `--exporter torchscript` as a fallback. Both produce equivalent graphs.

Precisions (file names carry the precision, so they live side by side; `manifest.json` lists them):
- fp32: the reference; ORT graph optimisations (ORT_ENABLE_EXTENDED, CPU EP) applied at export time
        and the optimised graph is what ships;
- int8: dynamic quantisation of the MatMul weights (onnxruntime.quantization.quantize_dynamic,
        signed int8 weights, uint8 activations quantised at run time), then ORT_ENABLE_EXTENDED;
        for the CPU;
- fp16: weights and activations in fp16 for CUDA, softmax and log-softmax kept in fp32 as in the
        PyTorch model, graph inputs/outputs stay fp32 so the serving code is the same for every
        precision. Only ORT_ENABLE_BASIC (portable, EP-independent) is baked in: the extended level
        on a CPU session would bake CPU-specific fallbacks into a graph meant for CUDA.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from contract.manifest import (
    MANIFEST,
    PRECISIONS,
    Dims,
    FileSpec,
    GenerationDefaults,
    GraphSpec,
    Manifest,
    ManifestError,
    SpecialIds,
    TensorSpec,
    Variant,
    load_manifest,
    sha256_file,
    write_manifest,
)
from export.checkpoint import CONFIG, TOKENIZER, WEIGHTS, load_model
from export.model import ModelConfig, Transformer

log = logging.getLogger("mtserve.export")

OPSET = 18
EXPORTERS = ("dynamo", "torchscript")
# Per-precision parity bound checked at export time against PyTorch (max |Δ log_probs|).
FP32_TOLERANCE = 1e-4


# ----------------------------------------------------------------------------- the graphs' contract


def encoder_io(cfg: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    kv = ["batch", cfg.n_heads, "src_len", cfg.d_k]
    inputs = [
        TensorSpec(name="src_ids", dtype="int64", shape=["batch", "src_len"]),
        TensorSpec(name="src_mask", dtype="int64", shape=["batch", "src_len"]),
    ]
    outputs = [TensorSpec(name="memory", dtype="float32", shape=["batch", "src_len", cfg.d_model])]
    for i in range(cfg.n_decoder_layers):
        outputs += [
            TensorSpec(name=f"cross_key_{i}", dtype="float32", shape=kv),
            TensorSpec(name=f"cross_value_{i}", dtype="float32", shape=kv),
        ]
    return inputs, outputs


def decoder_io(cfg: ModelConfig) -> tuple[list[TensorSpec], list[TensorSpec]]:
    L, H, dk = cfg.n_decoder_layers, cfg.n_heads, cfg.d_k
    past = ["batch", H, "past_len", dk]
    cross = ["sentences", H, "src_len", dk]  # once per sentence; its beams are consecutive rows
    inputs = [
        TensorSpec(name="tokens", dtype="int64", shape=["batch", 1]),
        TensorSpec(name="positions", dtype="int64", shape=["batch"]),
    ]
    for i in range(L):
        inputs += [
            TensorSpec(name=f"past_key_{i}", dtype="float32", shape=past),
            TensorSpec(name=f"past_value_{i}", dtype="float32", shape=past),
        ]
    inputs.append(TensorSpec(name="past_mask", dtype="float32", shape=["batch", "past_len"]))
    for i in range(L):
        inputs += [
            TensorSpec(name=f"cross_key_{i}", dtype="float32", shape=cross),
            TensorSpec(name=f"cross_value_{i}", dtype="float32", shape=cross),
        ]
    inputs.append(TensorSpec(name="src_mask", dtype="int64", shape=["sentences", "src_len"]))
    inputs.append(TensorSpec(name="top_k", dtype="int64", shape=[1]))
    outputs = [
        TensorSpec(name="log_probs", dtype="float32", shape=["batch", cfg.vocab_size]),
        TensorSpec(name="top_log_probs", dtype="float32", shape=["batch", "top_k"]),
        TensorSpec(name="top_ids", dtype="int64", shape=["batch", "top_k"]),
        TensorSpec(name="eos_log_prob", dtype="float32", shape=["batch"]),
    ]
    present = ["batch", H, "present_len", dk]
    for i in range(L):
        outputs += [
            TensorSpec(name=f"present_key_{i}", dtype="float32", shape=present),
            TensorSpec(name=f"present_value_{i}", dtype="float32", shape=present),
        ]
    outputs.append(TensorSpec(name="cross_attention", dtype="float32", shape=["batch", "src_len"]))
    return inputs, outputs


# ----------------------------------------------------------------------------- export adapters


class EncoderGraph(nn.Module):
    """(src_ids, src_mask) -> (memory, cross_key_0, cross_value_0, cross_key_1, ...)."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, src_ids, src_mask):
        memory = self.model.encode(src_ids, src_mask)
        out = [memory]
        for k, v in self.model.cross_kv(memory):
            out += [k, v]
        return tuple(out)


class DecoderStepGraph(nn.Module):
    """One `decode_step` with flat cache tensors. `past` and `cross` are flat tuples
    (key_0, value_0, key_1, value_1, ...), flattened by the exporter into graph inputs in order:
    tokens, positions, past_key_0, past_value_0, ..., past_mask, cross_key_0, ..., src_mask.
    Returns log_probs, present (k, v) per layer and the cross-attention; `add_search_outputs`
    adds top_k and its outputs to the exported graph afterwards (a data-dependent k does not
    go through torch.export).

    The output projection multiplies by its own copy of the embedding matrix, stored transposed
    (d_model, V): shared with the embedding lookup, the weight reaches the MatMul through a
    Transpose and dynamic quantisation leaves that MatMul in fp32."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        w = model.generator.weight if model.generator is not None else model.embed.weight  # (V, d_model)
        self.register_buffer("out_proj", w.detach().t().contiguous().clone())  # (d_model, V)

    def forward(self, tokens, positions, past, past_mask, cross, src_mask):
        L = len(self.model.decoder_layers)
        past_kv = [(past[2 * i], past[2 * i + 1]) for i in range(L)]
        cross_kv = [(cross[2 * i], cross[2 * i + 1]) for i in range(L)]
        h, new_kv, weights = self.model.decode_step_hidden(
            tokens, positions, past_kv, past_mask, cross_kv, src_mask, need_weights=True
        )  # h: (B, d_model)
        log_probs = torch.log_softmax(torch.matmul(h, self.out_proj).float(), dim=-1)  # (B, V)
        out = [log_probs]
        for (pk, pv), (k, v) in zip(past_kv, new_kv):  # the attention's own concatenation (ORT's CSE merges them)
            out += [torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)]  # (B, H, P + 1, d_k)
        return (*out, weights)


SEARCH_INPUT = "top_k"
SEARCH_OUTPUTS = ("top_log_probs", "top_ids", "eos_log_prob")


def add_search_outputs(path: Path, cfg: ModelConfig) -> None:
    """Add to an exported decoder-step graph the input top_k (1,) int64 and the outputs
    top_log_probs / top_ids (B, top_k) (TopK of log_probs, best first, ties to the lower id) and
    eos_log_prob (B,), as `decoder_io` specifies them and in its order."""
    import onnx
    from onnx import TensorProto, helper

    dtypes = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    specs_in, specs_out = decoder_io(cfg)
    spec = {t.name: t for t in specs_in + specs_out}

    def value_info(name: str):
        return helper.make_tensor_value_info(name, dtypes[spec[name].dtype], spec[name].shape)

    model = onnx.load(str(path))
    g = model.graph
    g.input.append(value_info(SEARCH_INPUT))
    g.initializer.append(helper.make_tensor("search_eos_id", TensorProto.INT64, [], [cfg.eos_id]))
    g.node.extend(
        [
            helper.make_node(
                "TopK",
                ["log_probs", "top_k"],
                ["top_log_probs", "top_ids"],
                name="search_top_k",
                axis=-1,
                largest=1,
                sorted=1,
            ),
            helper.make_node(
                "Gather", ["log_probs", "search_eos_id"], ["eos_log_prob"], name="search_eos_log_prob", axis=1
            ),
        ]
    )
    exported = {o.name: o for o in g.output}
    del g.output[:]
    g.output.extend(exported[t.name] if t.name in exported else value_info(t.name) for t in specs_out)
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def example_inputs(cfg: ModelConfig, B: int = 3, S: int = 5, P: int = 4, seed: int = 0, K: int = 2):
    """Example inputs for tracing: the encoder's B sentences, the decoder's B x K rows (K beams
    each). Every dynamic axis gets a distinct size > 1 so that nothing is specialised to the
    example (torch.export specialises sizes 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    src_ids = torch.randint(4, cfg.vocab_size, (B, S), generator=g)
    src_mask = torch.ones(B, S, dtype=torch.long)
    src_mask[1, S - 2 :] = 0
    src_ids[src_mask == 0] = cfg.pad_id
    H, dk, L = cfg.n_heads, cfg.d_k, cfg.n_decoder_layers
    R = B * K
    tokens = torch.randint(4, cfg.vocab_size, (R, 1), generator=g)
    positions = torch.full((R,), P, dtype=torch.long)
    past = tuple(torch.randn(R, H, P, dk, generator=g) for _ in range(2 * L))
    past_mask = torch.ones(R, P)
    past_mask[2, :2] = 0
    cross = tuple(torch.randn(B, H, S, dk, generator=g) for _ in range(2 * L))
    return (src_ids, src_mask), (tokens, positions, past, past_mask, cross, src_mask)


def _dynamic_axes(specs: list[TensorSpec]) -> dict[str, dict[int, str]]:
    return {t.name: {i: d for i, d in enumerate(t.shape) if isinstance(d, str)} for t in specs}


def _export_graph(
    module: nn.Module,
    args: tuple,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    exporter: str,
    dynamic_shapes=None,
) -> None:
    names_in, names_out = [t.name for t in inputs], [t.name for t in outputs]
    torch_onnx_log = logging.getLogger("torch.onnx")
    level = torch_onnx_log.level
    torch_onnx_log.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms"...
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                torch.onnx.export(
                    module,
                    args,
                    str(path),
                    input_names=names_in,
                    output_names=names_out,
                    opset_version=OPSET,
                    dynamo=True,
                    dynamic_shapes=dynamic_shapes,
                    external_data=False,
                    optimize=True,
                    verbose=False,
                )
            elif exporter == "torchscript":
                torch.onnx.export(
                    module,
                    args,
                    str(path),
                    input_names=names_in,
                    output_names=names_out,
                    opset_version=OPSET,
                    dynamo=False,
                    do_constant_folding=True,
                    dynamic_axes=_dynamic_axes(inputs + outputs),
                )
            else:
                raise ValueError(f"unknown exporter {exporter!r}; choose from {EXPORTERS}")
    finally:
        torch_onnx_log.setLevel(level)


def export_raw(model: Transformer, out_dir: Path, exporter: str = "dynamo") -> tuple[Path, Path]:
    """Export the fp32 encoder and decoder-step graphs, before any ORT optimisation."""
    cfg = model.cfg
    model = model.eval()
    enc_args, dec_args = example_inputs(cfg)
    enc_path, dec_path = out_dir / "encoder.raw.onnx", out_dir / "decoder.raw.onnx"
    enc_ds = dec_ds = None
    if exporter == "dynamo":
        from torch.export import Dim

        batch, sentences, src_len, past_len = Dim("batch"), Dim("sentences"), Dim("src_len"), Dim("past_len")
        enc_ds = ({0: batch, 1: src_len}, {0: batch, 1: src_len})
        L = cfg.n_decoder_layers
        dec_ds = (
            {0: batch},
            {0: batch},
            tuple({0: batch, 2: past_len} for _ in range(2 * L)),
            {0: batch, 1: past_len},
            tuple({0: sentences, 2: src_len} for _ in range(2 * L)),
            {0: sentences, 1: src_len},
        )
    with torch.no_grad():
        _export_graph(EncoderGraph(model), enc_args, *encoder_io(cfg), enc_path, exporter, enc_ds)
        dec_in, dec_out = decoder_io(cfg)
        _export_graph(
            DecoderStepGraph(model),
            dec_args,
            [t for t in dec_in if t.name != SEARCH_INPUT],
            [t for t in dec_out if t.name not in SEARCH_OUTPUTS],
            dec_path,
            exporter,
            dec_ds,
        )
    add_search_outputs(dec_path, cfg)
    return enc_path, dec_path


# ----------------------------------------------------------------------------- precision variants


def ort_optimize(src: Path, dst: Path, level: str, provider: str = "cpu") -> None:
    """Apply ORT's graph optimisations at `level` on a session of `provider` and save the result."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }[level]
    so.optimized_model_filepath = str(dst)
    so.log_severity_level = 3
    providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    ort.InferenceSession(str(src), so, providers=providers)


def cuda_available() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def quantize_int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))  # quantize_dynamic logs "please run pre-processing" hints
    try:
        quantize_dynamic(
            str(src),
            str(dst),
            op_types_to_quantize=["MatMul"],
            weight_type=QuantType.QInt8,
            per_channel=True,
            reduce_range=False,
        )
    finally:
        root.setLevel(level)


def convert_fp16(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    model = onnx.load(str(src))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the value is out of fp16 range, clamped" on -inf-free graphs
        model = convert_float_to_float16(
            model, keep_io_types=True, op_block_list=DEFAULT_OP_BLOCK_LIST + ["Softmax", "LogSoftmax"]
        )
    _toposort(model.graph)
    for node in model.graph.node:  # the exporter's per-node stack traces: not needed in what ships
        del node.metadata_props[:]
        node.doc_string = ""
    onnx.save(model, str(dst))


def _toposort(graph) -> None:
    """Sort the nodes of a graph (no subgraphs) topologically, in place, keeping the original order
    among ready nodes; the fp16 converter appends its casts at the end."""
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending, ordered = list(graph.node), []
    while pending:
        rest = []
        for node in pending:
            if all(name in available for name in node.input):
                ordered.append(node)
                available.update(node.output)
            else:
                rest.append(node)
        if len(rest) == len(pending):
            raise RuntimeError(f"graph has a cycle or dangling inputs: {[n.name for n in rest][:5]}")
        pending = rest
    copies = [type(n)() for n in ordered]
    for c, n in zip(copies, ordered):
        c.CopyFrom(n)
    del graph.node[:]
    graph.node.extend(copies)


VARIANT_RECIPES = {
    # precision: (target EP, ORT optimisation level baked in, notes)
    "fp32": ("cpu", "extended", "reference precision"),
    "int8": (
        "cpu",
        "extended",
        "dynamic quantisation of the MatMul weights (int8 per output channel), uint8 activations quantised at run time",
    ),
    "fp16": (
        "cuda",
        "extended",
        "fp16 weights and activations for CUDA; softmax and log-softmax in fp32; "
        "fp32 graph inputs/outputs; runs on the CPU EP too (slowly, through casts "
        "that ORT inserts at load time)",
    ),
}


def variant_level(precision: str) -> tuple[str, str | None]:
    """(provider, level) of the ORT optimisation baked into the shipped graph; level None: none.
    The fp16 graph is meant for CUDA: optimised on a CPU session it would ship with the CPU EP's
    fp16 fallback casts baked in, so without a CUDA EP at export time it ships as converted (the
    exporter's own optimisation passes only) and ORT optimises it when a CUDA session loads it."""
    target, level, _ = VARIANT_RECIPES[precision]
    if target == "cuda" and not cuda_available():
        return "cuda", None
    return target, level


def build_variant(precision: str, raw_enc: Path, raw_dec: Path, work: Path) -> tuple[Path, Path]:
    provider, level = variant_level(precision)
    out = []
    for raw in (raw_enc, raw_dec):
        part = raw.name.split(".")[0]  # encoder / decoder
        final = work / f"{part}.{precision}.onnx"
        if precision == "fp32":
            src = raw
        elif precision == "int8":
            src = work / f"{part}.int8.q.onnx"
            quantize_int8(raw, src)
        elif precision == "fp16":
            src = work / f"{part}.fp16.c.onnx"
            convert_fp16(raw, src)
        else:
            raise ValueError(f"unknown precision {precision!r}")
        if level is None:
            shutil.copyfile(src, final)
        else:
            ort_optimize(src, final, level, provider)
        out.append(final)
    return out[0], out[1]


# ----------------------------------------------------------------------------- checks


def _elem_type_name(t: int) -> str:
    import onnx

    return {
        onnx.TensorProto.INT64: "int64",
        onnx.TensorProto.FLOAT: "float32",
        onnx.TensorProto.FLOAT16: "float16",
    }.get(t, str(t))


def check_graph(path: Path, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
    """onnx.checker (full check) plus the graph's I/O against the contract: names, order, dtypes,
    ranks and symbolic axes."""
    import onnx

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
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
    with a padded past, against PyTorch. Returns the max abs differences."""
    import onnxruntime as ort

    cfg = model.cfg
    so = ort.SessionOptions()
    so.log_severity_level = 3
    enc = ort.InferenceSession(str(enc_path), so, providers=["CPUExecutionProvider"])
    dec = ort.InferenceSession(str(dec_path), so, providers=["CPUExecutionProvider"])
    g = torch.Generator().manual_seed(seed)
    B, S, L = 4, 7, cfg.n_decoder_layers
    lengths = torch.tensor([7, 3, 1, 5])
    src_mask = (torch.arange(S)[None, :] < lengths[:, None]).long()
    src_ids = torch.randint(4, cfg.vocab_size, (B, S), generator=g) * src_mask
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
            diffs["log_probs"] = max(diffs["log_probs"], float(np.abs(lp_ort - lp.numpy()).max()))
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


# ----------------------------------------------------------------------------- the export dir


def _tool_versions() -> dict[str, str]:
    import onnx
    import onnxruntime

    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    try:
        import onnxscript

        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        pass
    try:
        from importlib.metadata import version

        versions["mtserve"] = version("mtserve")
    except ImportError:  # PackageNotFoundError: running from a checkout without an install
        pass
    return versions


def default_out_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / "onnx"


def export_model(
    model_dir: str | Path,
    out_dir: str | Path | None = None,
    precisions=("fp32",),
    exporter: str = "dynamo",
    name: str | None = None,
    version: str | None = None,
    check: bool = True,
) -> Manifest:
    """Export `precisions` of the model in `model_dir` into `out_dir` (default MODEL_DIR/onnx) and
    update its manifest. Variants exported from other weights are dropped."""
    t0 = time.perf_counter()
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir else default_out_dir(model_dir)
    precisions = list(dict.fromkeys(precisions))
    for p in precisions:
        if p not in PRECISIONS:
            raise ValueError(f"unknown precision {p!r}; choose from {PRECISIONS}")
    meta = json.loads((model_dir / CONFIG).read_text())
    model = load_model(model_dir, "cpu")
    cfg = model.cfg
    weights_sha = sha256_file(model_dir / WEIGHTS)
    out.mkdir(parents=True, exist_ok=True)

    old: Manifest | None = None
    if (out / MANIFEST).is_file():
        try:
            old = load_manifest(out, verify_checksums=False)
        except ManifestError as e:
            log.warning("ignoring the existing manifest: %s", e)
    variants: dict[str, Variant] = {}
    if old is not None and old.source_weights_sha256 == weights_sha:
        variants = {k: v for k, v in old.variants.items() if k not in precisions and v.opset == OPSET}

    with tempfile.TemporaryDirectory(prefix=".export-", dir=out) as tmp:
        work = Path(tmp)
        raw_enc, raw_dec = export_raw(model, work, exporter)
        if check:
            check_graph(raw_enc, *encoder_io(cfg))
            check_graph(raw_dec, *decoder_io(cfg))
        for precision in precisions:
            target, _, notes = VARIANT_RECIPES[precision]
            level = variant_level(precision)[1]
            enc, dec = build_variant(precision, raw_enc, raw_dec, work)
            checks: dict[str, float] = {}
            if check:
                check_graph(enc, *encoder_io(cfg))
                check_graph(dec, *decoder_io(cfg))
                checks = parity_check(model, enc, dec)
                if precision == "fp32" and checks["log_probs"] > FP32_TOLERANCE:
                    raise RuntimeError(
                        f"fp32 export differs from PyTorch: max |Δ log_probs| = {checks['log_probs']:.2e}"
                    )
            for path in (enc, dec):
                path.replace(out / path.name)
            variants[precision] = Variant(
                precision=precision,
                opset=OPSET,
                exporter=f"torch.onnx.export(dynamo={exporter == 'dynamo'})",
                optimization=f"ORT_ENABLE_{level.upper()}" if level else "none (ORT optimises at load)",
                target=target,
                notes=notes,
                parity={k: float(f"{v:.3g}") for k, v in checks.items()},
                encoder=GraphSpec(
                    file=enc.name,
                    sha256=sha256_file(out / enc.name),
                    inputs=encoder_io(cfg)[0],
                    outputs=encoder_io(cfg)[1],
                ),
                decoder=GraphSpec(
                    file=dec.name,
                    sha256=sha256_file(out / dec.name),
                    inputs=decoder_io(cfg)[0],
                    outputs=decoder_io(cfg)[1],
                ),
            )
            log.info("exported %s into %s", precision, out)

    shutil.copyfile(model_dir / TOKENIZER, out / TOKENIZER)
    gen = GenerationDefaults(**meta.get("generation", {}))
    manifest = Manifest(
        name=name or meta.get("name") or model_dir.resolve().name,
        version=version or str(meta.get("version") or weights_sha[:12]),
        src_lang=meta.get("src_lang", "de"),
        tgt_lang=meta.get("tgt_lang", "en"),
        source_weights_sha256=weights_sha,
        special_ids=SpecialIds(pad_id=cfg.pad_id, bos_id=cfg.bos_id, eos_id=cfg.eos_id, unk_id=cfg.unk_id),
        dims=Dims(
            vocab_size=cfg.vocab_size,
            d_model=cfg.d_model,
            n_heads=cfg.n_heads,
            d_k=cfg.d_k,
            n_encoder_layers=cfg.n_encoder_layers,
            n_decoder_layers=cfg.n_decoder_layers,
            max_positions=cfg.max_positions,
        ),
        generation=gen,
        tokenizer=FileSpec(file=TOKENIZER, sha256=sha256_file(out / TOKENIZER)),
        tool_versions=_tool_versions(),
        opset=OPSET,
        variants=dict(sorted(variants.items(), key=lambda kv: PRECISIONS.index(kv[0]))),
    )
    # Remove graphs no variant refers to any more (e.g. from older weights).
    keep = {f.file for f in manifest.files()}
    for f in out.glob("*.onnx"):
        if f.name not in keep:
            f.unlink()
    write_manifest(out, manifest)
    log.info("export done in %.1fs", time.perf_counter() - t0)
    return manifest


def ensure_exported(
    model_dir: str | Path, precision: str = "fp32", out_dir: str | Path | None = None, exporter: str = "dynamo"
) -> Path:
    """Reuse an up-to-date export (same weights, checksums fine) or export `precision` now."""
    model_dir = Path(model_dir)
    out = Path(out_dir) if out_dir else default_out_dir(model_dir)
    try:
        m = load_manifest(out, verify_checksums=True, precision=precision)
        if m.source_weights_sha256 == sha256_file(model_dir / WEIGHTS):
            return out
    except ManifestError:
        pass
    export_model(model_dir, out, [precision], exporter=exporter)
    return out


# ----------------------------------------------------------------------------- CLI


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="models/de-en", help="model dir (model.safetensors, config.json, tokenizer.json)")
    p.add_argument("--out", help="export dir (default: MODEL/onnx)")
    p.add_argument(
        "--precision",
        default="fp32",
        choices=[*PRECISIONS, "all"],
        help="fp32 (reference), int8 (CPU, dynamic quantisation), fp16 (CUDA), or all three",
    )
    p.add_argument(
        "--exporter",
        default="dynamo",
        choices=EXPORTERS,
        help="torch.onnx.export(dynamo=True) (default) or the legacy TorchScript tracer",
    )
    p.add_argument("--name", help="model name for the manifest (default: config.json's name or the dir name)")
    p.add_argument(
        "--version", help="model version for the manifest (default: config.json's version or the weights' hash)"
    )
    p.add_argument("--no-check", action="store_true", help="skip onnx.checker and the parity check against PyTorch")


def run(args) -> Manifest:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    log.setLevel(logging.INFO)
    precisions = list(PRECISIONS) if args.precision == "all" else [args.precision]
    t0 = time.perf_counter()
    manifest = export_model(
        args.model,
        args.out,
        precisions,
        exporter=args.exporter,
        name=args.name,
        version=args.version,
        check=not args.no_check,
    )
    out = Path(args.out) if args.out else default_out_dir(args.model)
    for p in precisions:
        v = manifest.variants[p]
        sizes = sum(os.path.getsize(out / g.file) for g in (v.encoder, v.decoder)) / 2**20
        print(
            f"{p}: {out / v.encoder.file}, {out / v.decoder.file} ({sizes:.1f} MiB, {v.optimization}); "
            f"max |diff| vs PyTorch: {json.dumps(v.parity)}"
        )
    print(
        f"manifest: {out / MANIFEST} (model {manifest.name} {manifest.version}) in {time.perf_counter() - t0:.1f}s",
        file=sys.stdout,
    )
    return manifest


def main(argv=None) -> None:
    p = argparse.ArgumentParser("mtserve export")
    add_arguments(p)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
