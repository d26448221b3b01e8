"""The builder of the fused graphs and its primitives: `GraphBuilder` (nodes and initializers, the
linear layers as DynamicQuantizeMatMul, MatMulNBits or fp32 MatMul, the Add+LayerNorm, packed
QKV, activation and feed-forward node shapes), `ResidualStream` (pre- and post-norm boundaries),
the weight quantisers (int8 per output channel, MatMulNBits' 8-bit blocks, int8 embedding rows),
the token embedding, and `save_graph`, which checks and writes a graph under its contract.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from contract.graphs import FUSED_LINEAR_KINDS
from contract.manifest import TensorSpec
from export import onnx_files
from export.model import FeedForward, Transformer

MS = "com.microsoft"
DTYPES = {"float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32}
NBITS_BLOCK = 128

_Layer = TypeVar("_Layer", bound=torch.nn.Module)


def quantize_per_channel(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """w (K, N) -> int8 (K, N) and scales (N,): symmetric per output column, as
    onnxruntime.quantization.quantize_dynamic(per_channel=True, QInt8) makes them."""
    amax = np.abs(w).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(w / scale), -127, 127).astype(np.int8), scale


def quantize_blocks(w: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """w (K, N) -> MatMulNBits' 8-bit layout: B (N, K / block, block) uint8 with the default zero
    point 128, scales (N, K / block)."""
    K, N = w.shape
    kb = -(-K // block)
    wt = np.zeros((N, kb * block), np.float32)
    wt[:, :K] = w.T
    wt = wt.reshape(N, kb, block)
    amax = np.abs(wt).max(axis=2)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = (np.clip(np.rint(wt / scale[:, :, None]), -127, 127) + 128).astype(np.uint8)
    return q, scale


class GraphBuilder:
    """Nodes and initializers of one graph, with the few node shapes the step is made of."""

    def __init__(self, linear_kind: str):
        if linear_kind not in FUSED_LINEAR_KINDS:
            raise ValueError(f"unknown linear kind {linear_kind!r}; choose from {FUSED_LINEAR_KINDS}")
        self.linear_kind = linear_kind
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def init(self, name: str, value: npt.ArrayLike) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], name: str, domain: str = "", **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs))
        return outputs[0]

    def linear(self, name: str, x: str, w: np.ndarray, b: np.ndarray | None) -> str:
        """y = x @ w + b as one node; w (K, N)."""
        K, N = w.shape
        bias = self.init(f"{name}.b", b.astype(np.float32)) if b is not None else ""
        y = f"{name}.y"
        if self.linear_kind == "fp32":
            mm = self.node("MatMul", [x, self.init(f"{name}.w", w.astype(np.float32))], [f"{name}.mm"], name)
            return self.node("Add", [mm, bias], [y], f"{name}.add") if bias else mm
        if self.linear_kind == "int8":
            q, s = quantize_per_channel(w)
            ins = [
                x,
                self.init(f"{name}.wq", q),
                self.init(f"{name}.ws", s),
                self.init(f"{name}.wz", np.zeros(N, np.int8)),
            ]
            return self.node("DynamicQuantizeMatMul", [*ins, bias], [y], name, MS)
        q, s = quantize_blocks(w, NBITS_BLOCK)
        ins = [x, self.init(f"{name}.wq", q), self.init(f"{name}.ws", s), "", ""]
        return self.node(
            "MatMulNBits", [*ins, bias], [y], name, MS, K=K, N=N, bits=8, block_size=NBITS_BLOCK, accuracy_level=4
        )

    def module_linear(self, name: str, x: str, lin: torch.nn.Linear) -> str:
        return self.linear(name, x, as_array(lin.weight).T, as_array(lin.bias) if lin.bias is not None else None)

    def add_norm(
        self, name: str, x: str, residual: str, norm: torch.nn.LayerNorm, out: str | None = None
    ) -> tuple[str, str]:
        """(LayerNorm(x + residual), x + residual): the next sublayer's input (named `out`, by
        default NAME.y) and the residual stream."""
        s = self.node("Add", [x, residual], [f"{name}.sum"], f"{name}.add")
        g, b = self.init(f"{name}.g", as_array(norm.weight)), self.init(f"{name}.b", as_array(norm.bias))
        y = out or f"{name}.y"
        return self.node("LayerNormalization", [s, g, b], [y], name, axis=-1, epsilon=float(norm.eps)), s

    def packed_qkv(self, name: str, x: str, qkv_proj: torch.nn.Linear) -> tuple[str, str, str]:
        """q, k, v, each (B, T, D), from one packed MatMul and a Split: ONNX Runtime's CPU attention
        kernels take no packed QKV ("Tensor size (3072) != new size (1024)")."""
        qkv = self.module_linear(f"{name}.qkv", x, qkv_proj)  # (B, T, 3D)
        D = qkv_proj.out_features // 3
        split = self.init(f"{name}.split", np.array([D, D, D], np.int64))
        q, k, v = f"{name}.q", f"{name}.k", f"{name}.v"
        self.node("Split", [qkv, split], [q, k, v], f"{name}.qkv_split", axis=-1)
        return q, k, v

    def activation(self, name: str, x: str, kind: str) -> str:
        """The feed-forward's activation (`ModelConfig.activation`) as one node: Relu, ONNX Runtime's
        Gelu (exact, with erf) or swish x * sigmoid(x), which is QuickGelu with alpha 1."""
        if kind == "relu":
            return self.node("Relu", [x], [f"{name}.relu"], f"{name}.relu")
        if kind == "gelu":
            return self.node("Gelu", [x], [f"{name}.gelu"], f"{name}.gelu", MS)
        if kind == "swish":
            return self.node("QuickGelu", [x], [f"{name}.swish"], f"{name}.swish", MS, alpha=1.0)
        raise ValueError(f"no fused graph for the activation {kind!r}; the fused graphs have relu, gelu and swish")

    def feed_forward(self, name: str, h: str, ffn: FeedForward, activation: str) -> str:
        """A layer's feed-forward sublayer W2(act(W1(h))) on its input h."""
        f = self.activation(name, self.module_linear(f"{name}.w1", h, ffn.w1), activation)
        return self.module_linear(f"{name}.w2", f, ffn.w2)


