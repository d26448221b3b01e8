"""The serving package imports without torch (import-linter checks the imports it names; this runs them)."""

from __future__ import annotations

import subprocess
import sys


def test_serving_modules_do_not_import_torch():
    """Every module of the serving package, present and future, imports without torch."""
    code = (
        "import importlib, pkgutil, sys, service\n"
        "for m in pkgutil.walk_packages(service.__path__, 'service.'):\n"
        "    importlib.import_module(m.name)\n"
        "    assert 'torch' not in sys.modules, f'{m.name} imported torch'\n"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
