"""The house plan's one-way imports, checked on the source with ``ast``:

library:   harness (core) ← pipelines ← benchmarks ← training
programs:  programs (the demo, the stage executor, the fault battery) ← cli (the ``harness`` command),
           scripts (the fault battery's entry, the demo data, performance scripts)

``benchmarks`` builds methods by name (``benchmarks.build``), so it may import ``pipelines``;
``pipelines`` never imports ``benchmarks``. The programs sit on top of the library in rooms of
their own, so no library room imports upward and none is exempt: the CLI (``cli``) and the scripts
(``scripts``) import the library and the programs (``programs``: the demo, the stage executor,
the fault battery); nothing imports them. Nor does the library name them as text (a module path
to spawn or import: ``python -m cli.main``, ``"cli.eval_cmd"``): a program the library must run
is handed to it (the stage executor), and the CLI's command table lives in ``cli``. Imports inside
functions count too: a lazy import is still a dependency. No module imports itself back through others (no
circles, between rooms or within one), and every module under ``cli`` stays short: option
declarations and one library call each.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLI_MAX_LINES = 200
# What tests may import from the CLI: its app and entry point, and its command table.
CLI_SURFACE = ("cli.main import app", "cli.main import main", "cli.commands import")

# What each room (a top-level folder) may import from the project (besides itself).
ALLOWED = {
    "harness": {"harness"},
    "pipelines": {"harness", "pipelines"},
    "benchmarks": {"harness", "pipelines", "benchmarks"},
    "training": {"harness", "pipelines", "benchmarks", "training"},
    # Programs that are more than a command's options (the demo): the CLI and the scripts run them.
    "programs": {"harness", "pipelines", "benchmarks", "training", "programs"},
    "cli": {"harness", "pipelines", "benchmarks", "training", "programs", "cli"},
    # Performance scripts are programs on top of the library, like the CLI (but not through it).
    "scripts": {"harness", "pipelines", "benchmarks", "training", "programs", "scripts"},
}
PACKAGES = tuple(ALLOWED)
# Inside ``training``: the modules at its top are the floor every trainer shares (config, engine,
# checkpoint, losses, rewards, ...); each room holds one trainer or the data tools and may import the
# floor and the rooms named here. The floor imports no room, except ``training.build``, which picks
# a room's trainer by ``algo.kind``.
TRAINING_ROOMS = {
    "rl": set(),
    "sft": set(),
    "prm": {"sft"},  # the PRM trainer reuses SFT's loop pieces
    "retriever": set(),
    "data": {"sft"},  # RFT writes SFT records
}
TRAINING_COMPOSERS = ("training.build",)
LIBRARY = ("harness", "pipelines", "benchmarks", "training")
TOP_FLOOR = ("cli", "programs", "scripts")
# A top-floor module named as text: ``cli.main``, ``programs.faults.kit``, ``-m scripts`` (not a file
# path such as ``scripts/faults.py``, nor a word such as ``debug-cli.log``).
_FLOOR = "|".join(TOP_FLOOR)
_MODULE_TEXT = re.compile(rf"(?<![\w./-])(?:{_FLOOR})(?:\.[A-Za-z_]\w*)+|-m\s*(?:{_FLOOR})(?:\.\w+)*\b")


def room_of(path: Path) -> str:
    return path.relative_to(REPO).parts[0]


def imported_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every absolute import, ``from X import Y`` giving both X and X.Y."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def imported_rooms(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for line, name in imported_names(tree):
        if name.split(".")[0] not in PACKAGES:
            continue
        room = name.split(".")[0]
        if (line, room) not in out:
            out.append((line, room))
    return out


def modules() -> dict[str, Path]:
    """Every project module by dotted name (a package by its ``__init__``)."""
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module → the project modules it imports (the longest dotted prefix that is a module)."""

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts and ".".join(parts) not in mods:
            parts.pop()
        return ".".join(parts) or None

    graph = {}
    for name, path in mods.items():
        targets = {resolve(n) for _, n in imported_names(ast.parse(path.read_text(encoding="utf-8"), str(path)))}
        graph[name] = {t for t in targets if t and t != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.append(m)
                    if m == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_imports_flow_one_way():
    bad = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            room = room_of(path)
            for line, target in imported_rooms(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                if target not in ALLOWED[room]:
                    bad.append(f"{path.relative_to(REPO)}:{line}: {room} imports {target}")
    assert not bad, "imports against the house plan:\n" + "\n".join(bad)


def test_no_import_circles():
    found = circles(import_graph(modules()))
    assert not found, "modules that import each other (in-function imports count):\n" + "\n".join(
        " ↔ ".join(c) for c in found
    )


def training_room(module: str) -> str | None:
    """The room of a ``training`` module (``training.rl.trainer`` → ``rl``), None for the floor."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[0] == "training" else None


def test_training_rooms_import_the_floor_and_their_named_siblings():
    bad = []
    mods = modules()
    for name, targets in import_graph(mods).items():
        if not name.startswith("training.") or name in TRAINING_COMPOSERS:
            continue
        room = training_room(name)
        allowed = {room} | TRAINING_ROOMS.get(room, set()) if room else set()
        for target in sorted(targets):
            to = training_room(target) if target.startswith("training.") else None
            if to is not None and to not in allowed:
                bad.append(f"{mods[name].relative_to(REPO)}: {name} imports {target}")
    assert not bad, "training rooms importing against their order:\n" + "\n".join(bad)


def test_training_rooms_are_packages():
    found = {p.parent.name for p in (REPO / "training").glob("*/__init__.py")}
    assert found == set(TRAINING_ROOMS), f"rooms under training/ {sorted(found)} vs TRAINING_ROOMS"


def test_cli_modules_are_short():
    long = []
    for path in sorted((REPO / "cli").glob("*.py")):
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > CLI_MAX_LINES:
            long.append(f"{path.relative_to(REPO)}: {n} lines")
    assert not long, f"CLI modules over {CLI_MAX_LINES} lines (move the logic into the library):\n" + "\n".join(long)


def test_only_cli_tests_import_the_cli():
    """Tests of other rooms use the library functions, not the CLI's internals (its app, entry point
    and command table are its surface)."""
    bad = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        for line, target in imported_rooms(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if target == "cli":
                src = path.read_text(encoding="utf-8").splitlines()[line - 1]
                if not any(ok in src for ok in CLI_SURFACE):
                    bad.append(f"{path.relative_to(REPO)}:{line}: {src.strip()}")
    assert not bad, "tests reaching into CLI internals:\n" + "\n".join(bad)


def test_the_checkers_see_a_violation():
    tree = ast.parse("def f():\n    from training.rl.trainer import Trainer\n")
    assert imported_rooms(tree) == [(2, "training")]
    assert "training" not in ALLOWED["pipelines"]
    assert imported_rooms(ast.parse("from scripts.perf.x import y\n")) == [(1, "scripts")]
    assert "scripts" not in ALLOWED["benchmarks"]
    assert all("cli" not in ALLOWED[room] for room in ("harness", "pipelines", "benchmarks", "training"))
    assert all("programs" not in ALLOWED[room] for room in ("harness", "pipelines", "benchmarks", "training"))
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(graph) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert [training_room(m) for m in ("training.rl.trainer", "training.config", "training")] == ["rl", None, None]


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def top_floor_texts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of each string that names a top-floor module (:data:`_MODULE_TEXT`). Every
    string counts, f-strings' parts and docstrings included, except that a docstring may say how
    to run a script or program (``python -m scripts.build_demo``): it spawns nothing. The CLI is
    never named by module, docstrings included: the library speaks of its commands (``harness
    eval``)."""
    skip = docstrings(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
            continue
        found = [m.group(0) for m in _MODULE_TEXT.finditer(node.value)]
        if id(node) in skip:
            found = [f for f in found if re.search(r"\bcli\b", f)]
        out += [(node.lineno, f) for f in found]
    return out


def test_the_library_names_no_program_as_text():
    """Issue 47: no library module spawns or imports the CLI, the programs or the scripts by a
    module path written as text (``[sys.executable, "-m", "cli.main"]``, a command table's
    ``"cli.eval_cmd"``): the program it must run is handed to it."""
    bad = []
    for pkg in LIBRARY:
        for path in sorted((REPO / pkg).rglob("*.py")):
            for line, text in top_floor_texts(ast.parse(path.read_text(encoding="utf-8"), str(path))):
                bad.append(f"{path.relative_to(REPO)}:{line}: names {text!r}")
    assert not bad, "library modules naming a program's module as text:\n" + "\n".join(bad)


def test_the_text_check_sees_a_program_named():
    spawn = ast.parse('import sys\nCMD = [sys.executable, "-m", "cli.main", "eval"]\n')
    assert [t for _, t in top_floor_texts(spawn)] == ["cli.main"]
    shell = ast.parse('def f(x):\n    return f"python -m cli {x}"\n')
    assert [t for _, t in top_floor_texts(shell)] == ["-m cli"]
    doc = ast.parse('"""Run ``python -m scripts.build_demo``; the CLI is ``cli.main``."""\n')
    assert [t for _, t in top_floor_texts(doc)] == ["cli.main"]
    fine = ast.parse('"""``harness eval``; scripts/faults.py."""\nLOG = "debug-cli.*.log"\nX = "clip.5"\n')
    assert top_floor_texts(fine) == []


def test_the_library_parses_no_argv():
    """Command lines are the programs' business: no library module imports argparse or reads
    ``sys.argv`` (the CLI records the command line for the run lock, ``runlock.set_command``)."""
    bad = []
    for pkg in LIBRARY:
        for path in sorted((REPO / pkg).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for line, name in imported_names(tree):
                if name.split(".")[0] == "argparse":
                    bad.append(f"{path.relative_to(REPO)}:{line}: imports argparse")
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr == "argv" and getattr(node.value, "id", "") == "sys":
                    bad.append(f"{path.relative_to(REPO)}:{node.lineno}: reads sys.argv")
    assert not bad, "argv parsed outside the programs (cli/, scripts/):\n" + "\n".join(bad)
