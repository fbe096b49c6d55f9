"""The results table ``harness eval`` (and ``harness demo``) prints: one row per run, one column
per metric of the runs (the profile's), then searches, tokens, latency and errors, then abstention
and cost (``abst``: share of predictions that decline; ``tok/ok`` and ``srch/ok``: generated tokens
and searches per correct answer) and, for runs whose questions ``harness index check`` recorded,
accuracy on the answerable questions and abstention on the unanswerable ones
(:func:`benchmarks.evaluate.behaviour`).

Numbers are never cut: number columns never wrap or shrink; the method and dataset names wrap
instead; and when the number columns do not fit the width together, they are split over
several tables, each repeating the method and dataset. Not a terminal (piped, logged): rendered
at full width (at least 200 columns).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.fmt import NAMES

_KEYS = ("method", "dataset")
_KEY_MIN = 10  # columns the method and dataset names keep at least (they wrap within them)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _behaviour_cells(r: Any, answerability: bool) -> list[str]:
    b = getattr(r, "behaviour", None) or {}
    cells = [
        _pct(b.get("abstention")),
        _num(b.get("tokens_per_correct"), ".0f"),
        _num(b.get("searches_per_correct"), ".2f"),
    ]
    if answerability:
        cells += [_pct(b.get("answerable_accuracy")), _pct(b.get("unanswerable_abstention"))]
    return cells


def _rows(results: list[Any], metrics: list[str], answerability: bool = False) -> list[list[str]]:
    def cell(r: Any, m: str) -> str:
        missing = (getattr(r, "missing", None) or {}).get(m, 0)
        return _pct(r.metrics.get(m)) + (f" ({missing} missing)" if missing else "")

    return [
        [
            str(r.method),
            str(r.dataset),
            f"{r.n}/{r.n_total}",
            *(cell(r, m) for m in metrics),
            "-" if r.mean_searches is None else f"{r.mean_searches:.2f}",
            "-" if r.mean_generated_tokens is None else f"{r.mean_generated_tokens:.0f}",
            "-" if r.latency_p50_s is None else f"{r.latency_p50_s:.2f}",
            str(r.errors),
            *_behaviour_cells(r, answerability),
        ]
        for r in results
    ]


def results_tables(results: list[Any], profile: str | None = None, width: int = 80) -> list[Any]:
    """The rich tables that show ``results`` within ``width`` columns without cutting a number
    (one table when it fits, else the number columns split over several)."""
    metrics = list(dict.fromkeys(m for r in results for m in r.metrics))
    answerability = any("answerable_accuracy" in (getattr(r, "behaviour", None) or {}) for r in results)
    cols = [
        *_KEYS,
        "n",
        *(NAMES.get(m, m) for m in metrics),
        "srch",
        "tok",
        "p50 s",
        "err",
        "abst",
        "tok/ok",
        "srch/ok",
    ]
    cols += ["ans acc", "unans abst"] if answerability else []
    rows = _rows(results, metrics, answerability)
    need = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(cols)]
    # A rich table with the default box takes 3 columns per column (padding and a rule) plus 1.
    room = width - 1 - sum(min(_KEY_MIN, need[i]) + 3 for i in range(len(_KEYS)))
    groups: list[list[int]] = [[]]
    used = 0
    for i in range(len(_KEYS), len(cols)):
        if groups[-1] and used + need[i] + 3 > room:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += need[i] + 3
    title = "harness eval" + (f" (metric profile: {profile})" if profile else "")
    tables = []
    for g, group in enumerate(groups):
        part = f" ({g + 1}/{len(groups)})" if len(groups) > 1 else ""
        table = Table(title=title + part)
        for i in range(len(_KEYS)):
            table.add_column(cols[i], overflow="fold", min_width=min(_KEY_MIN, need[i]))
        for i in group:
            table.add_column(cols[i], justify="right", no_wrap=True, min_width=need[i])
        for row in rows:
            table.add_row(*row[: len(_KEYS)], *(row[i] for i in group))
        tables.append(table)
    return tables


def print_results(results: list[Any], profile: str | None = None, console: Any = None) -> None:
    """Print :func:`results_tables` to ``console`` (stdout; full width when it is not a terminal)."""
    out = console or Console()
    if console is None and not out.is_terminal:
        out = Console(width=max(200, out.width))
    for table in results_tables(results, profile, out.width):
        out.print(table)
