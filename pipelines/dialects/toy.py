"""Toy (a throwaway system that checks docs/adding_a_system.md), as its own code runs it."""

from __future__ import annotations

import re

from harness.types import Doc
from pipelines.dialects.base import Action, Dialect, TurnEnd
from pipelines.dialects.protocols import search_r1_docs
from pipelines.dialects.system import System, register


def toy_parse(d: Dialect, text: str, end: TurnEnd) -> Action:
    """The last <answer> block answers; else the last <search> block searches; else invalid."""
    answers = re.findall(r"<answer>(.*?)</answer>", text, flags=re.DOTALL)
    if answers:
        return Action("answer", answer=answers[-1].strip())
    queries = re.findall(r"<search>(.*?)</search>", text, flags=re.DOTALL)
    if queries and queries[-1].strip():
        return Action("search", queries=(queries[-1].strip(),))
    return Action("invalid", reason="no block")


def toy_observe(d: Dialect, queries: tuple[str, ...], results: list[list[Doc]]) -> str:
    return f"\n<docs>\n{search_r1_docs(results[0] if results else [])}</docs>\n"


def toy_answer(d: Dialect, response: str) -> str | None:
    m = re.findall(r"<answer>(.*?)</answer>", response, flags=re.DOTALL)
    return m[-1].strip() if m else None


def toy_validate(d: Dialect, response: str) -> tuple[bool, str]:
    ok = response.count("<answer>") == 1 and response.rstrip().endswith("</answer>")
    return ok, "ok" if ok else "one answer block at the end"


SYSTEM = System(
    name="toy",
    profile="default",
    reward="em",
    configs=("configs/dialects/toy.yaml", "configs/methods/toy.yaml", "configs/replicate/toy.yaml"),
    flashrag_differences=("FlashRAG has no Toy port",),
)

register(
    SYSTEM,
    parse=toy_parse,
    observe=toy_observe,
    extract=toy_answer,
    validate=toy_validate,
    search_stops=("</search>", "</answer>"),
    final_stops=("</answer>",),
    corrective="\nUse <search> or <answer>.\n",
    obs_open="<docs>",
    obs_close="</docs>",
    answer_rule="the last <answer>...</answer> of the response, stripped",
)
