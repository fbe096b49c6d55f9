"""Training curves: what a training run logged, against step, as PNG files and as report data.

A training run folder (the ``--out`` of ``harness train``) holds ``metrics.jsonl``: one record
per step written by the trainers in ``training/`` (``{"schema", "step", ...scalars}``), and one
record per validation with ``val/<metric>`` keys; its validations are also evaluation runs under
``validation/step-N/<run>/``. The panels, each drawn only when some run logged it:

- reward: ``reward/mean``, then one panel per reward component ``reward/<name>``; a run of ten
  steps or more also gets a dashed trailing mean of five steps there (:func:`smoothed`);
- ``kl`` (to the reference), ``approx_kl`` (of the update), ``clip_frac``, ``entropy``;
- the rollout engine's log-probs against the trainer's (``mismatch/*``, logged by the RL trainer
  when the backend reports them; ``algo.rollout_correction`` acts on them): mean absolute
  log-ratio, the k3 KL estimate, the ratio's 5th, 50th and 95th percentiles, the share capped or masked;
- response length (``response_tokens``) and searches per rollout (``searches``);
- what the rollouts scored by the eval scorer, whatever the reward: ``em``, ``f1``, ``format_valid``;
- training health (``health/*``, :mod:`training.health`): empty retrievals, repeated n-grams,
  broken reasoning tags, mean ``<think>`` length;
- validation score: ``val/<metric>`` (from the log, else the validation run's ``results.json``);
- ``loss`` (the one curve an SFT or PRM run has in common with RL);
- asynchronous runs (``trainer.async``): staleness, trainer idle time, buffer depth; and the wall
  time per step of every run.

Several runs are drawn on the same axes, one line per run labelled by its name, so a sync and an
async run, or two recipes, sit side by side. PNGs are drawn with matplotlib's object API on the
Agg canvas (no pyplot, no global backend switch).
"""

from __future__ import annotations

import io
import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.report_files import write_all_or_none
from harness.runlog import RunDir, RunDirError
from harness.textfiles import read_jsonl

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
CURVES_DIR = "curves"
REWARD_MEAN, VAL_PREFIX = "reward/mean", "val/"
REWARD_NOT_COMPONENTS = {"reward/mean", "reward/std"}
# Names too generic to tell runs apart (``runs/demo/sft/model``): the label keeps the parent too.
GENERIC_NAMES = {"model", "out", "output", "run", "train", "final"}


@dataclass(frozen=True)
class Panel:
    """One chart: a ``metrics.jsonl`` key against step."""

    key: str
    title: str
    ylabel: str

    @property
    def file(self) -> str:
        """The PNG's path inside the report folder."""
        return f"{CURVES_DIR}/{re.sub(r'[^A-Za-z0-9]+', '_', self.key).strip('_')}.png"


# Fixed panels in display order; reward components follow the mean, validation metrics the rollouts' scores.
FIXED = (
    Panel(REWARD_MEAN, "reward (mean over the step's rollouts)", "reward"),
    Panel("kl", "KL to the reference policy", "KL"),
    Panel("approx_kl", "approximate KL of the update (new vs rollout policy)", "KL"),
    Panel("clip_frac", "clip fraction (tokens whose ratio was clipped)", "fraction"),
    Panel("entropy", "entropy (mean per generated token)", "nats"),
    # rollout engine vs trainer (training.losses.mismatch_stats); ratio = π_trainer / π_engine
    Panel("mismatch/abs_log_ratio", "engine vs trainer: mean |log-prob difference| per token", "nats"),
    Panel("mismatch/kl_k3", "engine vs trainer: KL estimate (k3)", "KL"),
    Panel("mismatch/ratio_p5", "engine vs trainer: importance ratio, 5th percentile", "ratio"),
    Panel("mismatch/ratio_p50", "engine vs trainer: importance ratio, median", "ratio"),
    Panel("mismatch/ratio_p95", "engine vs trainer: importance ratio, 95th percentile", "ratio"),
    Panel("mismatch/corrected_frac", "rollout correction: share capped or masked", "fraction"),
    Panel("response_tokens", "response length (generated tokens per rollout)", "tokens"),
    Panel("searches", "searches per rollout", "searches"),
    # what the rollouts scored with the eval scorer, whatever the reward (training/logging_utils.py)
    Panel("em", "EM of the training rollouts", "EM (0-1)"),
    Panel("f1", "F1 of the training rollouts", "F1 (0-1)"),
    Panel("format_valid", "format-valid responses among the rollouts", "fraction"),
    # training health (training/health.py): signs of collapse before the reward shows them
    Panel("health/empty_retrieval", "health: share of searches that returned no text", "fraction"),
    Panel("health/repeated_ngrams", "health: share of responses repeating a 6-word run 3+ times", "fraction"),
    Panel("health/broken_tags", "health: share of responses with malformed or unbalanced reasoning tags", "fraction"),
    Panel("health/think_words", "health: mean words inside <think> per response", "words"),
    Panel("loss", "training loss", "loss"),
    # trainer.async (training/rl/async_rollout.py): drawn only for asynchronous runs
    Panel("async/staleness_mean", "staleness of the step's groups (versions behind the trainer)", "versions"),
    Panel("async/trainer_wait_s", "trainer idle: seconds waiting for finished groups", "seconds"),
    Panel("async/buffer_depth", "finished groups left in the buffer after the step's take", "groups"),
    Panel("time/step_s", "wall time per step", "seconds"),
)
VAL_NAMES = {"em": "EM", "f1": "F1", "acc": "Acc", "cover_em": "Cover-EM"}
# Each RL step draws other prompts, so a per-step reward mixes learning with the prompts' difficulty:
# reward panels of runs with at least 2 windows of steps also get the trailing mean of SMOOTH_WINDOW
# steps, dashed, in the PNGs and the HTML alike.
SMOOTH_WINDOW = 5


