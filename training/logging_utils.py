"""Training logs: per-step metrics to JSONL, TensorBoard and W&B; per-sample rollouts; a progress bar.

- ``metrics.jsonl``: one record per step (and one per validation), flushed as written, schema
  versioned, so a crashed run still has every finished step.
- ``tensorboard/``: the same scalars (``torch.utils.tensorboard``), when tensorboard is installed.
- W&B: when ``trainer.wandb_project`` is set and ``wandb`` is installed (never a hard dependency).
- ``rollouts.jsonl``: every rollout trajectory with its reward and step (per-sample records
  first, aggregation later: the run can be re-scored without re-running).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from benchmarks.evaluate import score_trajectory
from harness.config import to_dict
from harness.memory import resident_kb
from harness.textfiles import parse_json_line
from harness.types import Trajectory
from pipelines.dialects import get_dialect
from training.health import health_metrics

if TYPE_CHECKING:
    from training.config import TrainConfig

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1


class MetricsLog:
    """Per-step scalars to ``metrics.jsonl`` (flushed per record), TensorBoard and W&B."""

    def __init__(
        self, out: Path, tensorboard: bool = True, wandb_project: str | None = None, config: dict | None = None
    ):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / "metrics.jsonl"
        self.rollouts_path = out / "rollouts.jsonl"
        self.tb: Any = None
        self.wandb: Any = None
        if tensorboard:
            try:  # deferred: optional (tensorboard, harness[train]), and it imports torch
                from torch.utils.tensorboard import SummaryWriter

                self.tb = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                logger.warning("tensorboard is not installed (pip install tensorboard); metrics go to JSONL only")
        if wandb_project:
            try:  # deferred: optional, not a dependency
                import wandb

                self.wandb = wandb.init(project=wandb_project, config=config or {}, dir=str(out), resume="allow")
            except ImportError:
                logger.warning("wandb is not installed (pip install wandb); not logging to W&B")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """One record: JSONL first (the source of truth), then the dashboards."""
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"schema": SCHEMA_VERSION, "step": step, **metrics}) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def truncate(self, step: int) -> int:
        """Drop every record after ``step`` (a resume from that step's checkpoint); returns how many.

        The steps after the checkpoint are run again, so without this they would be logged twice.
        ``metrics.jsonl`` and ``rollouts.jsonl`` are rewritten atomically; a torn last line (a kill
        mid-write) goes too. TensorBoard events after ``step`` are purged when the writer reopens.
        """
        dropped = sum(_truncate_jsonl(p, step) for p in (self.path, self.rollouts_path))
        if self.tb is not None:
            # deferred: optional extra (harness[train])
            from torch.utils.tensorboard import SummaryWriter

            logdir = self.tb.get_logdir()
            self.tb.close()
            self.tb = SummaryWriter(logdir, purge_step=step + 1)
        if dropped:
            logger.info("resume at step %d: dropped %d log records of later steps", step, dropped)
        return dropped

    def write_rollouts(
        self, step: int, trajectories: list[Trajectory], rewards: list[float], group_ids: list[int]
    ) -> None:
        """Every trajectory of a step, with its reward and group, appended to ``rollouts.jsonl``."""
        with open(self.rollouts_path, "a", encoding="utf-8") as f:
            for t, r, g in zip(trajectories, rewards, group_ids, strict=True):
                record = {"step": step, "reward": r, "group": g, "trajectory": t.to_dict()}
                f.write(json.dumps(record, ensure_ascii=False, default=str) + "\n")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def open_run_records(out: Path, cfg: TrainConfig, resumed_step: int | None = None) -> MetricsLog:
    """A trainer's run records, opened when the run starts (its first step): ``config.json`` and
    the :class:`MetricsLog`. Not earlier: a run that fails to build or to resume (every checkpoint
    damaged, a foreign folder) leaves the records of the run it was meant to continue as they were.
    ``resumed_step``: the step a resume restored; log records after it are dropped (those steps run
    again and are logged once)."""
    config = to_dict(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    t = cfg.trainer
    log = MetricsLog(out, t.tensorboard, t.wandb_project, config)
    if resumed_step is not None:
        log.truncate(resumed_step)
    return log


def _truncate_jsonl(path: Path, step: int) -> int:
    """Keep the records of ``path`` with ``step`` <= ``step``; returns how many were dropped."""
    if not path.exists():
        return 0
    kept: list[str] = []
    dropped = 0
    for i, line in enumerate(path.read_bytes().decode("utf-8", errors="replace").splitlines(), 1):
        try:
            record = parse_json_line(line, f"{path}:{i}", objects=False)
        except ValueError:  # a torn line from a kill mid-write
            dropped += 1
            continue
        if isinstance(record, dict) and record.get("step", 0) > step:
            dropped += 1
            continue
        kept.append(line)
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def rollout_metrics(
    trajectories: list[Trajectory], rewards: list[float], parts: list[dict[str, float]], dialect: str
) -> dict[str, float]:
    """What the rollouts of a step did: reward, EM/F1, format validity, searches, lengths, and
    their health (``health/*``: :func:`training.health.health_metrics`).

    EM/F1 are the item scores ``harness eval`` writes (``benchmarks.evaluate.score_trajectory``),
    whatever the training reward is, so runs with different rewards stay comparable.
    """
    d = get_dialect(dialect)
    scores = [score_trajectory(t, ("em", "f1")) for t in trajectories]
    out = {
        "reward/mean": float(np.mean(rewards)),
        "reward/std": float(np.std(rewards)),
        "em": float(np.mean([s.metric("em") or 0.0 for s in scores])),
        "f1": float(np.mean([s.metric("f1") or 0.0 for s in scores])),
        "format_valid": float(np.mean([bool(d.validate_format(t.response_text)[0]) for t in trajectories])),
        "searches": float(np.mean([len(t.searches) for t in trajectories])),
        "response_tokens": float(np.mean([t.generated_tokens for t in trajectories])),
        "errors": float(sum(1 for t in trajectories if t.error)),
        **health_metrics(trajectories, d),
    }
    for key in sorted({k for p in parts for k in p}):  # the reward's own components
        out[f"reward/{key}"] = float(np.mean([p.get(key, 0.0) for p in parts]))
    return out


class ProgressBar:
    """A rich progress bar over training steps (transient; the JSONL log is the record)."""

    def __init__(self, total: int, completed: int = 0, enabled: bool = True) -> None:
        self.total, self.completed, self.enabled = total, completed, enabled
        self._progress: Any = None

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn()
            )
            self._progress.start()
            self._task = self._progress.add_task("training", total=self.total, completed=self.completed)
        return self

    def update(self, step: int, metrics: dict[str, float]) -> None:
        # SFT and PRM steps have no reward: "reward 0.000" would read as a measured zero
        reward = f" reward {metrics['reward/mean']:.3f}" if "reward/mean" in metrics else ""
        desc = f"step {step}{reward} loss {metrics.get('loss', 0.0):.4f}"
        logger.info("%s (%.1fs)", desc, metrics.get("time/step_s", 0.0))
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=desc)

    def __exit__(self, *exc: Any) -> None:
        if self._progress is not None:
            self._progress.stop()


def memory_metrics() -> dict[str, float]:
    """This process's resident memory now and at its peak, in GB (Linux ``/proc``; empty elsewhere)."""
    kb = resident_kb()
    names = {"rss": "mem/rss_gb", "peak": "mem/peak_rss_gb"}
    return {names[k]: v / 2**20 for k, v in kb.items()}
