"""House rules of the layout (docs/architecture.md, "What may import what"), checked on
the source: no import cycle among engine modules (function-level and type-only imports
included), engine/ never imports streamlit, only engine/cli (and `python -m engine`) import
the CLI, pages import no torch, analysis and hardware import no torch at module level and
never write the store, and every function-level engine import says why it is one."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from import_graph import (
    REPO_ROOT,
    WING_ORDER,
    back_imports,
    engine_modules,
    find_cycle,
    import_graph,
    imports_of,
)

ENGINE_FILES = sorted((REPO_ROOT / "engine").rglob("*.py"))
PAGE_FILES = sorted((REPO_ROOT / "pages").glob("*.py"))
MODULES = engine_modules()
# Store methods that change the database (engine.store.Store): analysis/hardware call none.
STORE_WRITES = frozenset({
    "create_run", "update_run", "set_status", "merge_summary", "claim_device", "write_metrics",
    "write_overview", "write_telemetry", "write_kernels", "create_sweep", "link_sweep_run",
    "set_sweep_status", "set_sweep_driver", "request_run_stop", "set_run_placement",
})


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


def _module_level_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of the imports that run when the module is imported: top level and
    inside top-level try/if blocks, not inside functions or `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    pending = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            pending += [
                child for child in ast.iter_child_nodes(node) if isinstance(child, ast.stmt)
            ]
            for handler in getattr(node, "handlers", []):
                pending += handler.body
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _in_package(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


# ---------------------------------------------------------------------------------------
# the scan itself


def test_the_scan_sees_the_engine():
    assert {"engine.cli.main", "engine.store", "engine.run.worker", "engine.run.launcher",
            "engine.run.session", "engine.training.loop", "engine.schema"} <= set(MODULES)


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


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path):
    (tmp_path / "engine" / "a").mkdir(parents=True)
    (tmp_path / "engine" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a" / "__init__.py").write_text("")
    (tmp_path / "engine" / "a" / "one.py").write_text("from engine.a import two\n")
    (tmp_path / "engine" / "a" / "two.py").write_text(
        "def f():\n    from engine.a.one import x  # why\n")
    (tmp_path / "engine" / "three.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.a import one\n")
    graph = import_graph(tmp_path)
    assert graph["engine.three"] == set()  # type-checking imports never run
    assert find_cycle(graph) == ["engine.a.one", "engine.a.two", "engine.a.one"]
    assert import_graph(tmp_path, type_only=True)["engine.three"] == {"engine.a.one"}


def test_the_cycle_finder_finds_a_cycle_through_a_type_only_import(tmp_path):
    root = _plant_engine(tmp_path, {
        "engine/loop.py": "from engine import meter\n",
        "engine/meter.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                           "    from engine.loop import Trainer\n",
    })
    assert find_cycle(import_graph(root)) is None
    assert find_cycle(import_graph(root, type_only=True)) == [
        "engine.loop", "engine.meter", "engine.loop"]


def _plant_engine(root: Path, files: dict[str, str]) -> Path:
    for relative, text in {"engine/__init__.py": "", **files}.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_wing_check_names_a_planted_back_import(tmp_path):
    """hardware below analysis: a function-level import of analysis from hardware is named
    with its line, its function and the two wings; the downward one passes."""
    root = _plant_engine(tmp_path, {
        "engine/hardware/__init__.py": "",
        "engine/hardware/gauge.py": "def read():\n    from engine.analysis import rules  # why\n",
        "engine/analysis/__init__.py": "",
        "engine/analysis/rules.py": "from engine.hardware import gauge\n",
    })
    assert back_imports(root) == [
        "engine.hardware.gauge:2 (in read()) imports engine.analysis.rules (hardware -> analysis)"]


def test_the_wing_check_refuses_a_wing_the_order_does_not_name(tmp_path):
    root = _plant_engine(tmp_path, {"engine/extras/__init__.py": "",
                                    "engine/extras/tool.py": "from engine import config\n",
                                    "engine/config.py": ""})
    assert back_imports(root) == ["engine.extras.tool:1: wing 'extras' is not in WING_ORDER"]


# ---------------------------------------------------------------------------------------
# the rules


def test_every_import_runs_down_the_wing_order():
    assert back_imports() == [], "move the code to the wing below its users, or the import up"


def test_the_documented_wing_order_is_the_enforced_one():
    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    documented = text.split("Wing order (lowest first): ", 1)[1].split("\n", 1)[0]
    assert [w.strip(" `.") for w in documented.split("<")] == list(WING_ORDER)


def test_no_import_cycle_among_engine_modules():
    """Type-only imports included: a cycle that only the type checker follows is still
    two modules that cannot be understood (or moved) one without the other."""
    cycle = find_cycle(import_graph(type_only=True))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("path", ENGINE_FILES, ids=[p.name for p in ENGINE_FILES])
def test_engine_module_does_not_import_streamlit(path):
    assert streamlit_imports(path) == []


def test_only_the_cli_imports_the_cli():
    offenders = []
    for path in [*ENGINE_FILES, *PAGE_FILES, REPO_ROOT / "app.py",
                 *sorted((REPO_ROOT / "scripts").glob("*.py")),
                 *sorted((REPO_ROOT / "bench").glob("*.py"))]:
        source = "engine.__main__" if path.name == "__main__.py" else None
        for line, module in _module_level_imports(path) + _function_imports(path):
            if _in_package(module, "engine.cli") and not _in_package(
                    _module_of(path), "engine.cli") and source != "engine.__main__":
                offenders.append(f"{path.relative_to(REPO_ROOT)}:{line}: {module}")
    assert offenders == []


def _module_of(path: Path) -> str:
    try:
        return ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
    except ValueError:
        return ""


def _function_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for func in ast.walk(tree):
        if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(func):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, alias.name) for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.append((node.lineno, node.module))
    return found


@pytest.mark.parametrize("package", ["engine.traces", "engine.analysis", "engine.hardware"])
def test_analysis_and_hardware_import_no_torch_at_module_level(package):
    offenders = [f"{name}:{line}: {module}"
                 for name, path in MODULES.items() if _in_package(name, package)
                 for line, module in _module_level_imports(path)
                 if _in_package(module, "torch")]
    assert offenders == []


@pytest.mark.parametrize("package", ["engine.traces", "engine.analysis", "engine.hardware"])
def test_analysis_and_hardware_never_write_the_store(package):
    offenders = []
    for name, path in MODULES.items():
        if not _in_package(name, package):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr in STORE_WRITES:
                offenders.append(f"{name}:{node.lineno}: .{node.func.attr}()")
    assert offenders == []


def test_every_function_level_engine_import_says_why():
    silent = [f"{imp.source}:{imp.line} ({imp.function}) imports {imp.target}"
              for name, path in MODULES.items() for imp in imports_of(path, MODULES)
              if imp.function and not imp.comment]
    assert silent == [], "add a one-line comment saying why the import is in a function"


# Runs in a fresh interpreter: every page of the navigation through AppTest (a real script
# run with a session, on an empty store), failing on a page's exception, then reports which
# page first had torch in sys.modules. Helper modules (charts, ui, speedup_view, ...) are
# imported by the pages and so covered.
_PAGES_WITHOUT_TORCH = """
import json, sys
from streamlit.testing.v1 import AppTest
from pages.shell import PAGES
at = AppTest.from_file("app.py", default_timeout=90)
at.run()
report = []
for index, (path, _title, _icon) in enumerate(PAGES):
    if index:
        at.switch_page(path).run()
    report.append({"page": path, "exception": [str(e.message) for e in at.exception],
                   "torch": "torch" in sys.modules})
