"""The fp32 encoder and decoder-step graphs, exported from the PyTorch model as `contract.graphs`
specifies them.

Exporter: `torch.onnx.export(dynamo=True)` (torch.export + onnxscript, the default and maintained
exporter since torch 2.9) with named dynamic dims; the legacy TorchScript tracer (`dynamo=False`,
deprecated) is kept behind `--exporter torchscript` as a fallback. Both produce equivalent graphs.

The output projection has its own copy of the (tied) embedding matrix, so that int8 quantisation
reaches it: at batch 32 it is a third of a decoder step.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path

import torch
import torch.nn as nn
from onnx import TensorProto, helper
from torch.export import Dim

from contract.graphs import (
    EOS_LOG_PROB,
    LOG_PROBS,
    SEARCH_INPUT,
    SEARCH_OUTPUTS,
    TOP_IDS,
    TOP_LOG_PROBS,
    decoder_io,
    encoder_io,
)
from contract.manifest import TensorSpec
from export import onnx_files
from export.model import ModelConfig, Transformer

OPSET = 18
EXPORTERS = ("dynamo", "torchscript")


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

    out_proj: torch.Tensor  # a buffer, registered in __init__

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
        logits = torch.matmul(h, self.out_proj)  # (B, V)
        if self.model.cfg.logits_bias:
            logits = logits + self.model.final_logits_bias
        log_probs = torch.log_softmax(logits.float(), dim=-1)  # (B, V)
        out = [log_probs]
        for (pk, pv), (k, v) in zip(past_kv, new_kv):  # the attention's own concatenation (ORT's CSE merges them)
            out += [torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)]  # (B, H, P + 1, d_k)
        return (*out, weights)


def add_search_outputs(path: Path, cfg: ModelConfig) -> None:
    """Add to an exported decoder-step graph the input top_k (1,) int64 and the outputs
    top_log_probs / top_ids (B, top_k) (TopK of log_probs, best first, ties to the lower id) and
    eos_log_prob (B,), as `decoder_io` specifies them and in its order."""
    dtypes = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64}
    specs_in, specs_out = decoder_io(cfg)
    spec = {t.name: t for t in specs_in + specs_out}

    def value_info(name: str):
        return helper.make_tensor_value_info(name, dtypes[spec[name].dtype], spec[name].shape)

    model = onnx_files.load_graph(path)  # its external data stays where it is
    g = model.graph
    g.input.append(value_info(SEARCH_INPUT))
    g.initializer.append(helper.make_tensor("search_eos_id", TensorProto.INT64, [], [cfg.eos_id]))
    g.node.extend(
        [
            helper.make_node(
                "TopK",
                [LOG_PROBS, SEARCH_INPUT],
                [TOP_LOG_PROBS, TOP_IDS],
                name="search_top_k",
                axis=-1,
                largest=1,
                sorted=1,
            ),
            helper.make_node(
                "Gather", [LOG_PROBS, "search_eos_id"], [EOS_LOG_PROB], name="search_eos_log_prob", axis=1
            ),
        ]
    )
    exported = {o.name: o for o in g.output}
    del g.output[:]
    g.output.extend(exported[t.name] if t.name in exported else value_info(t.name) for t in specs_out)
    onnx_files.save(model, path)
    onnx_files.check(path)


def example_inputs(cfg: ModelConfig, B: int = 3, S: int = 5, P: int = 4, seed: int = 0, K: int = 2):
    """Example inputs for tracing: the encoder's B sentences, the decoder's B x K rows (K beams
    each). Every dynamic axis gets a distinct size > 1 so that nothing is specialised to the
    example (torch.export specialises sizes 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    src_vocab = cfg.vocab_size if cfg.src_vocab_size is None else cfg.src_vocab_size
    src_ids = torch.randint(4, src_vocab, (B, S), generator=g)
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


def _module_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def _export_graph(
    module: nn.Module,
    args: tuple,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    path: Path,
    exporter: str,
    dynamic_shapes=None,
) -> None:
    """Export `module` to `path`; a module whose parameters and buffers reach
    `onnx_files.EXTERNAL_DATA_BYTES` keeps its weights as external data (the dynamo exporter names
    the file `path`'s name + ".data"; the TorchScript exporter writes one file per tensor beside it
    past 2 GiB)."""
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
                    external_data=_module_bytes(module) >= onnx_files.EXTERNAL_DATA_BYTES,
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
        # The wrappers are built in eval mode: the TorchScript exporter restores each module's own
        # training flag afterwards, and a wrapper left in training mode would switch dropout on in
        # the model that the parity check then compares against.
        _export_graph(EncoderGraph(model).eval(), enc_args, *encoder_io(cfg), enc_path, exporter, enc_ds)
        dec_in, dec_out = decoder_io(cfg)
        _export_graph(
            DecoderStepGraph(model).eval(),
            dec_args,
            [t for t in dec_in if t.name != SEARCH_INPUT],
            [t for t in dec_out if t.name not in SEARCH_OUTPUTS],
            dec_path,
            exporter,
            dec_ds,
        )
    add_search_outputs(dec_path, cfg)
    return enc_path, dec_path
