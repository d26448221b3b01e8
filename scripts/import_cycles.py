"""Fail when the project's modules import each other in a circle.

Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING:``. The
module graph has an edge from each module to each project module it names (``from a.b import c``
names ``a.b.c`` where that is a module, else ``a.b``); a circle is a strongly connected component
of more than one module, or a module importing itself. Prints each circle and exits 1 if any.

    python scripts/import_cycles.py [package ...]   # default: the packages below
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("contract", "export", "mtserve", "service", "benchmarks", "tests")
SKIP = ("service/api/",)  # generated gRPC code


def project_modules(packages: tuple[str, ...], root: Path = ROOT) -> dict[str, Path]:
    """Module name -> file, for every .py file under the packages (folders under `root`)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if any(relative.startswith(skip) for skip in SKIP) or any(p.startswith(".") for p in relative.split("/")):
                continue  # generated code, or a hidden folder's (benchmarks/.cache/.venv-hf: another venv's packages)
            parts = relative[: -len(".py")].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def longest_module(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of a dotted name that is a project module (``a.b.f`` -> ``a.b``)."""
    parts = name.split(".")
    for length in range(len(parts), 0, -1):
        candidate = ".".join(parts[:length])
        if candidate in modules:
            return candidate
    return None


def imported_names(module: str, path: Path) -> Iterator[str]:
    """Every dotted name the module imports, relative imports resolved: ``import a.b`` yields
    ``a.b``, ``from a import b`` yields ``a.b`` (a module, or a name defined in ``a``)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            prefix = node.module or ""
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            yield from (f"{prefix}.{alias.name}" for alias in node.names)


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        targets = (longest_module(name, modules) for name in imported_names(module, path))
        graph[module] = {target for target in targets if target is not None}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a self-import (Tarjan's
    algorithm; recursion as deep as the longest import chain)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return sorted(found)


def main(argv: list[str]) -> int:
    graph = import_graph(project_modules(tuple(argv) or PACKAGES))
    found = circles(graph)
    for component in found:
        members = set(component)
        print(f"import circle among {len(component)} modules:")
        for module in component:
            print(f"  {module} -> {', '.join(sorted(graph[module] & members))}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
