"""The house plan's one-way imports, checked on the source with ``ast``:

harness (core) ← pipelines ← benchmarks ← training ← harness.cli

``benchmarks`` builds methods by name (``benchmarks.build``), so it may import ``pipelines``;
``pipelines`` never imports ``benchmarks``. The scripts under ``benchmarks/perf`` sit on top of
the library, as the CLI does. Nothing outside ``harness/cli`` imports ``harness.cli``.
Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# What each room may import from the project (besides itself).
ALLOWED = {
    "harness": {"harness"},
    "pipelines": {"harness", "pipelines"},
    "benchmarks": {"harness", "pipelines", "benchmarks"},
    "training": {"harness", "pipelines", "benchmarks", "training"},
    "harness.cli": {"harness", "harness.cli", "pipelines", "benchmarks", "training"},
    # Performance scripts are programs on top of the library, like the CLI (but not through it).
    "benchmarks.perf": {"harness", "pipelines", "benchmarks", "training"},
}
PACKAGES = ("harness", "pipelines", "benchmarks", "training")


def room_of(path: Path) -> str:
    rel = path.relative_to(REPO)
    if rel.parts[:2] == ("harness", "cli"):
        return "harness.cli"
    if rel.parts[:2] == ("benchmarks", "perf"):
        return "benchmarks.perf"
    return rel.parts[0]


def imported_rooms(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top not in PACKAGES:
                continue
            out.append((node.lineno, "harness.cli" if name.startswith("harness.cli") else top))
    return out


def test_imports_flow_one_way():
    bad = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            room = room_of(path)
            for line, target in imported_rooms(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if target not in ALLOWED[room]:
                    bad.append(f"{path.relative_to(REPO)}:{line}: {room} imports {target}")
    assert not bad, "imports against the house plan:\n" + "\n".join(bad)


def test_only_cli_tests_import_the_cli():
    """Tests of other rooms use the library functions, not the CLI's internals."""
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for line, target in imported_rooms(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if target == "harness.cli":
                src = path.read_text(encoding="utf-8").splitlines()[line - 1]
                if "harness.cli.main import app" not in src and "harness.cli.main import main" not in src:
                    bad.append(f"{path.relative_to(REPO)}:{line}: {src.strip()}")
    assert not bad, "tests reaching into CLI internals:\n" + "\n".join(bad)


def test_the_checker_sees_a_violation():
    tree = ast.parse("def f():\n    from training.trainer import Trainer\n")
    assert imported_rooms(tree) == [(2, "training")]
    assert "training" not in ALLOWED["pipelines"]