class ResidualStream:
    """The residual stream of a stack (the encoder's or the decoder's) at the boundaries between its
    sublayers, each an Add and a LayerNormalization (two nodes, not SkipLayerNormalization: see
    the package's docstring). A boundary joins the previous sublayer's output y to the stream x:

    - pre-norm (x + Sublayer(LN(x))): the next sublayer's input is LN(x + y) with that sublayer's
      norm, and the stream goes on as x + y; the last boundary applies the stack's final norm;
    - post-norm (LN(x + Sublayer(x))): LN(x + y) with the previous sublayer's norm is both the next
      input and the stream; the first boundary (token embedding + position) has no norm, and the
      last is the last sublayer's (a post-norm stack has no final norm).

    Either way, n sublayers have n + 1 boundaries; `join` takes the next one."""

    def __init__(
        self,
        g: GraphBuilder,
        pre_norm: bool,
        sublayers: list[tuple[str, torch.nn.LayerNorm]],
        final: torch.nn.LayerNorm | None,
    ):
        self.g, self.pre_norm = g, pre_norm
        boundaries = [*sublayers, ("final", final)] if pre_norm else [("embed_pos", None), *sublayers]
        self._boundaries = iter(boundaries)

    def join(self, y: str, x: str, out: str | None = None) -> tuple[str, str]:
        """(the next sublayer's input, the residual stream) at the next boundary; `out` names the input."""
        name, norm = next(self._boundaries)
        if norm is None:
            s = self.g.node("Add", [y, x], [out or f"{name}.sum"], f"{name}.add")
            return s, s
        h, s = self.g.add_norm(name, y, x, norm, out)
        return (h, s) if self.pre_norm else (h, h)


def as_array(t: torch.Tensor | torch.nn.Module) -> np.ndarray:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    return t.detach().cpu().float().numpy()


def layers_of(stack: torch.nn.ModuleList, kind: type[_Layer]) -> list[_Layer]:
    """The modules of `stack`, each a `kind`."""
    layers = [m for m in stack if isinstance(m, kind)]
    if len(layers) != len(stack):
        raise TypeError(f"expected a stack of {kind.__name__}")
    return layers


def final_norm(norm: torch.nn.Module) -> torch.nn.LayerNorm | None:
    """A stack's final norm: a pre-norm stack's LayerNorm, or None (post-norm's Identity)."""
    return norm if isinstance(norm, torch.nn.LayerNorm) else None


def _token_table(model: Transformer, embed: torch.nn.Embedding) -> np.ndarray:
    """An embedding table, pre-scaled by √d_model where the model scales its embeddings."""
    table = as_array(embed.weight)
    return table * math.sqrt(model.cfg.d_model) if model.cfg.scale_embedding else table


def quantize_rows(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """table (V, D) -> int8 (V, D) and scales (V, 1): symmetric per row, as CTranslate2 int8 stores
    its embeddings."""
    amax = np.abs(table).max(axis=1, keepdims=True)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(table / scale), -127, 127).astype(np.int8), scale


def token_embedding(g: GraphBuilder, model: Transformer, embed: torch.nn.Embedding, ids: str) -> str:
    """The rows of `ids` in the token table (pre-scaled by √d_model where the model scales) as
    "x_tok", shaped ids' shape + (D,). The fp32 graphs gather fp32 rows; the quantised ones store
    the table as int8 rows with a scale each ("embed.q" (V, D), "embed.s" (V, 1): a quarter of the
    memory of a graph's largest tensor) and gather both, then Cast and Mul."""
    table = _token_table(model, embed)
    if g.linear_kind == "fp32":
        return g.node("Gather", [g.init("embed", table), ids], ["x_tok"], "embed")
    q, scale = quantize_rows(table)
    rows = g.node("Gather", [g.init("embed.q", q), ids], ["x_tok.q"], "embed")
    scales = g.node("Gather", [g.init("embed.s", scale), ids], ["x_tok.s"], "embed.s")
    rows = g.node("Cast", [rows], ["x_tok.f"], "embed.cast", to=TensorProto.FLOAT)
    return g.node("Mul", [rows, scales], ["x_tok"], "embed.dequant")


def save_graph(
    g: GraphBuilder,
    name: str,
    io: tuple[list[TensorSpec], list[TensorSpec]],
    path: str | Path,
    value_info: Sequence[onnx.ValueInfoProto] = (),
) -> onnx.ModelProto:
    """The graph of `g`'s nodes with the contract's inputs and outputs, saved (`onnx_files.save`) and
    checked from its file. A graph saved with external data is returned without its weights."""
    graph = helper.make_graph(g.nodes, name, [_value_info(t) for t in io[0]], [_value_info(t) for t in io[1]], g.inits)
    graph.value_info.extend(value_info)
    model_proto = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)], producer_name="mtserve.export"
    )
    model_proto.ir_version = 9
    onnx_files.save(model_proto, Path(path))  # its weights as external data where they reach the limit
    onnx_files.check(Path(path))
    return model_proto


def _value_info(t: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, DTYPES[t.dtype], t.shape)
