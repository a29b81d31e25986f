"""House rules that keep the engine usable without the UI: engine/ never imports
streamlit, and the headless entry points do not drag it (or torch, for the queue) in."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ENGINE_FILES = sorted((REPO_ROOT / "engine").rglob("*.py"))


def streamlit_imports(path: Path, root: Path = REPO_ROOT) -> list[str]:
    """Every way this file could import streamlit: import statements (any nesting, also
    inside functions) and importlib/__import__ calls with a literal module name."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            func_name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if func_name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [f"{path.relative_to(root)}:{node.lineno}: {name}" for name in names
                  if name == "streamlit" or name.startswith("streamlit.")]
    return found


def test_the_scan_sees_the_engine():
    names = {p.name for p in ENGINE_FILES}
    assert {"cli.py", "store.py", "worker.py", "launcher.py", "train.py"} <= names


def test_the_scan_would_catch_every_form(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\n"
                      "def f():\n    import streamlit as st\n"
                      "from streamlit.runtime import x\n"
                      "import importlib\nimportlib.import_module('streamlit')\n"
                      "__import__('streamlit.components')\n"
                      "import streamlit_extras_not_it\n")
    hits = [h.split(": ", 1)[1] for h in streamlit_imports(sample, root=tmp_path)]
    assert sorted(hits) == ["streamlit", "streamlit", "streamlit.components", "streamlit.runtime"]


@pytest.mark.parametrize("path", ENGINE_FILES, ids=[p.name for p in ENGINE_FILES])
def test_engine_module_does_not_import_streamlit(path):
    assert streamlit_imports(path) == []


_PROBE = r"""
import sys
import engine.cli
engine.cli.build_parser()           # also loads the optional sub-command modules
import engine.launcher, engine.worker, engine.store, engine.config
print("streamlit" in sys.modules, any(m.startswith("streamlit.") for m in sys.modules),
      "torch" in sys.modules)
"""


@pytest.mark.timeout(60)
def test_headless_entry_points_import_neither_streamlit_nor_torch():
    result = subprocess.run([sys.executable, "-c", _PROBE], cwd=str(REPO_ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    streamlit_loaded, streamlit_submodule_loaded, torch_loaded = result.stdout.split()
    assert streamlit_loaded == "False" and streamlit_submodule_loaded == "False"
    # The worker's supervisor (engine.worker without --train) waits in the queue without
    # torch, so queued runs cost almost nothing (engine/worker.py docstring).
    assert torch_loaded == "False"
