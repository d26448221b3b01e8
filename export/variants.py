"""The variants of an export: each precision's graphs derived from one torch export of the raw
fp32 graphs (`export.graphs`, `export.precision`), and for the CPU precisions the fused encoder and
decoder steps (`export.fused`), each checked against its contract and PyTorch (`export.checks`),
moved into the export dir and described as a `contract.manifest.Variant`.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import cast

from contract.graphs import decoder_io, encoder_io, fused_decoder_io
from contract.manifest import GraphSpec, Precision, TensorSpec, Variant, sha256_file, variant_key
from export import onnx_files
from export.checks import (
    FP32_TOLERANCE,
    LOG_PROB_FLOOR,
    check_graph,
    encoder_parity_check,
    fused_parity_check,
    parity_check,
)
from export.fused.decoder import build_fused_decoder
from export.fused.encoder import build_fused_encoder
from export.graphs import OPSET, export_raw
from export.model import Transformer
from export.precision import VARIANT_RECIPES, build_variant, variant_level

log = logging.getLogger("mtserve.export")

# The precisions that get a fused decoder step too, and how its linear layers multiply. fp16 is
# for CUDA, where the portable graph serves.
FUSED = {"fp32": "fp32", "int8": "int8"}
# ... and those that get a second fused step for batches of one row (MatMulNBits, 8 bits).
FUSED_ONE_ROW = {"int8": "nbits8"}


def _check_variant(model: Transformer, precision: str, enc: Path, dec: Path) -> dict[str, float]:
    """The contract checks and the parity figures of one precision's graphs; RuntimeError when the
    fp32 graphs differ from PyTorch beyond FP32_TOLERANCE (log-probs: above LOG_PROB_FLOOR)."""
    cfg = model.cfg
    check_graph(enc, *encoder_io(cfg))
    check_graph(dec, *decoder_io(cfg))
    checks = parity_check(model, enc, dec)
    if precision == "fp32" and checks["log_probs"] > FP32_TOLERANCE:
        raise RuntimeError(
            f"fp32 export differs from PyTorch: max |Δ log_probs| = {checks['log_probs']:.2e} "
            f"(log-probs clipped at {LOG_PROB_FLOOR:g}, tolerance {FP32_TOLERANCE:.0e})"
        )
    return checks


def _place(path: Path, out: Path, io: tuple[list[TensorSpec], list[TensorSpec]]) -> GraphSpec:
    """Move a built (and checked) graph, with its external data files, from the scratch dir into
    `out`, and describe it."""
    onnx_files.move(path, out)
    return GraphSpec(file=path.name, sha256=sha256_file(out / path.name), inputs=io[0], outputs=io[1])


def _export_variant(
    model: Transformer, precision: str, raw_enc: Path, raw_dec: Path, work: Path, out: Path, exporter: str, check: bool
) -> Variant:
    """Build `precision`'s graphs from the raw ones in `work`, check them, move them into `out` and
    describe them."""
    cfg = model.cfg
    target, _, notes = VARIANT_RECIPES[precision]
    level = variant_level(precision)[1]
    enc, dec = build_variant(precision, raw_enc, raw_dec, work)
    checks = _check_variant(model, precision, enc, dec) if check else {}
    return Variant(
        precision=cast(Precision, precision),
        opset=OPSET,
        exporter=f"torch.onnx.export(dynamo={exporter == 'dynamo'})",
        optimization=f"ORT_ENABLE_{level.upper()}" if level else "none (ORT optimises at load)",
        target=target,
        notes=notes,
        parity={k: float(f"{v:.3g}") for k, v in checks.items()},
        encoder=_place(enc, out, encoder_io(cfg)),
        decoder=_place(dec, out, decoder_io(cfg)),
    )


def _export_fused_variant(model: Transformer, portable: Variant, work: Path, out: Path, check: bool) -> Variant:
    """The fused graphs of `portable`'s precision beside its graphs: the encoder, and the decoder
    step for every batch, for batches of one row where it has one, and each again unscored (greedy
    search when no sentence asks for its score)."""
    cfg, precision = model.cfg, portable.precision
    checks: dict[str, float] = {}

    def build(suffix: str, linear_kind: str) -> tuple[GraphSpec, GraphSpec]:
        """The step and its unscored twin, checked against PyTorch and each other. The one-row step
        ranks in one pass: for a single row the two-pass ranking costs as much in more nodes."""
        scored, unscored = (
            work / f"decoder.fused.{precision}{suffix}.onnx",
            work / f"decoder.fused.{precision}{suffix}.unscored.onnx",
        )
        build_fused_decoder(model, scored, linear_kind, blocks=not suffix)
        build_fused_decoder(model, unscored, linear_kind, scored=False, blocks=not suffix)
        if check:
            check_graph(scored, *fused_decoder_io(cfg))
            check_graph(unscored, *fused_decoder_io(cfg, scored=False))
            prefix = "one_row_" if suffix else ""
            checks.update(
                {f"{prefix}{k}": v for k, v in fused_parity_check(model, scored, unscored_path=unscored).items()}
            )
        return _place(scored, out, fused_decoder_io(cfg)), _place(unscored, out, fused_decoder_io(cfg, scored=False))

    decoder, decoder_unscored = build("", FUSED[precision])
    if check and precision == "fp32" and checks["log_probs"] > FP32_TOLERANCE:
        raise RuntimeError(
            f"fused fp32 step differs from PyTorch: max |Δ log_probs| = {checks['log_probs']:.2e} "
            f"(log-probs clipped at {LOG_PROB_FLOOR:g}, tolerance {FP32_TOLERANCE:.0e})"
        )
    encoder = work / f"encoder.fused.{precision}.onnx"
    build_fused_encoder(model, encoder, FUSED[precision])
    if check:
        check_graph(encoder, *encoder_io(cfg))
        enc_checks = encoder_parity_check(model, encoder, out / portable.encoder.file)
        if precision == "fp32" and max(enc_checks["encoder_memory"], enc_checks["cross_kv"]) > FP32_TOLERANCE:
            raise RuntimeError(f"fused fp32 encoder differs from PyTorch: {enc_checks}")
        checks.update(enc_checks)
    encoder_spec = _place(encoder, out, encoder_io(cfg))
    one_row, one_row_unscored = (
        build(".one-row", FUSED_ONE_ROW[precision]) if precision in FUSED_ONE_ROW else (None, None)
    )
    return portable.model_copy(
        update={
            "graph": "fused",
            "exporter": "export.fused.build_fused_encoder and build_fused_decoder (onnx.helper, com.microsoft "
            "contrib operators)",
            "optimization": "none baked in (written fused; ORT's own passes find nothing more to fuse)",
            "target": "cpu",
            "notes": f"{portable.notes}; encoder and decoder step fused: MultiHeadAttention for the encoder and "
            "the cross-attention, DecoderMaskedMultiHeadAttention over an in-place cache with cache_indirection",
            "parity": {k: float(f"{v:.3g}") for k, v in checks.items()},
            "encoder": encoder_spec,
            "decoder": decoder,
            "decoder_unscored": decoder_unscored,
            "decoder_one_row": one_row,
            "decoder_one_row_unscored": one_row_unscored,
        }
    )


def export_variants(
    model: Transformer, out: Path, precisions: list[str], exporter: str, check: bool
) -> dict[str, Variant]:
    """One torch export of the raw fp32 graphs, in a scratch dir inside `out` (so that the final
    moves stay on one file system), and every precision derived from it."""
    cfg = model.cfg
    variants: dict[str, Variant] = {}
    with tempfile.TemporaryDirectory(prefix=".export-", dir=out) as tmp:
        work = Path(tmp)
        raw_enc, raw_dec = export_raw(model, work, exporter)
        if check:
            check_graph(raw_enc, *encoder_io(cfg))
            check_graph(raw_dec, *decoder_io(cfg))
        for precision in precisions:
            portable = _export_variant(model, precision, raw_enc, raw_dec, work, out, exporter, check)
            variants[precision] = portable
            if precision in FUSED:
                variants[variant_key(precision, "fused")] = _export_fused_variant(model, portable, work, out, check)
            log.info("exported %s into %s", precision, out)
    return variants
