"""``harness score``: score any JSONL prediction file with the harness metrics."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from harness.cli.common import fail


def score_command(
    file: Path = typer.Argument(..., help="JSONL file, one prediction per line."),
    pred_key: str = typer.Option("pred", "--pred-key", help="Field holding the prediction."),
    gold_key: str = typer.Option("golden_answers", "--gold-key", help="Field holding the gold answer(s)."),
    metrics: str = typer.Option("em,f1,acc,cover_em", "--metrics", help="Comma-separated metric names."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: each metric's mean and n."),
) -> None:
    from benchmarks.metrics import METRICS
    from harness.registry import RegistryError

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    for m in names:
        try:
            METRICS.get(m)
        except RegistryError as e:
            fail(str(e))
    if not file.is_file():
        fail(f"{file}: no such file")
    from harness.textfiles import text_lines

    totals = dict.fromkeys(names, 0.0)
    n = 0
    try:
        for lineno, line in text_lines(file):
            if not line.strip():
                continue
            for m, v in _score_line(file, lineno, line, pred_key, gold_key, names).items():
                totals[m] += v
            n += 1
    except ValueError as e:  # not UTF-8: the message names file:line
        fail(str(e))
    if n == 0:
        fail(f"{file}: no predictions")
    means = {m: totals[m] / n for m in names}
    if as_json:
        typer.echo(json.dumps({**means, "n": n}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{file.name} (n={n})")
    for m in names:
        table.add_column(m, justify="right")
    table.add_row(*(f"{100 * means[m]:.2f}" for m in names))
    Console().print(table)


def _score_line(file: Path, lineno: int, line: str, pred_key: str, gold_key: str, names: list[str]) -> dict:
    """One prediction row's metrics; bad rows fail naming ``file:line``."""
    from benchmarks.metrics import score_prediction

    where = f"{file}:{lineno}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        fail(f"{where}: malformed JSON ({e.msg})")
    if not isinstance(row, dict) or pred_key not in row or gold_key not in row:
        fail(f"{where}: needs fields {pred_key!r} and {gold_key!r} (see --pred-key/--gold-key)")
    gold, pred = row[gold_key], row[pred_key]
    if isinstance(gold, list) and (not gold or not all(isinstance(g, str | int | float) for g in gold)):
        fail(f"{where}: {gold_key!r} must be a non-empty list of strings, got {json.dumps(gold)[:100]}")
    if not isinstance(gold, str | list):
        fail(f"{where}: {gold_key!r} must be a string or a list of strings")
    if pred is not None and not isinstance(pred, str | int | float):
        fail(f"{where}: {pred_key!r} must be a string (one prediction), got {type(pred).__name__}")
    return score_prediction("" if pred is None else str(pred), gold, names)
