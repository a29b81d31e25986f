"""The docs stay true to the tree: the layout in docs/architecture.md lists exactly the
engine's packages and modules, every engine path or module docs/architecture.md names exists, every
`python -m ...` entry point it lists can be run as one, and the code's pointers into
docs/precision-reference.md land on a heading that exists."""

from __future__ import annotations

import re

from import_graph import REPO_ROOT, engine_modules

ARCHITECTURE = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
REFERENCE = (REPO_ROOT / "docs" / "precision-reference.md").read_text(encoding="utf-8")
MODULES = engine_modules()


def _layout_block() -> dict[str, set[str]]:
    """{"training": {"loop", ...}, "": {"config", ...}} from the layout block of
    docs/architecture.md ("Layout")."""
    block = ARCHITECTURE[ARCHITECTURE.index("  engine/\n"):]
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


def test_the_layout_lists_exactly_the_engine_modules():
    assert _layout_block() == _tree_layout()


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
    cited = [
        str(p.relative_to(REPO_ROOT))
        for d in ("engine", "pages", "tests", "bench", "scripts")
        for p in (REPO_ROOT / d).rglob("*.py")
        if p.name != "test_docs.py"
        and re.search(
            r"REFERENCE\.md|DESIGN\.md|\bDESIGN:|\.\./shared", p.read_text(encoding="utf-8")
        )
    ]
    assert cited == []


DOC_PAGES = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# Written on a GPU node by scripts/gpu_acceptance.py (docs/gpu-acceptance.md), not kept here.
_PRODUCED_ON_A_GPU = {"gpu-reports/"}


def test_every_relative_link_in_the_readme_and_docs_lands():
    wrong = []
    for page in DOC_PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"\w+://", target) or target in _PRODUCED_ON_A_GPU:
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path) if path else page
            if not dest.exists():
                wrong.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(
                    dest.read_text(encoding="utf-8")):
                wrong.append(f"{page.relative_to(REPO_ROOT)}: {target} (no such heading)")
    assert wrong == []


def test_the_readme_stays_short_and_the_performance_page_readable():
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(readme) < 250
    for page in (REPO_ROOT / "README.md", REPO_ROOT / "docs" / "performance.md"):
        long_lines = [n for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
                      if len(line) > 200]
        assert long_lines == [], f"{page.name}: lines over 200 characters: {long_lines}"