def smoothed(panel_key: str, values: list[float | None]) -> list[float | None] | None:
    """The trailing mean over the last ``SMOOTH_WINDOW`` finite values at each step of a reward
    panel's series (``None`` where the step's own value is a gap), or ``None`` when the panel is
    not a reward or the run is shorter than two windows."""
    if not panel_key.startswith("reward/") or panel_key == "reward/std" or len(values) < 2 * SMOOTH_WINDOW:
        return None
    out: list[float | None] = []
    seen: list[float] = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        seen.append(v)
        recent = seen[-SMOOTH_WINDOW:]
        out.append(sum(recent) / len(recent))
    return out


@dataclass
class TrainingRun:
    """One training run's scalars: ``series[key]`` is ``[(step, value), ...]`` sorted by step
    (one value per step: the last logged; ``None`` for a non-finite value, drawn as a gap)."""

    path: Path
    label: str
    series: dict[str, list[tuple[int, float | None]]]
    notes: list[str] = field(default_factory=list)


def _number(v: Any) -> float | None | bool:
    """A plotted value: a finite float, ``None`` (NaN/inf: a gap), or False (not a scalar)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    return float(v) if math.isfinite(v) else None


def _read_log(path: Path, notes: list[str]) -> dict[str, dict[int, float | None]]:
    """``key -> {step: value}`` from ``metrics.jsonl``; a bad line raises ``ValueError`` naming
    ``file:line`` (a torn last line, a run killed mid-write or still writing, is dropped)."""
    out: dict[str, dict[int, float | None]] = {}
    repeated: set[int] = set()
    for lineno, rec in read_jsonl(path, ValueError, tolerant=True):
        step = rec.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise ValueError(f"{path}:{lineno}: a metrics record needs an integer 'step', got {step!r}")
        for key, v in rec.items():
            value = _number(v)
            if key in ("step", "schema") or value is False:
                continue
            if step in out.setdefault(key, {}):
                repeated.add(step)
            out[key][step] = value
    if repeated:
        steps = ", ".join(map(str, sorted(repeated)[:5])) + (" …" if len(repeated) > 5 else "")
        notes.append(f"step {steps} logged more than once (a resume that did not trim the log): the last is drawn")
    return out


def _validation_points(run: Path, series: dict[str, dict[int, float | None]], notes: list[str]) -> None:
    """Validation scores from ``validation/step-N/<run>/results.json`` where the log lacks them."""
    root = run / "validation"
    if not root.is_dir():
        return
    for step_dir in sorted(root.glob("step-*")):
        m = re.fullmatch(r"step-(\d+)", step_dir.name)
        evals = sorted(p for p in step_dir.iterdir() if p.is_dir()) if m else []
        for ev in evals:
            prefix = VAL_PREFIX if len(evals) == 1 else f"{VAL_PREFIX}{ev.name}/"
            try:
                results = RunDir(ev).results()
            except RunDirError as e:
                notes.append(f"{ev}: {e}")
                continue
            if results is None:
                notes.append(f"{ev}: no results.json (an interrupted validation), not drawn")
                continue
            for metric, v in results.metrics.items():
                value = _number(v)
                if value is not False:
                    series.setdefault(prefix + metric, {}).setdefault(int(m.group(1)), value)


def load_training_run(path: str | Path, label: str | None = None) -> TrainingRun:
    """Read one training run folder. Raises ``ValueError`` (no ``metrics.jsonl``, a corrupt line:
    ``file:line``)."""
    path = Path(path)
    log = path / METRICS_FILE
    if not log.is_file():
        raise ValueError(f"{path} is not a training run folder (no {METRICS_FILE})")
    notes: list[str] = []
    series = _read_log(log, notes)
    _validation_points(path, series, notes)
    return TrainingRun(
        path=path,
        label=label or path.name,
        series={k: sorted(v.items()) for k, v in series.items()},
        notes=notes,
    )


def run_labels(paths: list[Path]) -> list[str]:
    """Short, distinct names: the folder name, with as many parents as it takes to tell the runs
    apart (and the parent when the name is generic: ``sft/model``, ``rl/model``)."""
    parts = [Path(p).resolve().parts for p in paths]
    depth = [2 if len(ps) > 1 and ps[-1] in GENERIC_NAMES else 1 for ps in parts]
    while True:
        labels = ["/".join(ps[-d:]) for ps, d in zip(parts, depth, strict=True)]
        clashes = {x for x in labels if labels.count(x) > 1}
        grow = [i for i, x in enumerate(labels) if x in clashes and depth[i] < len(parts[i])]
        if not grow:
            return labels
        for i in grow:
            depth[i] += 1


def load_training_runs(paths: list[str | Path]) -> list[TrainingRun]:
    """Read several training runs, labelled by :func:`run_labels`."""
    paths = [Path(p) for p in paths]
    return [load_training_run(p, label) for p, label in zip(paths, run_labels(paths), strict=True)]


def panels(runs: list[TrainingRun]) -> list[Panel]:
    """The panels some run has at least one finite value for, in display order."""
    keys = {k for r in runs for k, pts in r.series.items() if any(v is not None for _, v in pts)}
    components = sorted(k for k in keys if k.startswith("reward/") and k not in REWARD_NOT_COMPONENTS)
    vals = sorted((k for k in keys if k.startswith(VAL_PREFIX)), key=_val_order)
    out = []
    for p in FIXED:
        if p.key in keys:
            out.append(p)
        if p.key == REWARD_MEAN:
            out += [Panel(k, f"reward component: {k.removeprefix('reward/')}", "reward") for k in components]
        if p.key == "format_valid":
            out += [Panel(k, f"validation {_val_name(k)} (greedy, through the eval path)", "score (0-1)") for k in vals]
    return out


def _val_order(key: str) -> tuple[int, str]:
    metric = key.rsplit("/", 1)[-1]
    order = list(VAL_NAMES)
    return (order.index(metric) if metric in order else len(order), key)


def _val_name(key: str) -> str:
    rest = key.removeprefix(VAL_PREFIX)
    where, _, metric = rest.rpartition("/")
    return VAL_NAMES.get(metric, metric) + (f" on {where}" if where else "")


def figure(panel: Panel, runs: list[TrainingRun]) -> Any:
    """The panel as a matplotlib ``Figure``: one line per run that logged ``panel.key``."""
    try:  # deferred: matplotlib costs ~0.3 s at import, only for figures
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError as e:  # a declared dependency; say how to get it rather than a bare traceback
        raise ImportError("training curves need matplotlib: pip install matplotlib") from e

    fig = Figure(figsize=(6.4, 3.6), dpi=100)
    fig.subplots_adjust(left=0.13, right=0.97, top=0.9, bottom=0.14)  # fixed: half the time of a layout engine
    ax = fig.add_subplot()
    palette = [f"C{i % 10}" for i in range(len(runs))]
    for run, colour in zip(runs, palette, strict=True):
        pts = run.series.get(panel.key)
        if not pts:
            continue
        steps = [s for s, _ in pts]
        values = [math.nan if v is None else v for _, v in pts]
        sparse = len(pts) <= 30 or panel.key.startswith(VAL_PREFIX)
        ax.plot(steps, values, label=run.label, color=colour, marker="o" if sparse else None, markersize=3)
        trend = smoothed(panel.key, [v for _, v in pts])
        if trend is not None:
            mean = [math.nan if v is None else v for v in trend]
            ax.plot(steps, mean, label=f"{run.label}: mean of {SMOOTH_WINDOW} steps", color=colour, linestyle="--")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    ax.ticklabel_format(axis="y", useOffset=False)  # 5.5543 reads as itself, not "+5.554" and offsets
    ax.set_title(panel.title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def render_pngs(runs: list[TrainingRun]) -> dict[str, bytes]:
    """Every panel's PNG, in memory: ``{"curves/<key>.png": bytes}``."""
    out = {}
    for panel in panels(runs):
        buf = io.BytesIO()
        figure(panel, runs).savefig(buf, format="png")
        out[panel.file] = buf.getvalue()
    return out


