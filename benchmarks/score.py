"""``harness score``: any JSONL prediction file scored with the harness metrics (and, optionally,
the LLM judge), without a run directory.

Each line holds a prediction (``pred_key``) and its gold answer(s) (``gold_key``); with the judge
also the question (``question_key``) and an id for the verdict cache (``id_key``, else the line
number). A bad row fails naming ``file:line``; a missing judge verdict is left out of the judge's
mean and counted.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from benchmarks.fmt import pct
from benchmarks.judge import JudgeConfig, LLMJudge
from benchmarks.metrics import METRICS, score_prediction
from benchmarks.profiles import JUDGE, profile_metrics
from harness.registry import RegistryError
from harness.textfiles import read_jsonl

logger = logging.getLogger(__name__)


class ScoreError(ValueError):
    """A prediction file or a score option is unusable; the message names the file and line."""


@dataclass
class FileScores:
    """Each metric's mean over the file (None: no value, e.g. every judge call failed), the
    number of predictions, on how many the judge gave no verdict, and how many rows had no
    prediction (a null one: scored as wrong, as an eval item with no answer is)."""

    means: dict[str, float | None]
    n: int
    judge_missing: int | None = None
    no_prediction: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {**self.means, "n": self.n}
        out = out if self.judge_missing is None else {**out, "judge_missing": self.judge_missing}
        return {**out, "no_prediction": self.no_prediction} if self.no_prediction else out


def metric_names(metrics: str, profile: str | None = None, judge_url: str | None = None) -> list[str]:
    """The metrics to compute: comma-separated ``metrics``, or ``profile``'s set; ``judge`` is
    added with ``judge_url``. Raises ``ScoreError`` for an unknown name or a judge without a URL."""
    try:
        names = list(profile_metrics(profile, bool(judge_url))) if profile else [m.strip() for m in metrics.split(",")]
        names = [m for m in names if m]
        if judge_url and JUDGE not in names:
            names.append(JUDGE)
        for m in names:
            if m != JUDGE:
                METRICS.get(m)
    except RegistryError as e:
        raise ScoreError(str(e)) from None
    if JUDGE in names and not judge_url:
        raise ScoreError("metric 'judge' needs --judge-url (an OpenAI-compatible endpoint)")
    return names


def file_judge(file: Path, url: str, model: str | None = None, key_env: str | None = None) -> Any:
    """The LLM judge for a prediction file; its verdict cache sits beside the file (FILE.judge/)."""
    opts = {"url": url, "model": model, **({"api_key_env": key_env} if key_env else {})}
    cache = file.with_name(file.name + ".judge")
    cache.mkdir(parents=True, exist_ok=True)
    judge = LLMJudge(JudgeConfig.from_options(opts), cache_dir=cache)
    judge.write_record(cache)
    return judge


def _row(where: str, row: dict[str, Any], pred_key: str, gold_key: str, question_key: str | None) -> tuple:
    """(prediction, gold answers) of one row, checked; bad rows fail naming ``where``."""
    needs = [pred_key, gold_key] + ([question_key] if question_key else [])
    if any(k not in row for k in needs):
        flags = "--pred-key/--gold-key" + ("/--question-key" if question_key else "")
        raise ScoreError(f"{where}: needs fields {', '.join(repr(k) for k in needs)} (see {flags})")
    gold, pred = row[gold_key], row[pred_key]
    if isinstance(gold, list) and (not gold or not all(isinstance(g, str | int | float) for g in gold)):
        raise ScoreError(f"{where}: {gold_key!r} must be a non-empty list of strings, got {json.dumps(gold)[:100]}")
    if not isinstance(gold, str | list):
        raise ScoreError(f"{where}: {gold_key!r} must be a string or a list of strings")
    if pred is not None and not isinstance(pred, str | int | float):
        raise ScoreError(f"{where}: {pred_key!r} must be a string (one prediction), got {type(pred).__name__}")
    return ("" if pred is None else str(pred)), gold


def score_file(
    file: str | Path,
    names: list[str],
    pred_key: str = "pred",
    gold_key: str = "golden_answers",
    judge: Any = None,
    question_key: str = "question",
    id_key: str = "id",
) -> FileScores:
    """Score every prediction of ``file`` with ``names`` (:func:`metric_names`); ``judge``: an
    LLM judge (:func:`file_judge`) for the ``judge`` metric, closed when done."""
    file = Path(file)
    plain = [m for m in names if m != JUDGE]
    values: dict[str, list[float]] = {m: [] for m in names}
    n = 0
    nulls: list[int] = []  # the lines whose prediction is null
    try:
        for lineno, row in read_jsonl(file, ScoreError):
            pred, gold = _row(f"{file}:{lineno}", row, pred_key, gold_key, question_key if judge else None)
            if row[pred_key] is None:
                nulls.append(lineno)
            for m, v in score_prediction(pred, gold, plain).items():
                values[m].append(v)
            if judge is not None:
                golds = [gold] if isinstance(gold, str) else [str(g) for g in gold]
                verdict = judge(str(row.get(id_key, lineno)), str(row[question_key]), golds, pred)
                if verdict is not None:
                    values[JUDGE].append(verdict)
            n += 1
    finally:
        if judge is not None:
            judge.close()
    if n == 0:
        raise ScoreError(f"{file}: no predictions")
    if nulls:
        logger.warning(
            "%s: %d of %d rows have no prediction (%r is null; first on line %d): scored as wrong",
            file, len(nulls), n, pred_key, nulls[0],
        )  # fmt: skip
    means = {m: (sum(v) / len(v) if v else None) for m, v in values.items()}
    return FileScores(means, n, n - len(values[JUDGE]) if judge is not None else None, len(nulls))


def scores_table(file: str | Path, scores: FileScores) -> Any:
    """The means as a one-row rich table (percent, two decimals)."""

    title = f"{Path(file).name} (n={scores.n}"
    title += f"; {scores.no_prediction} with no prediction, scored as wrong" if scores.no_prediction else ""
    title += f"; judge missing on {scores.judge_missing})" if scores.judge_missing is not None else ")"
    table = Table(title=title)
    for m in scores.means:
        table.add_column(m, justify="right")
    table.add_row(*(pct(v, digits=2) for v in scores.means.values()))
    return table
