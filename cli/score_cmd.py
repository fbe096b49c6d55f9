"""``harness score``: score any JSONL prediction file with the harness metrics
(:func:`benchmarks.score.score_file`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from benchmarks.profiles import PROFILES
from cli.common import fail
from cli.options import JudgeKeyEnv, JudgeModel, JudgeUrl


def score_command(
    file: Path = typer.Argument(..., help="JSONL file, one prediction per line."),
    pred_key: str = typer.Option("pred", "--pred-key", help="Field holding the prediction."),
    gold_key: str = typer.Option("golden_answers", "--gold-key", help="Field holding the gold answer(s)."),
    metrics: str = typer.Option("em,f1,acc,cover_em", "--metrics", help="Comma-separated metric names."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object: each metric's mean and n."),
    metric_profile: str = typer.Option(
        None, "--metric-profile", help=f"A paper's metric set instead of --metrics ({', '.join(PROFILES.names())})."
    ),
    judge_url: JudgeUrl = None,
    judge_model: JudgeModel = None,
    judge_key_env: JudgeKeyEnv = None,
    question_key: str = typer.Option("question", "--question-key", help="Field holding the question (judge)."),
    id_key: str = typer.Option("id", "--id-key", help="Field holding the item id (judge cache; else the line)."),
) -> None:
    # deferred: the command's library loads when it runs, not at every harness --help
    from rich.console import Console

    # deferred: the command's library loads when it runs, not at every harness --help
    from benchmarks.score import ScoreError, file_judge, metric_names, score_file, scores_table

    try:
        names = metric_names(metrics, metric_profile, judge_url)
        if not file.is_file():
            raise ScoreError(f"{file}: no such file")
        judge = file_judge(file, judge_url, judge_model, judge_key_env) if judge_url else None
        scores = score_file(file, names, pred_key, gold_key, judge, question_key, id_key)
    except ScoreError as e:
        fail(str(e))
    if as_json:
        typer.echo(json.dumps(scores.to_dict()))
        return
    Console().print(scores_table(file, scores))
