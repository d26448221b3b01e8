"""The sessions a server's decode workers run on, loaded from the settings."""

from __future__ import annotations

from contract.manifest import ManifestError
from service.errors import ModelLoadError
from service.runtime.onnx_model import OnnxSeq2Seq
from service.settings import Settings


def load_models(settings: Settings) -> list[OnnxSeq2Seq]:
    graphs = settings.graphs_dir
    if not (graphs / "manifest.json").is_file():
        raise ModelLoadError(
            f"no exported model at {graphs} (manifest.json missing): run `mtserve export --model {settings.model_dir}`"
        )

    def load(first: bool) -> OnnxSeq2Seq:
        return OnnxSeq2Seq(
            graphs,
            precision=settings.precision,
            graph=settings.graph,
            shortlist=settings.shortlist,
            provider=settings.provider,
            intra_op_threads=settings.intra_op_threads,
            inter_op_threads=settings.inter_op_threads,
            strict=settings.strict_provider,
            verify_checksums=first,
        )

    try:
        first = load(True)
        if first.provider == "cpu" and settings.share_sessions:
            # One session pair for all workers: ONNX Runtime runs concurrent calls on it, each on its
            # caller's thread (with 1 intra-op thread), and the weights sit in memory once.
            return [first] * settings.decode_workers
        return [first] + [load(False) for _ in range(settings.decode_workers - 1)]
    except (ManifestError, FileNotFoundError, ValueError, RuntimeError) as e:
        raise ModelLoadError(str(e)) from e
    except Exception as e:  # onnxruntime raises its own types for corrupt graphs
        raise ModelLoadError(f"{type(e).__name__}: {e}") from e
