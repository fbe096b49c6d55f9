"""The share of ``training/``'s public signatures that take or return ``Any`` (issue 47).

A public signature is a function at module level, or a method of a class at module level, whose
name does not start with ``_``. It uses ``Any`` when any parameter or the return annotation
mentions ``Any`` (``Any``, ``typing.Any``, or inside a string annotation). Nested functions are
not counted: they are not part of a module's surface.

    .venv/bin/python -m scripts.perf.any_share [--dir training] [--list]
"""

from __future__ import annotations

import argparse
import ast
import logging
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]  # the repository root

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


def mentions_any(node: ast.expr | None) -> bool:
    """Whether an annotation names ``Any`` anywhere (a string annotation is parsed first)."""
    if node is None:
        return False
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id == "Any":
            return True
        if isinstance(sub, ast.Attribute) and sub.attr == "Any":
            return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                if mentions_any(ast.parse(sub.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def uses_any(fn: FunctionNode) -> bool:
    """Whether a parameter's or the return annotation mentions ``Any``."""
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
    return any(mentions_any(p.annotation) for p in params) or mentions_any(fn.returns)


def public_functions(tree: ast.Module) -> Iterator[tuple[str, FunctionNode]]:
    """``(qualified name, node)`` of a module's public functions and its classes' public methods."""
    for node in tree.body:
        if isinstance(node, FunctionNode) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, FunctionNode) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def count(folder: Path) -> tuple[int, list[str]]:
    """The number of public signatures under ``folder`` (its subpackages included) and those that use ``Any``."""
    total, with_any = 0, []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, fn in public_functions(tree):
            total += 1
            if uses_any(fn):
                with_any.append(f"{path.relative_to(ROOT)}:{fn.lineno} {name}")
    return total, with_any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default="training", help="folder under the repository root")
    p.add_argument("--list", action="store_true", help="also list the signatures that use Any")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    total, with_any = count(ROOT / args.dir)
    if args.list:
        for line in with_any:
            logger.info("%s", line)
    share = len(with_any) / total if total else 0.0
    logger.info("%s: %d of %d public signatures use Any (%.1f%%)", args.dir, len(with_any), total, 100 * share)


if __name__ == "__main__":
    main()
