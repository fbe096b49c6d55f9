"""How numbers and metric names read in tables: the one percent formatter and the metrics'
display names (reports, replication tables, the demo summary and the CLI's tables use these)."""

from __future__ import annotations

NAMES = {
    "em": "EM",
    "f1": "F1",
    "acc": "Acc",
    "cover_em": "Cover-EM",
    "em_last_answer": "EM (last answer)",
    "em_r1_searcher": "EM (R1-Searcher)",
    "f1_r1_searcher": "F1 (R1-Searcher)",
    "f1_prorag": "F1 (ProRAG)",
    "judge": "LLM judge",
    "abstain": "Abstain",
}
MISSING = "–"


def pct(x: float | None, digits: int = 1, signed: bool = False) -> str:
    """A 0..1 value as a percentage (``0.4351`` → ``43.5``); ``–`` for missing or NaN.
    ``signed``: a leading ``+`` on non-negative values (differences in points)."""
    if x is None or x != x:
        return MISSING
    return format(100 * x, f"{'+' if signed else ''}.{digits}f")


def p_value(p: float | None, bare: bool = False) -> str:
    """A p-value as it reads in text: ``p=0.012``, and ``p<0.001`` below what three decimals show
    (a bootstrap of B=1000 resamples cannot tell 0 from "under 1/B"); ``–`` when missing.
    ``bare``: without the ``p`` (a table's p column: ``0.012``, ``<0.001``)."""
    if p is None or p != p:
        return MISSING
    text = "<0.001" if p < 0.001 else f"={p:.3f}"
    return text.removeprefix("=") if bare else "p" + text
