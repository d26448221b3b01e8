"""The precision variants of the raw fp32 graphs (file names carry the precision, so they live side by
side; `manifest.json` lists them):
- fp32: the reference; ORT graph optimisations (ORT_ENABLE_EXTENDED, CPU EP) applied at export time
        and the optimised graph is what ships;
- int8: dynamic quantisation of the MatMul weights (onnxruntime.quantization.quantize_dynamic,
        signed int8 weights, uint8 activations quantised at run time), then ORT_ENABLE_EXTENDED;
        for the CPU;
- fp16: weights and activations in fp16 for CUDA, softmax and log-softmax kept in fp32 as in the
        PyTorch model, graph inputs/outputs stay fp32 so the serving code is the same for every
        precision. ORT_ENABLE_EXTENDED is baked in on a CUDA session where the exporting machine
        has one, else no ORT optimisation at all (ORT optimises at load): the extended level on a
        CPU session would bake CPU-specific fallbacks into a graph meant for CUDA.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx
import onnxruntime as ort
from onnxruntime.quantization import QuantType, quantize_dynamic
from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

from export import onnx_files


def ort_optimize(src: Path, dst: Path, level: str, provider: str = "cpu") -> None:
    """Apply ORT's graph optimisations at `level` on a session of `provider` and save the result,
    its large tensors as external data where `src` is large (`onnx_files.is_large`)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    }[level]
    so.optimized_model_filepath = str(dst)
    if onnx_files.is_large(src):
        onnx_files.ort_external_data(so, dst)
    so.log_severity_level = 3
    providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    ort.InferenceSession(str(src), so, providers=providers)


def cuda_available() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def quantize_int8(src: Path, dst: Path) -> None:
    """Dynamic int8 quantisation of the MatMul weights of `src` into `dst`, with external data in
    `onnx_files.data_location(dst)` when `src` is large (`onnx_files.is_large`)."""
    external = onnx_files.is_large(src)
    if external:
        (dst.parent / onnx_files.data_location(dst)).unlink(missing_ok=True)
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
            use_external_data_format=external,
        )
    finally:
        root.setLevel(level)


def convert_fp16(src: Path, dst: Path) -> None:
    model = onnx.load(str(src))  # with its external data: the converter reads the weights
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the value is out of fp16 range, clamped" on -inf-free graphs
        model = convert_float_to_float16(
            model, keep_io_types=True, op_block_list=DEFAULT_OP_BLOCK_LIST + ["Softmax", "LogSoftmax"]
        )
    _toposort(model.graph)
    for node in model.graph.node:  # the exporter's per-node stack traces: not needed in what ships
        del node.metadata_props[:]
        node.doc_string = ""
    onnx_files.save(model, dst)


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
            onnx_files.save(onnx.load(str(src)), final)  # with its data, into final's own file
        else:
            ort_optimize(src, final, level, provider)
        out.append(final)
    return out[0], out[1]
