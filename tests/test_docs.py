"""The docs stay true to the tree: README's layout lists exactly the engine's packages
and modules, every engine path or module docs/architecture.md names exists, every
`python -m ...` entry point it lists can be run as one, and the code's pointers into
docs/precision-reference.md land on a heading that exists."""

from __future__ import annotations

import re

from import_graph import REPO_ROOT, engine_modules

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
ARCHITECTURE = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
REFERENCE = (REPO_ROOT / "docs" / "precision-reference.md").read_text(encoding="utf-8")
MODULES = engine_modules()


def _readme_layout() -> dict[str, set[str]]:
    """{"training": {"loop", ...}, "": {"config", ...}} from README's layout block."""
    block = README[README.index("  engine/\n"):]
    block = block[:block.index("  tests/")]
    listed: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines()[1:]:
        text = line.strip()
        match = re.match(r"^(\w+)/\s+(.*)$", text)
        if match:
            package, names = match.group(1), match.group(2)
        elif text.endswith(".py") or ".py " in text:
            package, names = "", " ".join(w[:-3] for w in text.split() if w.endswith(".py"))
        else:
            names = text  # a wrapped continuation of the package above
        names = names.replace("numerics probe", "numerics")
        listed.setdefault(package, set()).update(
            n.strip() for n in re.split(r"[,\s]+", names) if n.strip())
    return listed


def _tree_layout() -> dict[str, set[str]]:
    tree: dict[str, set[str]] = {}
    for name in MODULES:
        parts = name.split(".")[1:]
        if not parts or parts[-1] in ("__init__", "__main__"):
            continue
        if len(parts) == 1:
            if (REPO_ROOT / "engine" / parts[0]).is_dir():
                continue  # a package's __init__
            tree.setdefault("", set()).add(parts[0])
        else:
            tree.setdefault(parts[0], set()).add(parts[1])
    return tree


def test_readme_layout_lists_exactly_the_engine_modules():
    assert _readme_layout() == _tree_layout()


def test_every_engine_path_and_module_the_architecture_doc_names_exists():
    missing = []
    for path in set(re.findall(r"\bengine/[\w/]+\.py\b", ARCHITECTURE)):
        if not (REPO_ROOT / path).is_file():
            missing.append(path)
    for dotted in set(re.findall(r"\bengine(?:\.\w+)+", ARCHITECTURE)):
        module = dotted
        while module not in MODULES and "." in module:
            module = module.rsplit(".", 1)[0]  # engine.run.launcher.stop -> the module
        if module == "engine":
            missing.append(dotted)
    assert missing == []


def test_every_entry_point_in_the_architecture_doc_is_runnable():
    commands = set(re.findall(r"python -m (engine(?:\.\w+)*)", ARCHITECTURE))
    assert {"engine", "engine.run.worker", "engine.run.standby", "engine.run.torchrun",
            "engine.diagnostics.check", "engine.cluster.ray_driver"} <= commands
    for module in commands:
        path = MODULES[module]
        if path.name == "__init__.py":
            assert (path.parent / "__main__.py").is_file(), module
        else:
            assert 'if __name__ == "__main__":' in path.read_text(encoding="utf-8"), module


def _anchors(markdown: str) -> set[str]:
    """GitHub-style anchors of the headings."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_code_pointers_into_the_precision_reference_land_on_a_heading():
    anchors = _anchors(REFERENCE)
    pointers = []
    for path in (REPO_ROOT / "engine").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"precision-reference\.md((?:#[\w\-]+)(?: and #[\w\-]+)*)", text):
            pointers += [(path, anchor) for anchor in re.findall(r"#([\w\-]+)", match.group(1))]
    assert len(pointers) >= 5
    wrong = [f"{p.relative_to(REPO_ROOT)}: #{a}" for p, a in pointers if a not in anchors]
    assert wrong == []


def test_the_code_cites_no_document_outside_the_repository():
    cited = [str(p.relative_to(REPO_ROOT)) for d in ("engine", "pages", "tests", "bench", "scripts")
             for p in (REPO_ROOT / d).rglob("*.py")
             if p.name != "test_docs.py"
             and re.search(r"REFERENCE\.md|DESIGN\.md|\bDESIGN:|\.\./shared", p.read_text(encoding="utf-8"))]
    assert cited == []
