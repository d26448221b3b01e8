"""mtserve's server with CTranslate2 decoding (benchmarks/ct2_backend.py) instead of ONNX Runtime:
the same gRPC front, Engine, limits, health, metrics and drain on SIGTERM as `mtserve serve`.

    python -m benchmarks.ct2_server --model-dir models/de-en/1 --address 127.0.0.1:50052 \\
        [--ct2-dir /tmp/de-en-ct2] [--compute-type int8] [--decode-workers 2 --intra-op-threads 1] \\
        [--ct2-batch-size 32]

Every `mtserve serve` flag is accepted, `--replicas` too. The tokenizer and the manifest come from the ONNX export
(`--onnx-dir`, default MODEL_DIR/onnx), the weights from MODEL_DIR converted by
benchmarks/ct2_convert.py (into `--ct2-dir` when it holds no model yet, else a temporary
directory). Thread layout: `--decode-workers` translator replicas (CTranslate2's `inter_threads`,
one worker thread each) of `--intra-op-threads` threads; the default 2 x 1 is the layout that
`make bench` found best for CTranslate2 int8 on 2 cores. `--ct2-batch-size`: sentences per
`translate_batch` call (default: --max-batch-sentences).
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
import tempfile
from pathlib import Path

from contract.manifest import Manifest
from service.errors import ModelLoadError, StartupError
from service.metrics import ModelMetrics
from service.replicas import serve
from service.repository.loader import BackendFactory
from service.server import Server, add_arguments, settings_from_args
from service.settings import Settings

REPO = Path(__file__).resolve().parent.parent

log = logging.getLogger("mtserve.ct2_server")


def backend_factory(ct2_dir: Path, compute_type: str, batch_size: int = 0) -> BackendFactory:
    """A `service.repository.loader.BackendFactory`: a Ct2Backend over the converted model in `ct2_dir`,
    `settings.decode_workers` replicas of `settings.intra_op_threads` threads. A partial of a
    module-level function, so that it crosses to the server's replica processes (`--replicas`)."""
    return functools.partial(_ct2_backend, ct2_dir, compute_type, batch_size)


def _ct2_backend(
    ct2_dir: Path, compute_type: str, batch_size: int, settings: Settings, metrics: ModelMetrics, manifest: Manifest
):
    from benchmarks.ct2_backend import Ct2Backend
    from benchmarks.ct2_convert import Ct2Translator

    if settings.model_dir is None:
        raise ModelLoadError("the CTranslate2 backend needs the model's directory (--model-dir)")
    ct2 = Ct2Translator(
        ct2_dir,
        settings.model_dir,
        compute_type=compute_type,
        inter_threads=settings.decode_workers,
        intra_threads=settings.intra_op_threads,
    )
    if len(ct2.tokens) != manifest.dims.vocab_size or ct2.eos_id != manifest.special_ids.eos_id:
        raise ModelLoadError(
            f"{settings.model_dir} ({len(ct2.tokens)} tokens, </s> {ct2.eos_id}) is not the model of the export "
            f"at {settings.graphs_dir} ({manifest.dims.vocab_size} tokens, </s> {manifest.special_ids.eos_id})"
        )
    return Ct2Backend(ct2, settings, metrics, max_batch=batch_size or None)


def converted(model_dir: Path, ct2_dir: str | None) -> tuple[Path, tempfile.TemporaryDirectory | None]:
    """The CTranslate2 model of `model_dir`: `ct2_dir` as it is when it holds one, else converted
    (into `ct2_dir`, or a temporary directory returned with it)."""
    from benchmarks.ct2_convert import convert

    if ct2_dir and (Path(ct2_dir) / "model.bin").is_file():
        return Path(ct2_dir), None
    tmp = None if ct2_dir else tempfile.TemporaryDirectory(prefix="mtserve-ct2-")
    out = Path(ct2_dir or tmp.name)  # type: ignore[union-attr]
    log.info("converting %s for CTranslate2 into %s", model_dir, out)
    return convert(model_dir, out), tmp


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(p)
    p.add_argument("--ct2-dir", help="the converted model (converted there when missing; default: a temporary dir)")
    p.add_argument("--compute-type", default="int8", help="CTranslate2 compute type (default int8)")
    p.add_argument("--ct2-batch-size", type=int, default=0, help="sentences per translate_batch call")
    args = p.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as e:
        sys.exit(f"ct2_server: invalid settings: {e}")
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if settings.model_dir is None:
        sys.exit("ct2_server: --model-dir is required (the weights CTranslate2 converts)")
    ct2_dir, tmp = converted(settings.model_dir, args.ct2_dir)
    try:
        factory = backend_factory(ct2_dir, args.compute_type, args.ct2_batch_size)
        serve(settings, functools.partial(Server, backend_factory=factory))
    except StartupError as e:
        log.error("cannot start: %s", e)
        sys.exit(2)
    finally:
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    main()
