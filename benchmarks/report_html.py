"""The self-contained HTML report: one file, scripts and styles inline, data embedded as JSON.

It needs no network when viewed: the template (``templates/report.html``) carries its own CSS and
a small JS that draws the sortable table, bar charts with error bars and the cost scatter as
inline SVG. Trajectories are embedded for the browser, capped per run (the page says so) and with
long texts shortened, so the file stays small enough to open.
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Any

from benchmarks.report import Cell, Leaderboard, reference_datasets, reference_setting
from benchmarks.training_curves import curves_data
from harness.run_records import ItemScore
from harness.runlog import RunDir
from harness.types import Trajectory

MAX_ITEMS_PER_RUN = 300
MAX_TEXT = 2000
MAX_DOC_TEXT = 300


def _short(s: str | None, n: int) -> str:
    s = s or ""
    return s if len(s) <= n else s[:n] + " …"


def _search(sr) -> dict[str, Any]:
    docs = [{"id": d.id, "title": d.title, "text": _short(d.text, MAX_DOC_TEXT), "score": d.score} for d in sr.docs]
    return {"turn": sr.turn, "query": sr.query, "docs": docs, "error": sr.error}


def _steps(t: Trajectory) -> list[dict[str, Any]]:
    """Segments in order, with each turn's searches placed after the model text that issued them.

    The agent numbers search turns from 0 and appends one model segment per turn, so the searches
    of turn ``i`` follow the ``i``-th model segment; any left over are listed at the end. A
    FlashRAG baseline's trajectory has one prompt and one answer, and its searches all happened
    before the answer was generated: they are shown, in turn order, between the two.
    """
    if t.metadata.get("baseline"):
        searches = [{"role": "search", **_search(sr)} for sr in sorted(t.searches, key=lambda sr: sr.turn)]
        steps = []
        for i, seg in enumerate(t.segments):
            if seg.role == "model":
                steps += searches
                searches = []
            steps.append({"role": seg.role, "text": _short(seg.text, MAX_TEXT), "first_prompt": i == 0})
        return steps + searches
    by_turn: dict[int, list[dict[str, Any]]] = {}
    for sr in t.searches:
        by_turn.setdefault(sr.turn, []).append(_search(sr))
    steps, model_turn = [], 0
    for i, seg in enumerate(t.segments):
        text = _short(seg.text, MAX_TEXT)
        steps.append({"role": seg.role, "text": text, "first_prompt": i == 0 and seg.role == "prompt"})
        if seg.role == "model":
            steps += [{"role": "search", **s} for s in by_turn.pop(model_turn, [])]
            model_turn += 1
    for turn in sorted(by_turn):
        steps += [{"role": "search", **s} for s in by_turn[turn]]
    return steps


def _item(k: int, label: str, ds: str, t: Trajectory, s: ItemScore | None) -> dict[str, Any]:
    metrics = s.metrics if s is not None else {}
    return {
        "k": k,
        "method": label,
        "dataset": ds,
        "id": t.example_id,
        "sample_index": t.sample_index,
        "question": t.question,
        "answers": list(t.answers),
        "prediction": t.prediction,
        "finish_reason": t.finish_reason,
        "error": t.error,
        "scores": {m: v for m, v in metrics.items() if v is not None},  # every metric the run has (judge too)
        "correct": bool(metrics.get("em") or 0.0),
        "n_searches": len(t.searches),
        "generated_tokens": t.generated_tokens,
        "wall_time_s": t.wall_time_s,
        "steps": _steps(t),
    }


def _items(lb: Leaderboard) -> tuple[list[dict[str, Any]], list[str]]:
    """Browser items of every run (first ``MAX_ITEMS_PER_RUN`` each) and notes on what was capped."""
    items: list[dict[str, Any]] = []
    capped = []
    for row in lb.rows:
        for ds, cell in row.cells.items():
            scores = {s.key: s for s in cell.run.scores}
            trajs = cell.run.trajectories
            if trajs is None:  # not read with the run (load_run's trajectories=False)
                trajs = RunDir(cell.run.path).trajectories()
            if len(trajs) > MAX_ITEMS_PER_RUN:
                capped.append(f"{row.label} · {ds}: first {MAX_ITEMS_PER_RUN} of {len(trajs)} items")
            for t in trajs[:MAX_ITEMS_PER_RUN]:
                items.append(_item(len(items), row.label, ds, t, scores.get((t.example_id, t.sample_index))))
    return items, capped


def _cell(c: Cell, correct: str) -> dict[str, Any]:
    r = c.run
    return {
        "ci": {m: {"mean": ci.mean, "low": ci.low, "high": ci.high} for m, ci in c.ci.items()},
        "vs": {
            m: {"diff": d.diff, "low": d.low, "high": d.high, "p": d.p, "n": d.n, "sig": d.significant}
            for m, d in c.vs_baseline.items()
        },
        "n": r.n,
        "n_total": r.n_total,
        "errors": r.errors,
        "complete": r.complete,
        "status": r.status,
        "searches": r.mean("n_searches"),
        "tokens": r.mean("generated_tokens"),
        "p50": r.latency(50),
        "p95": r.latency(95),
        "behaviour": r.behaviour(correct),  # abstention and cost (benchmarks.evaluate.behaviour)
    }


def report_data(lb: Leaderboard, reference: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the page shows, as plain JSON-able data."""
    items, capped = _items(lb)
    return {
        "generated": time.strftime("%Y-%m-%d %H:%M"),
        "runs": lb.n_runs,
        "baseline": lb.baseline,
        "bootstrap": lb.bootstrap,
        "seed": lb.seed,
        "datasets": lb.datasets,
        "metrics": list(lb.metrics),
        "metric_profile": lb.profile,
        "best": {f"{ds}|{m}": v for (ds, m), v in lb.best.items()},
        "rows": [
            {
                "label": r.label,
                "average": r.average,
                "cells": {ds: _cell(c, lb.metrics[0] if lb.metrics else "em") for ds, c in r.cells.items()},
            }
            for r in lb.rows
        ],
        "skipped": lb.skipped,
        "reference": [
            {**e, "setting": reference_setting(e), "shown": {ds: str(v) for ds, v in e["values"].items()}}
            for e in reference or []
        ],
        "reference_datasets": reference_datasets(reference or []),
        "items": items,
        "capped": capped,
        "training": curves_data(lb.training) if lb.training else None,
    }


def to_html(lb: Leaderboard, reference: list[dict[str, Any]] | None = None) -> str:
    """The report page with the data embedded; safe to open from disk with no network."""
    template = (resources.files("benchmarks") / "templates" / "report.html").read_text(encoding="utf-8")
    blob = json.dumps(_clean(report_data(lb, reference)), ensure_ascii=False, allow_nan=False)
    # Inside <script>, "</script>" or "<!--" in a retrieved doc would end or confuse the block; JSON's
    # "\u003c" escape keeps every "<" (so every "</") out of the HTML parser's sight.
    blob = blob.replace("<", "\\u003c")
    return template.replace("__DATA__", blob)


def _clean(x: Any) -> Any:
    """NaN (an empty run's interval) is not JSON: make it null."""
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_clean(v) for v in x]
    return x
