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
    metric_profile: str = typer.Option(
        None, "--metric-profile", help="A paper's metric set instead of --metrics (search_r1, r1_searcher, ...)."
    ),
    judge_url: str = typer.Option(None, "--judge-url", help="OpenAI-compatible endpoint (…/v1) of the LLM judge."),
    judge_model: str = typer.Option(None, "--judge-model", help="Judge model name (default: the judge prompt's)."),
    judge_key_env: str = typer.Option(None, "--judge-api-key-env", help="Env var holding the judge's API key."),
    question_key: str = typer.Option("question", "--question-key", help="Field holding the question (judge)."),
    id_key: str = typer.Option("id", "--id-key", help="Field holding the item id (judge cache; else the line)."),
) -> None:
    from benchmarks.metrics import METRICS
    from harness.registry import RegistryError

    names = [m.strip() for m in metrics.split(",") if m.strip()]
    if metric_profile:
        from benchmarks.profiles import profile_metrics

        try:
            names = list(profile_metrics(metric_profile, judge_configured=bool(judge_url)))
        except RegistryError as e:
            fail(str(e))
    if judge_url and "judge" not in names:
        names.append("judge")
    judge = _judge(file, judge_url, judge_model, judge_key_env) if "judge" in names else None
    if "judge" in names and judge is None:
        fail("metric 'judge' needs --judge-url (an OpenAI-compatible endpoint)")
    for m in names:
        try:
            if m != "judge":
                METRICS.get(m)
        except RegistryError as e:
            fail(str(e))
    if judge is not None:
        _score_with_judge(file, pred_key, gold_key, question_key, id_key, names, judge, as_json)
        return
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


def _judge(file: Path, url: str | None, model: str | None, key_env: str | None):
    """The LLM judge for ``harness score``; its verdict cache sits beside the file (FILE.judge/)."""
    if not url:
        return None
    from benchmarks.judge import JudgeConfig, LLMJudge

    opts = {"url": url, "model": model, **({"api_key_env": key_env} if key_env else {})}
    cache = file.with_name(file.name + ".judge")
    cache.mkdir(parents=True, exist_ok=True)
    judge = LLMJudge(JudgeConfig.from_options(opts), cache_dir=cache)
    judge.write_record(cache)
    return judge


def _score_with_judge(file, pred_key, gold_key, question_key, id_key, names, judge, as_json) -> None:
    """Score every line, the judge included: a missing verdict is left out of the mean and counted."""
    from benchmarks.metrics import score_prediction

    if not file.is_file():
        fail(f"{file}: no such file")
    values: dict[str, list[float]] = {m: [] for m in names}
    n = 0
    for lineno, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            fail(f"{file}:{lineno}: malformed JSON ({e.msg})")
        if not isinstance(row, dict) or pred_key not in row or gold_key not in row or question_key not in row:
            fail(f"{file}:{lineno}: needs fields {pred_key!r}, {gold_key!r} and {question_key!r} for the judge")
        gold = row[gold_key]
        golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
        pred = str(row[pred_key] or "")
        plain = [m for m in names if m != "judge"]
        for m, v in score_prediction(pred, golds, plain).items():
            values[m].append(v)
        verdict = judge(str(row.get(id_key, lineno)), str(row[question_key]), golds, pred)
        if verdict is not None:
            values["judge"].append(verdict)
        n += 1
    judge.close()
    if n == 0:
        fail(f"{file}: no predictions")
    means = {m: (sum(v) / len(v) if v else None) for m, v in values.items()}
    missing = n - len(values["judge"])
    if as_json:
        typer.echo(json.dumps({**means, "n": n, "judge_missing": missing}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{file.name} (n={n}; judge missing on {missing})")
    for m in names:
        table.add_column(m, justify="right")
    table.add_row(*("-" if means[m] is None else f"{100 * means[m]:.2f}" for m in names))
    Console().print(table)