def curves_data(runs: list[TrainingRun]) -> dict[str, Any]:
    """The curves as plain JSON-able data (the HTML report draws them from this)."""
    return {
        "runs": [{"label": r.label, "path": str(r.path), "notes": r.notes} for r in runs],
        "panels": [
            {
                "key": p.key,
                "title": p.title,
                "ylabel": p.ylabel,
                "file": p.file,
                "series": [_series(p.key, r.label, pts) for r in runs if (pts := r.series.get(p.key))],
            }
            for p in panels(runs)
        ],
    }


def _series(key: str, label: str, pts: list[tuple[int, float | None]]) -> dict[str, Any]:
    out: dict[str, Any] = {"run": label, "steps": [s for s, _ in pts], "values": [v for _, v in pts]}
    trend = smoothed(key, out["values"])
    if trend is not None:
        out["smoothed"] = trend
    return out


def write_training_curves(run_dirs: list[str | Path], out_dir: str | Path) -> list[Path]:
    """Draw the training curves of ``run_dirs`` (training run folders) as PNG files under
    ``out_dir/curves/``, all runs on the same axes; returns the PNG paths in display order.

    Written all or none. Raises ``ValueError`` (not a training run, a corrupt ``metrics.jsonl``
    line: ``file:line``) or ``OSError`` naming what could not be written.
    """
    runs = load_training_runs(list(run_dirs))
    return write_all_or_none(out_dir, render_pngs(runs))
