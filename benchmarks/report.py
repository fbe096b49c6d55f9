"""Leaderboards from run directories (never a model): load, group, bootstrap, mark the best.

Rows are methods (plus model and retriever when those differ between runs); column groups are
datasets (in the papers' order: HotpotQA, 2Wiki, MuSiQue, Bamboogle, then any other), then an
average. Each cell carries EM/F1/acc with 95% bootstrap intervals over items, n done of n total,
errors, mean searches, mean generated tokens and latency.

Partial and failed runs are shown, never silently averaged:

- a run is *complete* when it has ``results.json`` saying so and every item of its selection is
  scored; a run without ``results.json`` (interrupted) is computed from ``scores.jsonl`` and
  marked partial;
- a failed item (the retriever or the server failed) is left out of every mean and counted in
  the cell's ``errors``: the one rule of ``results.json`` too
  (:func:`benchmarks.evaluate.item_values`), so a run with failed items is not complete, and a
  run whose items all failed shows no score;
- a row's average (the macro mean of its per-dataset means) is only given when the row has every
  dataset and each of its cells is complete; otherwise it is ``None``;
- the best value of a column is chosen among complete cells only;
- a run directory that cannot be read is skipped with a reason that the report lists.

With ``rescore=True`` scores are recomputed in memory from ``trajectories.jsonl`` with the current
metric code; the run directory is not modified (``harness score`` is the command that rewrites it).
"""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.evaluate import (
    DEFAULT_METRICS,
    behaviour,
    item_values,
    score_trajectory,
    scored_items,
    unanswerable_ids,
)
from benchmarks.profiles import JUDGE, get_profile
from benchmarks.stats import CI, DEFAULT_B, DEFAULT_SEED, PairedDiff, bootstrap_ci, paired_bootstrap
from harness.config import read_yaml
from harness.run_records import ItemScore, RunResults
from harness.runlog import MANIFEST, RunDir, RunDirError
from harness.types import Trajectory

logger = logging.getLogger(__name__)

METRICS = ("em", "f1", "acc", "cover_em")
# The order papers print these benchmarks in; subsets such as ``hotpotqa_500`` sort with their base.
DATASET_ORDER = ("hotpotqa", "2wikimultihopqa", "2wiki", "musique", "bamboogle")
TRAINING_METRICS = "metrics.jsonl"  # what a training run folder holds (training/logging_utils.py)
REFERENCE_FIELDS = (
    *("system", "kind", "model", "algorithm", "metric", "values", "corpus", "retriever", "k"),
    *("turns", "steps", "compute", "subset", "source", "read"),
)
#: What a published row is: the paper's own number, or someone else's run of the same system.
REFERENCE_KINDS = ("paper", "independent reproduction")


def dataset_sort_key(name: str) -> tuple[int, str]:
    """Sort key putting the four multi-hop benchmarks first in the conventional order."""
    base = name.split("_")[0].lower()
    return (DATASET_ORDER.index(base) if base in DATASET_ORDER else len(DATASET_ORDER), name)


