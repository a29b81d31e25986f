"""The engine's import graph, read from the source (no module is imported): every
`import` and `from ... import` of an engine module, at module level or inside a function,
resolved to the module it loads. `from engine.run import standby` is an edge to
engine.run.standby. Imports under `if TYPE_CHECKING:` never run: they are left out unless
asked for (`type_only=True`), as the cycle check does: two modules that name each other's
types are one module split in two, whether or not the import runs."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Import:
    source: str       # importing module, e.g. "engine.run.worker"
    target: str       # imported module, e.g. "engine.store"
    line: int
    function: str | None  # enclosing function, None at module level
    comment: str      # the comment on the import's line or the line above it


def module_name(path: Path, root: Path = REPO_ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def engine_modules(root: Path = REPO_ROOT) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / "engine").rglob("*.py"))}


def _resolve_relative(source: str, is_package: bool, level: int, module: str | None) -> str:
    base = source.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else []))


def _type_checking_nodes(tree: ast.AST) -> set[ast.AST]:
    skipped: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                skipped.update(ast.walk(child))
    return skipped


def imports_of(path: Path, modules: dict[str, Path], root: Path = REPO_ROOT,
               type_only: bool = False) -> list[Import]:
    """The engine modules `path` imports (any nesting), each with its line and comment;
    `type_only`: those under `if TYPE_CHECKING:` too."""
    source = module_name(path, root)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text, filename=str(path))
    skipped = set() if type_only else _type_checking_nodes(tree)
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    found = []
    for node in ast.walk(tree):
        if node in skipped or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = (_resolve_relative(source, path.name == "__init__.py", node.level, node.module)
                    if node.level else node.module or "")
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                targets.append(submodule if submodule in modules else base)
        function = _enclosing_function(node, parents)
        comment = _comment_near(lines, node.lineno, node.end_lineno or node.lineno)
        for target in dict.fromkeys(targets):
            if target in modules and target != source:
                found.append(Import(source, target, node.lineno, function, comment))
    return found


def _enclosing_function(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> str | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node.name
    return None


def _comment_near(lines: list[str], lineno: int, end_lineno: int) -> str:
    """The `# ...` on one of the import's own lines, else on the line right above it."""
    for own in lines[lineno - 1:end_lineno]:
        if "#" in own:
            return own[own.index("#") + 1:].strip()
    above = lines[lineno - 2].strip() if lineno >= 2 else ""
    return above[1:].strip() if above.startswith("#") else ""


def import_graph(root: Path = REPO_ROOT, type_only: bool = False) -> dict[str, set[str]]:
    modules = engine_modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imp in imports_of(path, modules, root, type_only):
            graph[name].add(imp.target)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None. Iterative DFS, deterministic order."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = 2
                continue
            if state.get(child) == 1:
                return path[path.index(child):] + [child]
            if not state.get(child):
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.get(child, ())))))
    return None


# The engine's wings, lowest first (docs/architecture.md, "Wings"). A module may import
# its own wing and the wings below it, never one above: the order the test enforces.
WING_ORDER = ("base", "store", "hardware", "traces", "analysis", "report", "admission",
              "training", "diagnostics", "run", "presets", "cluster", "cli", "entry")
# Top-level modules with no wing of their own: the shared names every wing reads.
BASE_MODULES = frozenset({"engine", "engine.config", "engine.schema", "engine.proc",
                          "engine.architectures", "engine.workloads", "engine.support",
                          "engine.display"})


def wing_of(module: str) -> str:
    """engine.run.worker -> "run"; engine.config -> "base"; engine.__main__ -> "entry"."""
    if module in BASE_MODULES:
        return "base"
    if module == "engine.__main__":
        return "entry"
    return module.split(".")[1]


def back_imports(root: Path = REPO_ROOT) -> list[str]:
    """Every import that runs up the wing order (function-level imports included), as
    "engine.hardware.check:28 (module level) imports engine.traces.kernels (hardware -> analysis)".
    A wing not in WING_ORDER is itself an offence: the order must name every wing."""
    modules = engine_modules(root)
    rank = {wing: index for index, wing in enumerate(WING_ORDER)}
    offences = []
    for name, path in modules.items():
        for imp in imports_of(path, modules, root):
            source_wing, target_wing = wing_of(imp.source), wing_of(imp.target)
            unknown = [w for w in (source_wing, target_wing) if w not in rank]
            if unknown:
                offences.append(
                    f"{imp.source}:{imp.line}: wing {unknown[0]!r} is not in WING_ORDER"
                )
            elif rank[target_wing] > rank[source_wing]:
                where = f"in {imp.function}()" if imp.function else "module level"
                offences.append(f"{imp.source}:{imp.line} ({where}) imports {imp.target} "
                                f"({source_wing} -> {target_wing})")
    return offences
