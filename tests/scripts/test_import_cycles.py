"""scripts/import_cycles.py: every kind of import counts, and a circle is reported."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "import_cycles.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_function_level_and_type_checking_imports_close_circles(tmp_path: Path) -> None:
    ic = load()
    write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "def f():\n    from pkg import b\n",
            "pkg/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import X\n",
            "pkg/c.py": "from pkg.a import f\nX = 1\n",
            "pkg/d.py": "import pkg.a\nfrom . import c\n",
            "pkg/sub/__init__.py": "from ..d import pkg\n",
        },
    )
    graph = ic.import_graph(ic.project_modules(("pkg",), tmp_path))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.b"] == {"pkg.c"} and graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a", "pkg.c"} and graph["pkg.sub"] == {"pkg.d"}
    assert ic.circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_no_circle(tmp_path: Path) -> None:
    ic = load()
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import os\n"})
    assert ic.circles(ic.import_graph(ic.project_modules(("pkg",), tmp_path))) == []


def test_hidden_folders_are_not_the_projects(tmp_path: Path) -> None:
    """benchmarks/.cache/.venv-hf holds another venv's packages (some in newer Python syntax)."""
    ic = load()
    write(tmp_path, {"pkg/__init__.py": "", "pkg/a.py": "", "pkg/.cache/.venv/x.py": "def f[T](a): ...\n"})
    assert set(ic.project_modules(("pkg",), tmp_path)) == {"pkg", "pkg.a"}