print(json.dumps(report))
"""


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_pages_run_without_error_and_import_no_torch(tmp_path):
    env = {"PRECISION_LAB_HOME": str(tmp_path), "PRECISION_LAB_STANDBY": "0",
           "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", _PAGES_WITHOUT_TORCH], cwd=str(REPO_ROOT),
                            env=env, capture_output=True, text=True, timeout=220)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert [row["page"] for row in report] == [path for path, _, _ in _navigation_pages()]
    assert [(row["page"], row["exception"]) for row in report if row["exception"]] == []
    assert [row["page"] for row in report if row["torch"]] == []


def _navigation_pages() -> list[tuple[str, str, str]]:
    from pages.shell import PAGES  # imports streamlit: only this test needs the page list

    return PAGES


@pytest.mark.slow
def test_the_page_check_fails_when_a_page_raises_or_imports_torch(tmp_path):
    """The check above, on a planted app: one page that raises, one that imports torch."""
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "__init__.py").write_text("")
    (tmp_path / "pages" / "shell.py").write_text(
        "import streamlit as st\n"
        "PAGES = [('pages/ok.py', 'Ok', None), ('pages/bad.py', 'Bad', None), "
        "('pages/heavy.py', 'Heavy', None)]\n")
    (tmp_path / "app.py").write_text(
        "import streamlit as st\nfrom pages.shell import PAGES\n"
        "st.navigation([st.Page(p, title=t) for p, t, _ in PAGES]).run()\n")
    (tmp_path / "pages" / "ok.py").write_text("import streamlit as st\nst.write('fine')\n")
    (tmp_path / "pages" / "bad.py").write_text("raise ValueError('the page broke')\n")
    (tmp_path / "pages" / "heavy.py").write_text("import torch\n")
    result = subprocess.run([sys.executable, "-c", _PAGES_WITHOUT_TORCH], cwd=str(tmp_path),
                            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=220)
    report = {row["page"]: row for row in json.loads(result.stdout.strip().splitlines()[-1])}
    assert report["pages/ok.py"]["exception"] == [] and not report["pages/ok.py"]["torch"]
    assert "the page broke" in report["pages/bad.py"]["exception"][0]
    assert report["pages/heavy.py"]["torch"]


def _summary_keys_written(path: Path) -> list[tuple[int, str]]:
    """Literal keys this file writes into a run summary: dict literals passed to
    merge_summary, and `summary["key"] = ...` / `summary["a"], summary["b"] = ...`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "merge_summary" and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Dict):
            found += [(node.lineno, key.value) for key in node.args[1].keys
                      if isinstance(key, ast.Constant)]
        elif isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            found += [(node.lineno, t.slice.value) for t in targets
                      if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                      and t.value.id == "summary" and isinstance(t.slice, ast.Constant)]
    return found


