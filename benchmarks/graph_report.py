"""What ONNX Runtime makes of each CPU graph of an export (encoders and decoder steps): nodes by
operator as shipped and after ORT's own graph optimisations on a CPU session (ORT_ENABLE_ALL),
whose optimised model is saved beside the report, so that the fusions that fired can be read off
the difference.

    python -m benchmarks.graph_report --onnx-dir models/de-en/1/onnx --out /tmp/graph-report

Prints one JSON line: for every variant's graphs, the node count and the operators before and
after, and which operators appeared or disappeared (the fusions).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import onnx
import onnxruntime as ort

from contract.manifest import load_manifest


def op_counts(path: Path) -> Counter:
    return Counter(n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node)


def optimised(path: Path, out: Path) -> Path:
    """ORT's optimised model of `path` (ORT_ENABLE_ALL, CPU), written to `out`."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.optimized_model_filepath = str(out)
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return out


def report(onnx_dir: Path, out_dir: Path) -> dict:
    manifest = load_manifest(onnx_dir, verify_checksums=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    graphs = {}
    for key, v in manifest.variants.items():
        if v.target != "cpu":
            continue
        for part, spec in {"encoder": v.encoder, **v.decoder_steps()}.items():
            src = onnx_dir / spec.file
            before = op_counts(src)
            after = op_counts(optimised(src, out_dir / f"{Path(spec.file).stem}.ort.onnx"))
            graphs[f"{key}/{part}"] = {
                "file": spec.file,
                "nodes": sum(before.values()),
                "nodes_after_ort": sum(after.values()),
                "ops": dict(before.most_common()),
                "ops_after_ort": dict(after.most_common()),
                "fused_away": dict((before - after).most_common()),
                "fused_into": dict((after - before).most_common()),
            }
    return {"onnx_dir": str(onnx_dir), "optimized_models": str(out_dir), "graphs": graphs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--onnx-dir", type=Path, default=Path("models/de-en/1/onnx"))
    p.add_argument("--out", type=Path, default=Path("/tmp/mtserve-graph-report"), help="where the optimised models go")
    args = p.parse_args(argv)
    print(json.dumps(report(args.onnx_dir, args.out)))


if __name__ == "__main__":
    main()
