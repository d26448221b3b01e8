"""Generates the gRPC/protobuf Python code from protos/ at build time (wheel, sdist and editable
installs alike), so that generated code is never edited or committed by hand."""

import re
from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
PROTOS = ROOT / "protos"
OUT = ROOT / "service" / "api"


def generate() -> None:
    from grpc_tools import protoc

    OUT.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    for proto in sorted(PROTOS.rglob("*.proto")):
        rel = proto.relative_to(PROTOS)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{PROTOS}",
                f"-I{include}",
                f"--python_out={OUT}",
                f"--pyi_out={OUT}",
                f"--grpc_python_out={OUT}",
                str(rel),
            ]
        )
        if code != 0:
            raise SystemExit(f"protoc failed on {rel}")
    # protoc writes imports relative to the proto root (`from mtserve.v1 import ...`); make them
    # absolute under service.api, and every generated folder a package.
    packages = sorted({p.relative_to(PROTOS).parts[0] for p in PROTOS.rglob("*.proto")})
    pattern = re.compile(rf"^(from|import) ({'|'.join(map(re.escape, packages))})(\.| )", re.M)
    for py in OUT.rglob("*.py*"):
        py.write_text(pattern.sub(r"\1 service.api.\2\3", py.read_text()))
    for d in [OUT, *[p for p in OUT.rglob("*") if p.is_dir() and p.name != "__pycache__"]]:
        (d / "__init__.py").touch()


generate()
setup()