def test_every_summary_key_written_is_declared_in_run_summary():
    from engine.schema import SUMMARY_KEYS

    written = [(path, line, key) for path in [*ENGINE_FILES, *PAGE_FILES]
               for line, key in _summary_keys_written(path)]
    assert {"peak_flops", "oom_batch_size", "parallel", "cpu_evidence"} <= {
        k for _, _, k in written
    }
    undeclared = [f"{path.relative_to(REPO_ROOT)}:{line}: {key!r}" for path, line, key in written
                  if key not in SUMMARY_KEYS]
    assert undeclared == [], "declare these keys in engine.schema.RunSummary"


def test_train_result_fields_are_declared_in_run_summary():
    import dataclasses

    from engine.schema import SUMMARY_KEYS
    from engine.training.loop import TrainResult  # the summary's bulk: result.to_dict()

    assert {f.name for f in dataclasses.fields(TrainResult)} <= SUMMARY_KEYS


_PROBE = r"""
import sys
import engine.cli
engine.cli.build_parser()           # loads every sub-command module
import engine.run.launcher, engine.run.worker, engine.store, engine.config
print("streamlit" in sys.modules, any(m.startswith("streamlit.") for m in sys.modules),
      "torch" in sys.modules)
"""


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_headless_entry_points_import_neither_streamlit_nor_torch():
    result = subprocess.run([sys.executable, "-c", _PROBE], cwd=str(REPO_ROOT),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    streamlit_loaded, streamlit_submodule_loaded, torch_loaded = result.stdout.split()
    assert streamlit_loaded == "False" and streamlit_submodule_loaded == "False"
    # The worker's supervisor (engine.run.worker without --train) waits in the queue without
    # torch, so queued runs cost almost nothing (engine/run/worker.py docstring).
    assert torch_loaded == "False"


# Sizes an engineer can hold in their head: a module that grows past this is two modules,
# a function past this is a loop plus its bookkeeping (bench/ scripts are exempt).
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80
SIZED_FILES = [
    p
    for p in sorted(REPO_ROOT.rglob("*.py"))
    if p.relative_to(REPO_ROOT).parts[0] in ("engine", "pages", "tests", "scripts", "app.py")
]


def _too_big(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(REPO_ROOT)
    found = []
    if len(text.splitlines()) > MAX_MODULE_LINES:
        found.append(f"{where}: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{where}:{node.lineno}: {node.name}() is {lines} lines")
    return found


def test_no_module_over_800_lines_and_no_function_over_80():
    assert len(SIZED_FILES) > 100  # the scan sees the project
    assert [problem for path in SIZED_FILES for problem in _too_big(path)] == []


def test_the_size_check_names_a_long_function(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO_ROOT", tmp_path)
    long_one = tmp_path / "long.py"
    long_one.write_text("def long():\n" + "    x = 1\n" * 80)
    assert _too_big(long_one) == ["long.py:1: long() is 81 lines"]


# ---------------------------------------------------------------------------------------
# the fast tier (tests/conftest.py: every test not marked slow or browser)


def _marked(decorators: list[ast.expr], names: tuple[str, ...]) -> bool:
    return any(ast.unparse(d).split("(")[0].endswith(tuple(f"mark.{n}" for n in names))
               for d in decorators)


def _fast_test_imports(path: Path) -> set[str]:
    """Engine modules a test file's fast tests import: its module-level imports when it has
    any fast test, plus the imports inside its fast test functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    file_marks = [node.value for node in tree.body if isinstance(node, ast.Assign)
                  and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)]
    if any("slow" in ast.unparse(m) or "browser" in ast.unparse(m) for m in file_marks):
        return set()
    fast = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and not _marked(node.decorator_list, ("slow", "browser"))
    ]
    if not fast:
        return set()
    found = {module for _, module in _module_level_imports(path)}
    for func in fast:
        for node in ast.walk(func):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
    return {module for module in found if module in MODULES}


def _module_level_graph() -> dict[str, set[str]]:
    return {name: {imp.target for imp in imports_of(path, MODULES) if not imp.function}
            for name, path in MODULES.items()}


def test_the_fast_tier_reaches_every_engine_module():
    """Each engine module is imported by a fast test, directly or through the modules it
    imports at module level: `python -m pytest -m fast` exercises every wing."""
    graph = _module_level_graph()
    reached: set[str] = set()
    pending = [m for path in sorted((REPO_ROOT / "tests").glob("test_*.py"))
               for m in _fast_test_imports(path)]
    while pending:
        module = pending.pop()
        if module not in reached:
            reached.add(module)
            pending += graph.get(module, ())
            parent = module.rsplit(".", 1)[0]
            if parent in MODULES:
                pending.append(parent)  # importing a submodule runs its package
    missing = sorted(set(MODULES) - reached - {"engine.__main__"})
    assert missing == [], "no fast test imports these: " + ", ".join(missing)


def test_the_shipped_server_config_watches_no_files():
    import tomllib

    config = tomllib.loads((REPO_ROOT / ".streamlit" / "config.toml").read_text(encoding="utf-8"))
    assert config["server"]["fileWatcherType"] == "none"
    assert config["server"]["runOnSave"] is False


# Emoji and symbol blocks: without an emoji font they are empty boxes (status words instead).
_GLYPHS = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF\u2B00-\u2BFF\u23E9-\u23FA]")


def test_pages_draw_no_emoji_glyph():
    found = [f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()[:80]}"
             for path in [*PAGE_FILES, REPO_ROOT / "app.py"]
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if _GLYPHS.search(line)]
    assert found == []