@dataclass
class RunSummary:
    """What a report needs from one run directory: its identity and per-item scores."""

    path: Path
    method: str
    dataset: str
    split: str
    model: str
    retriever: str
    n_total: int
    scores: list[ItemScore]
    results: RunResults | None = None  # results.json; None for an interrupted run
    rescored: bool = False
    trajectories: list[Trajectory] | None = None  # read only when asked (load_run's trajectories)
    answerability: dict[str, Any] | None = None  # the manifest's (harness index check), when known

    @property
    def n(self) -> int:
        """Items scored (finished, not failed: :func:`~benchmarks.evaluate.scored_items`)."""
        return len(scored_items(self.scores))

    @property
    def errors(self) -> int:
        return sum(1 for s in self.scores if s.error)

    @property
    def complete(self) -> bool:
        """Finished by ``harness eval`` (results.json says complete) and every item scored."""
        finished = self.results is not None and self.results.complete
        return finished and self.n >= self.n_total

    @property
    def status(self) -> str:
        """Why a cell is not a clean, complete run ('' when it is)."""
        bits = []
        if self.n < self.n_total:
            bits.append(f"{self.n}/{self.n_total}")
        elif not self.complete:
            bits.append("partial: no results.json" if self.results is None else "partial")
        if self.errors:
            bits.append(f"{self.errors} err")
        return ", ".join(bits)

    def mean(self, key: str) -> float | None:
        """Mean of a numeric score field (``n_searches``) over the scored items that have it."""
        vals = [v for s in scored_items(self.scores) if (v := getattr(s, key, None)) is not None]
        return float(np.mean(vals)) if vals else None

    def latency(self, q: float) -> float | None:
        """The q-th percentile (0..100) of per-item wall time in seconds, over the scored items."""
        vals = [s.wall_time_s for s in scored_items(self.scores) if s.wall_time_s is not None]
        return float(np.percentile(vals, q)) if vals else None

    def item_values(self, metric: str) -> dict[str, float]:
        """One value per example id (:func:`benchmarks.evaluate.item_values`: failed items and
        missing values left out, samples of one example averaged): what the bootstrap resamples."""
        return item_values(self.scores, metric)

    def missing(self, metric: str) -> int:
        """Items (not failed) whose value of ``metric`` is missing."""
        return sum(1 for s in self.scores if s.metric(metric) is None and not s.error)

    def behaviour(self, correct: str) -> dict[str, float | None]:
        """Abstention and cost with ``correct`` as the measure of a right answer
        (:func:`benchmarks.evaluate.behaviour`, as ``results.json`` has them; recomputed from the
        scores, so ``--rescore`` recomputes them too)."""
        return behaviour(self.scores, correct, unanswerable_ids(self.answerability))

    def finish_reasons(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.scores:
            reason = str(s.finish_reason)
            out[reason] = out.get(reason, 0) + 1
        return out


@dataclass
class FoundRuns:
    """What :func:`find_runs` found: evaluation run directories, training run folders, and the
    folders it passed over, each as ``"path: why"``."""

    runs: list[Path] = field(default_factory=list)
    training: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def is_eval_run(path: Path) -> bool:
    """An evaluation run directory (``harness eval``) holds ``manifest.json``."""
    return (path / MANIFEST).is_file()


def is_training_run(path: Path) -> bool:
    """A training run folder (``harness train``) holds ``metrics.jsonl``, written per step."""
    return (path / TRAINING_METRICS).is_file() and not is_eval_run(path)


def _walk(root: Path, found: FoundRuns, seen: set[Path] | None = None) -> bool:
    """Collect the runs under ``root`` (itself included) into ``found``; True when any was found.

    Nothing below a run is searched: an evaluation run holds no other run, and the evaluation
    runs inside a training run (``validation/step-N/``) are its validation curve, not leaderboard
    rows. Hidden folders (``.stale-*`` outputs moved aside, temporaries) are passed over and listed.
    """
    seen = set() if seen is None else seen
    seen.add(root.resolve())  # a link back up the tree is not followed twice
    if is_eval_run(root):
        found.runs.append(root)
        return True
    if is_training_run(root):
        found.training.append(root)
        return True
    hit, empty = False, []
    for child in sorted(c for c in root.iterdir() if c.is_dir()):
        if child.name.startswith("."):
            found.skipped.append(f"{child}: hidden folder (moved-aside or temporary outputs), not searched")
        elif child.resolve() in seen:
            found.skipped.append(f"{child}: a link to {child.resolve()}, already searched")
        elif _walk(child, found, seen):
            hit = True
        elif _has_files(child):
            empty.append(child)
    if hit:  # the topmost folders without a run are listed, once (a parent without any is listed above)
        found.skipped += [f"{child}: {NO_RUN}" for child in empty]
    return hit


def _has_files(path: Path) -> bool:
    """Whether a folder holds anything (an empty folder is not worth a line in the report)."""
    return any(path.iterdir())


NO_RUN = "no run inside (an evaluation run holds manifest.json, a training run metrics.jsonl)"


def find_runs(patterns: list[str]) -> FoundRuns:
    """Evaluation and training runs named by ``patterns``: run folders, folders holding runs at
    any depth (``runs/demo`` finds ``runs/demo/eval/*`` and ``runs/demo/sft/model``), or globs.

    Folders that hold no run are listed in ``skipped`` with why. Raises ``ValueError`` naming
    every pattern that matched no run at all, so a typo is not silently dropped from a report.
    """
    found = FoundRuns()
    unmatched = []
    for pat in patterns:
        matches = sorted(glob.glob(pat)) or ([pat] if Path(pat).exists() else [])
        before = len(found.runs) + len(found.training)
        for m in matches:
            p = Path(m)
            if not p.is_dir():
                found.skipped.append(f"{p}: not a folder")
            elif not _walk(p, found) and _has_files(p):
                found.skipped.append(f"{p}: {NO_RUN}")
        if len(found.runs) + len(found.training) == before:
            unmatched.append(pat)
    if unmatched:
        raise ValueError(
            "no run directories found in "
            + ", ".join(repr(p) for p in unmatched)
            + " (an evaluation run holds manifest.json, a training run metrics.jsonl)"
        )
    found.runs = list(dict.fromkeys(p.resolve() for p in found.runs))
    found.training = list(dict.fromkeys(p.resolve() for p in found.training))
    found.skipped = list(dict.fromkeys(found.skipped))
    return found


def _rescored(run: RunDir, trajectories: list[Trajectory]) -> list[ItemScore]:
    """Scores recomputed from the trajectories with the metrics the run recorded; LLM-judge
    verdicts are not recomputed (that needs the judge), so the stored ones are kept."""

    metrics = tuple(run.manifest.config.get("metrics") or DEFAULT_METRICS)
    stored = {s.key: s for s in run.scores()} if "judge" in metrics else {}
    out = []
    for t in trajectories:
        s = score_trajectory(t, metrics)
        old = stored.get(s.key)
        if old is not None:
            s = replace(s, metrics={**s.metrics, "judge": old.metric("judge")})
        out.append(s)
    return out


def load_run(path: Path, rescore: bool = False, trajectories: bool = False) -> RunSummary:
    """Read one run directory (scores from ``scores.jsonl``, or recomputed when ``rescore``).

    ``trajectories``: read ``trajectories.jsonl`` too (the HTML report's browser shows them), so
    a corrupt line is found here, naming ``file:line``, before any output is written.
    """
    run = RunDir(path)
    m = run.manifest
    results = run.results()
    trajs = run.trajectories() if (rescore or trajectories) else None
    scores = _rescored(run, trajs or []) if rescore else run.scores()
    n_total = m.n_total or (results.n_total if results else 0) or len(scores)
    return RunSummary(
        path=Path(path),
        method=str(m.method or Path(path).name),
        dataset=str(m.dataset or "?"),
        split=str(m.split or ""),
        model=str(m.model or "?"),
        retriever=str(m.retriever or "none"),
        n_total=int(n_total),
        scores=scores,
        results=results,
        rescored=rescore,
        trajectories=trajs if trajectories else None,
        answerability=m.answerability,
    )


def load_paths(
    paths: list[Path], rescore: bool = False, trajectories: bool = False
) -> tuple[list[RunSummary], list[str]]:
    """Load run directories; unreadable ones are returned as ``"path: reason"`` (never dropped
    silently). The reason names ``file:line`` when a line of a run file is corrupt."""
    runs, skipped = [], []
    for p in paths:
        try:
            runs.append(load_run(p, rescore=rescore, trajectories=trajectories))
        except (RunDirError, ValueError, KeyError, OSError) as e:
            logger.warning("skipping %s: %s", p, e)
            skipped.append(f"{p}: {e}")
    return runs, skipped


def load_runs(patterns: list[str], rescore: bool = False) -> tuple[list[RunSummary], list[str]]:
    """The evaluation runs :func:`find_runs` finds, loaded; what was passed over or is unreadable
    comes back as ``"path: reason"``."""
    found = find_runs(patterns)
    runs, skipped = load_paths(found.runs, rescore=rescore)
    return runs, found.skipped + skipped


@dataclass
class Cell:
    """One (row, dataset) entry: the run, its intervals and, with a baseline, paired differences."""

    run: RunSummary
    ci: dict[str, CI]
    vs_baseline: dict[str, PairedDiff] = field(default_factory=dict)


@dataclass
class Row:
    key: tuple[str, str, str]  # method, model, retriever
    label: str
    cells: dict[str, Cell]
    average: dict[str, float | None]


@dataclass
class Leaderboard:
    """Everything the renderers need; built by :func:`build_leaderboard`."""

    rows: list[Row]
    datasets: list[str]
    metrics: tuple[str, ...]
    baseline: str | None
    best: dict[tuple[str, str], float]  # (dataset or "avg", metric) -> best mean among complete cells
    bootstrap: int = DEFAULT_B
    seed: int = DEFAULT_SEED
    skipped: list[str] = field(default_factory=list)
    profile: str | None = None  # the metric profile the columns come from (benchmarks.profiles)
    training: list[Any] = field(default_factory=list)  # benchmarks.training_curves.TrainingRun: curves

    def is_best(self, dataset: str, metric: str, value: float | None) -> bool:
        best = self.best.get((dataset, metric))
        return value is not None and best is not None and abs(value - best) < 1e-12

    @property
    def n_runs(self) -> int:
        return sum(len(r.cells) for r in self.rows)


def _labels(runs: list[RunSummary]) -> dict[tuple[str, str, str], str]:
    """Row labels: the method, plus model and retriever only when they differ between runs."""
    models = {r.model for r in runs}
    retrievers = {r.retriever for r in runs if r.retriever != "none"}  # naive has none: not a difference
    out = {}
    for r in runs:
        parts = [r.method]
        if len(models) > 1:
            parts.append(r.model)
        if len(retrievers) > 1 and r.retriever != "none":
            parts.append(r.retriever)
        out[(r.method, r.model, r.retriever)] = " / ".join(parts)
    return out


def _group(runs: list[RunSummary], labels: dict) -> dict[tuple[str, str, str], dict[str, RunSummary]]:
    grouped: dict[tuple[str, str, str], dict[str, RunSummary]] = {}
    for r in sorted(runs, key=lambda r: str(r.path)):
        key = (r.method, r.model, r.retriever)
        if r.dataset in grouped.setdefault(key, {}):
            logger.warning(
                "two runs for %s on %s: keeping %s over %s",
                labels[key],
                r.dataset,
                r.path,
                grouped[key][r.dataset].path,
            )
        grouped[key][r.dataset] = r
    return grouped


def _average(cells: dict[str, Cell], datasets: list[str], metrics: tuple[str, ...]) -> dict[str, float | None]:
    """Macro average over datasets, only when every dataset has a complete run (so no failed item)."""
    complete = len(cells) == len(datasets) and all(c.run.complete for c in cells.values())
    return {m: (float(np.mean([c.ci[m].mean for c in cells.values()])) if complete else None) for m in metrics}


def build_leaderboard(
    runs: list[RunSummary],
    metrics: tuple[str, ...] = METRICS,
    baseline: str | None = None,
    b: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    skipped: list[str] | None = None,
    profile: str | None = None,
) -> Leaderboard:
    """Group runs by method × dataset, bootstrap every cell, test against ``baseline``, mark the best."""
    labels = _labels(runs)
    datasets = sorted({r.dataset for r in runs}, key=dataset_sort_key)
    rows = []
    for key, by_ds in sorted(_group(runs, labels).items(), key=lambda kv: labels[kv[0]]):
        cells = {
            ds: Cell(run, {m: bootstrap_ci(list(run.item_values(m).values()), b, seed) for m in metrics})
            for ds, run in sorted(by_ds.items(), key=lambda kv: dataset_sort_key(kv[0]))
        }
        rows.append(Row(key, labels[key], cells, _average(cells, datasets, metrics)))
    if baseline is not None:
        _mark_significance(rows, baseline, metrics, b, seed)
    best = _best(rows, datasets, metrics)
    return Leaderboard(rows, datasets, metrics, baseline, best, b, seed, skipped or [], profile)


def _best(rows: list[Row], datasets: list[str], metrics: tuple[str, ...]) -> dict[tuple[str, str], float]:
    best: dict[tuple[str, str], float] = {}
    for m in metrics:
        for ds in datasets:
            vals = [r.cells[ds].ci[m].mean for r in rows if ds in r.cells and r.cells[ds].run.complete]
            vals = [v for v in vals if v == v]  # an empty run's NaN is never best
            if vals:
                best[(ds, m)] = max(vals)
        avgs = [r.average[m] for r in rows if r.average[m] is not None]
        if avgs:
            best[("avg", m)] = max(avgs)
    return best


def _mark_significance(rows: list[Row], baseline: str, metrics: tuple[str, ...], b: int, seed: int) -> None:
    """Paired bootstrap of every other row against the baseline row on the items both have."""
    base_rows = [r for r in rows if r.key[0] == baseline]
    if not base_rows:
        methods = ", ".join(sorted({r.key[0] for r in rows}))
        raise ValueError(f"--baseline {baseline!r} is not among the methods: {methods}")
    if len(base_rows) > 1:
        logger.warning("several %s rows; testing against %s", baseline, base_rows[0].label)
    base = base_rows[0]
    for row in rows:
        if row is base:
            continue
        for ds, cell in row.cells.items():
            if ds not in base.cells:
                continue
            for m in metrics:
                mine, theirs = cell.run.item_values(m), base.cells[ds].run.item_values(m)
                shared = sorted(set(mine) & set(theirs))
                cell.vs_baseline[m] = paired_bootstrap([mine[k] for k in shared], [theirs[k] for k in shared], b, seed)


def load_reference(path: str | Path) -> list[dict[str, Any]]:
    """Published numbers (``configs/reference/published.yaml``): one entry per system and setting.

    Every entry must carry its kind (:data:`REFERENCE_KINDS`), its setting (model, algorithm,
    corpus, retriever, k, turns, steps, compute, subset: ``null`` where the source does not say),
    its source (a repository and path, an arXiv id and table, or a url) and the date it was read
    (``read``), because the numbers are only meaningful with them; a missing field is an error,
    not a blank.
    """
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: published numbers file holds a mapping with 'entries'")
    entries = data.get("entries", [])
    for e in entries:
        missing = [f for f in REFERENCE_FIELDS if f not in e]
        if missing:
            raise ValueError(f"{path}: entry {e.get('system')!r} lacks {missing}")
        if not isinstance(e["values"], dict):
            raise ValueError(f"{path}: entry {e['system']!r}: values must map dataset -> number")
        if e["kind"] not in REFERENCE_KINDS:
            raise ValueError(f"{path}: entry {e['system']!r}: kind {e['kind']!r} is not one of {list(REFERENCE_KINDS)}")
        e["read"] = str(e["read"])  # YAML reads 2026-12-06 as a date; reports print and embed it as text
        src = e["source"]
        if not isinstance(src, dict) or not (
            {"repository", "path"} <= set(src) or {"arxiv", "table"} <= set(src) or "url" in src
        ):
            raise ValueError(
                f"{path}: entry {e['system']!r}: source must name a repository and path, an arxiv id and table, "
                f"or a url, not {src!r:.80}"
            )
    return entries


def source_text(src: Any) -> str:
    """A published row's source in one phrase (a repository path at a commit, an arXiv table, a url)."""
    if not isinstance(src, dict):
        return str(src)
    if "repository" in src:
        text = f"{src['repository']} {src['path']}" + (f" @ {str(src['commit'])[:7]}" if src.get("commit") else "")
    elif "arxiv" in src:
        text = f"arXiv {src['arxiv']}, {src['table']}"
    else:
        text = str(src["url"])
    return text + (f", as quoted in {src['quoted_in']}" if src.get("quoted_in") else "")


def reference_datasets(entries: list[dict[str, Any]]) -> list[str]:
    """Datasets named by the published entries, in the conventional order."""
    return sorted({ds for e in entries for ds in e["values"]}, key=dataset_sort_key)


def reference_setting(e: dict[str, Any]) -> str:
    """One line describing where a published number comes from and how it was measured."""
    parts = [
        e.get("kind", ""),
        e.get("algorithm") or "",
        f"corpus {e['corpus']}",
        f"retriever {e['retriever']}",
        f"top-{e['k']}" if e.get("k") else "",
        f"{e['turns']} turns" if e.get("turns") else "",
        f"{e['steps']} steps" if e.get("steps") else "",
        e.get("compute") or "",
        e["subset"],
    ]
    text = ", ".join(str(p) for p in parts if p) + f"; source: {source_text(e['source'])}"
    text += f" (read {e['read']})" if e.get("read") else ""
    return text + (f"; note: {e['note']}" if e.get("note") else "")


def run_profile(runs: list[RunSummary]) -> str | None:
    """The metric profile every run recorded (``metric_profile`` of its config), or None when
    they differ or none recorded one."""
    names = set()
    for r in runs:
        try:
            names.add(RunDir(r.path).manifest.config.get("metric_profile", "default"))
        except RunDirError:
            names.add(None)
    return names.pop() if len(names) == 1 else None


def profile_columns(profile: str, runs: list[RunSummary]) -> tuple[str, ...]:
    """The leaderboard metrics of ``profile``; ``judge`` only when some run has judge verdicts."""
    p = get_profile(profile)
    has_judge = any(s.metric(JUDGE) is not None for r in runs for s in r.scores)
    return p.metrics if has_judge else p.without_judge()
