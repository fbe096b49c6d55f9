"""Results in a public leaderboard's own format (``harness report --format searchagent-leaderboard``).

The TencentBAC SearchAgent Leaderboard (a Hugging Face Space) takes one JSON file per model::

    {"config": {"model_dtype": ..., "model_name": ..., "model_sha": ...},
     "results": {"nq": {"exact_match": 0.469}, ..., "fictionalhot": {"exact_match": 0.061}}}

with scores in [0, 1] (its README's "Data format (results)" section; the task keys and the
metric key are those of its ``src/about.py`` ``Tasks``). docs/evaluation.md says what of it was
verified and what was not.

One file per leaderboard row (method × model × retriever), the row's EM on each of the board's
sets it has, the very means the report prints (:class:`benchmarks.report.Leaderboard`). A row
whose setting is not the board's (another corpus, another top-k, an incomplete run) is refused,
naming what differs, unless ``any_setting``: a number from another setting would sit on the
board beside numbers it cannot be compared with.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.registry import Registry
from harness.runlog import RunDir, RunDirError


@dataclass(frozen=True)
class Board:
    """A leaderboard's results format and the setting its numbers are measured in."""

    name: str
    tasks: dict[str, str]  # the board's task key -> the harness dataset name
    metric: str  # the board's metric key
    harness_metrics: tuple[str, ...]  # the harness metric it is, in order of preference
    corpus_markers: tuple[str, ...]  # a run searched the board's corpus when its corpus or index names one
    corpus: str
    topk: int
    source: str
    folder: str  # where the files go inside the report folder


BOARDS: Registry[Board] = Registry("leaderboard export")
BOARDS.register(
    "searchagent-leaderboard",
    Board(
        name="searchagent-leaderboard",
        tasks={
            "nq": "nq",
            "triviaqa": "triviaqa",
            "popqa": "popqa",
            "hotpotqa": "hotpotqa",
            "2wiki": "2wikimultihopqa",
            "musique": "musique",
            "bamboogle": "bamboogle",
            "fictionalhot": "fictionalhot",
        },
        metric="exact_match",
        # EM under SQuAD normalisation; Search-R1's own (last <answer>) when the run used its profile
        harness_metrics=("em", "em_last_answer"),
        corpus_markers=("wiki-18", "wiki18"),
        corpus="wiki-18 (Search-R1's 2018 Wikipedia dump)",
        topk=3,
        source="huggingface.co/spaces/TencentBAC/SearchAgent_Leaderboard: README.md (Data format) and src/about.py",
        folder="searchagent-leaderboard",
    ),
)


def slug(label: str) -> str:
    """A file name for a row's label (``research+sft / bm25`` → ``research-sft-bm25``)."""
    return re.sub(r"[^A-Za-z0-9._]+", "-", label).strip("-") or "run"


def run_setting_differences(board: Board, run: Any) -> list[str]:
    """Where one run (a :class:`benchmarks.report.RunSummary`) is not in the board's setting."""
    try:
        m = RunDir(run.path).manifest
    except RunDirError as e:
        return [f"no manifest ({e})"]
    out = []
    names = " ".join(str(x) for x in (m.corpus, m.index_id, (m.config.get("retriever") or {}).get("index")) if x)
    if not any(marker in names.lower() for marker in board.corpus_markers):
        out.append(f"corpus {m.corpus or m.index_id or m.retriever or 'none'} (board: {board.corpus})")
    if m.topk != board.topk:
        out.append(f"top-{m.topk} (board: top-{board.topk})")
    if not run.complete:
        out.append(f"incomplete run ({run.status or 'no results.json'})")
    return out


def board_metric(board: Board, run: Any) -> str | None:
    """The harness metric a run's board number is: the first of ``board.harness_metrics`` it has."""
    for m in board.harness_metrics:
        if run.item_values(m):
            return m
    return None


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def board_files(lb: Any, board_name: str, any_setting: bool = False) -> dict[str, bytes]:
    """``{path inside the report folder: JSON}``: one file per leaderboard row that has one of the
    board's sets. Raises ``ValueError`` naming every row and run whose setting is not the board's
    (unless ``any_setting``) or that has no EM, and when no row has any of the board's sets."""
    board = BOARDS.get(board_name)
    wanted = {ds: task for task, ds in board.tasks.items()}
    files: dict[str, bytes] = {}
    problems = []
    for row in lb.rows:
        results = {}
        for ds, cell in row.cells.items():
            task = wanted.get(ds)
            if task is None:
                continue
            diffs = [] if any_setting else run_setting_differences(board, cell.run)
            metric = board_metric(board, cell.run)
            if metric is None:
                diffs.append(f"no {' or '.join(board.harness_metrics)} scores")
            if diffs:
                problems.append(f"{row.label} on {ds}: {'; '.join(diffs)}")
                continue
            results[task] = {board.metric: _mean(cell.run.item_values(metric))}
        if results:
            order = {t: i for i, t in enumerate(board.tasks)}
            doc = {
                "config": {"model_dtype": "unknown", "model_name": row.label, "model_sha": "unknown"},
                "results": dict(sorted(results.items(), key=lambda kv: order[kv[0]])),
            }
            files[f"{board.folder}/{slug(row.label)}.json"] = (json.dumps(doc, indent=2) + "\n").encode("utf-8")
    if problems:
        raise ValueError(
            f"--format {board.name}: not the board's setting (top-{board.topk} over {board.corpus}, complete runs): "
            + " | ".join(problems)
            + " (pass --any-setting to export them anyway)"
        )
    if not files:
        sets = ", ".join(board.tasks.values())
        raise ValueError(f"--format {board.name}: no run on any of the board's sets ({sets})")
    return files


def read_board_file(path: str | Path, board_name: str = "searchagent-leaderboard") -> dict[str, float]:
    """``{task: score}`` of a board file (what the board reads: ``results.<task>.<metric>``)."""
    board = BOARDS.get(board_name)
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), dict):
        raise ValueError(f"{path}: not a {board.name} results file (no 'results' object)")
    return {task: float(v[board.metric]) for task, v in doc["results"].items()}
