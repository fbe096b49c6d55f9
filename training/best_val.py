"""Model selection on the validation split (``trainer.best_metric``): the run's ``final/`` holds
the weights of the validation step that scored highest, not the last step's, as Hugging Face
Trainer's ``load_best_model_at_end`` with ``metric_for_best_model`` does.

Each validation that beats every earlier one (strictly: the earliest step wins a tie, so a run
that never improves on its starting policy ends with that policy) exports the policy into
``best-step-N/``. At the end ``final/`` is made of the chosen folder's files (hard links) and the
other folders go.

Exact on a resume: the best so far is read back from the run's own ``metrics.jsonl`` (its
``val/<metric>`` records up to the resumed step; the steps after it run again and are validated
again), and its folder must still be there. A checkpoint prunes the folders of steps before the
best so far: a resume continues from that checkpoint or a later one.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from harness import safe_delete
from harness.fsutil import atomic_dir
from harness.textfiles import read_jsonl
from training.weight_sync import barrier

logger = logging.getLogger(__name__)

_DIR = re.compile(r"^best-step-(\d+)$")


def best_dir(out: Path, step: int) -> Path:
    """Where the policy of validation step ``step`` is kept while it is the best so far."""
    return Path(out) / f"best-step-{step}"


# Validation metrics where lower is better (HF's greater_is_better=False): SFT's held-out loss.
LOWER_IS_BETTER = frozenset({"loss"})


@dataclass
class BestValidation:
    """The best validation so far of one run: ``metric`` (a key of the validation's metrics, such
    as ``em``; higher is better, lower for :data:`LOWER_IS_BETTER`), its ``value`` and ``step``
    (None before the first)."""

    metric: str
    value: float | None = None
    step: int | None = None
    kind: str = "model"  # what a kept folder is (its safe_delete marker): retriever RL keeps "encoder"s

    def consider(self, metrics: dict, step: int) -> bool:
        """Whether validation ``metrics`` of ``step`` beat the best so far (then they are the best).
        A metric the validation does not report is a ValueError naming what it does report."""
        if self.metric not in metrics:
            have = sorted(k for k, v in metrics.items() if isinstance(v, int | float))
            raise ValueError(f"trainer.best_metric={self.metric!r} is not a validation metric (it reports {have})")
        value = float(metrics[self.metric])
        lower = self.metric in LOWER_IS_BETTER
        if self.value is not None and (value >= self.value if lower else value <= self.value):
            return False
        self.value, self.step = value, step
        return True

    @classmethod
    def from_log(cls, metric: str, log_path: Path, upto: int, kind: str = "model") -> BestValidation:
        """The best of the ``val/<metric>`` records of a run's ``metrics.jsonl`` up to step ``upto``
        (the run a resume continues), chosen as :meth:`consider` chooses (in step order)."""
        best = cls(metric, kind=kind)
        key = f"val/{metric}"
        records: list[tuple[int, float]] = []
        if Path(log_path).exists():  # a torn last line (a kill mid-write) is dropped, as a resume drops it
            for _, rec in read_jsonl(log_path, tolerant=True):
                if key in rec and rec.get("step", upto + 1) <= upto:
                    records.append((int(rec["step"]), float(rec[key])))
        for step, value in sorted(records, key=lambda r: r[0]):
            best.consider({metric: value}, step)
        return best

    def prune(self, out: Path, keep_later: bool = True) -> None:
        """Remove the ``best-step-N/`` folders of ``out`` this run no longer needs: those before the
        best (all but the best's with ``keep_later=False``). Only folders harness marked as models."""
        for path in sorted(Path(out).glob("best-step-*")):
            m = _DIR.match(path.name)
            if m is None or int(m.group(1)) == self.step:
                continue
            if keep_later and (self.step is None or int(m.group(1)) > self.step):
                continue
            safe_delete.remove(path, kind=self.kind, why=f"not the best validation (step {self.step})")

    def to_final(self, out: Path, final: Path) -> Path:
        """Make ``final`` a copy of the best step's folder, by hard links (no second copy of the
        weights; a copy where the filesystem has none); the other ``best-step-N/`` folders go. The
        best's own stays: a resume with more steps may still choose it. A missing best folder is
        a FileNotFoundError."""
        src = best_dir(out, self.step)  # type: ignore[arg-type]
        if not src.is_dir():
            raise FileNotFoundError(
                f"trainer.best_metric: the weights of the best validation (step {self.step}) are not in {src}"
            )
        with atomic_dir(final, kind=self.kind) as tmp:
            for f in src.iterdir():
                if f.is_dir():  # a LoRA tower's adapter/ beside its merged weights
                    shutil.copytree(f, tmp / f.name, copy_function=_link)
                elif f.is_file() and not safe_delete.bookkeeping(f.name):
                    _link(f, tmp / f.name)
        self.prune(out, keep_later=False)
        what = f"val/{self.metric} {self.value:.4f}" if self.value is not None else "its record"
        logger.info("final model: step %d's weights, the best validation (%s) → %s", self.step, what, final)
        return final


def _link(src: Path | str, dst: Path | str) -> None:
    """``dst`` a hard link of ``src`` (a copy where the filesystem has none)."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def from_rank0(value: int) -> int:
    """Rank 0's ``value`` on every rank (a broadcast; the value itself without distributed)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    nccl = torch.distributed.get_backend() == "nccl"  # NCCL broadcasts device tensors only
    flag = torch.tensor([value], device=torch.cuda.current_device() if nccl else "cpu")
    torch.distributed.broadcast(flag, src=0)
    return int(flag.item())


@dataclass
class BestSelection:
    """``trainer.best_metric`` for one trainer, composed into it (RL, SFT, PRM): each validation
    that beats the earlier ones is exported by ``export(folder)`` (every rank calls it: an export
    may be collective) into ``best-step-N/``; :meth:`finish` makes ``final/`` of the best one. Rank 0
    decides and every rank learns the verdict."""

    best: BestValidation
    out: Path
    rank: int = 0

    def keep_if_best(self, val: dict, step: int, export: Callable[[Path], object], log: object = None) -> None:
        """Export the weights of ``step`` when its validation ``val`` (rank 0's) is the best so far;
        logs ``val/best_step``."""
        better = from_rank0(int(self.best.consider(val, step)) if self.rank == 0 else 0)
        if better:
            self.best.step = step
            export(best_dir(self.out, step))
        if log is not None and self.best.step is not None:
            log.write(step, {"val/best_step": float(self.best.step)})

    def restore(self, step_no: int) -> None:
        """On a resume: the best validation up to ``step_no`` from rank 0's metrics log (its records
        after that step are dropped when the run starts: those steps run again); its
        ``best-step-N/`` must still be there."""
        step, missing = -1, 0  # -1: no validation yet
        if self.rank == 0:
            self.best = BestValidation.from_log(self.best.metric, self.out / "metrics.jsonl", step_no, self.best.kind)
            if self.best.step is not None:
                step, missing = self.best.step, int(not best_dir(self.out, self.best.step).is_dir())
        step, missing = from_rank0(step), from_rank0(missing)  # every rank stops, not rank 0 alone
        if missing:
            raise FileNotFoundError(
                f"resuming with trainer.best_metric={self.best.metric!r}: the best validation so far "
                f"(step {step}) has no weights in {best_dir(self.out, step)}"
            )
        self.best.step = None if step < 0 else step

    @property
    def step(self) -> int | None:
        """The best validation's step (None before the first)."""
        return self.best.step

    @property
    def chosen(self) -> bool:
        """Whether a validation chose weights (else the last step's are the final ones)."""
        return self.best.step is not None

    def prune(self) -> None:
        """Rank 0 removes the ``best-step-N/`` folders before the best (a checkpoint was written)."""
        if self.rank == 0:
            self.best.prune(self.out)

    def finish(self, final: Path) -> Path:
        """``final/`` made of the best validation's weights (rank 0), all ranks waiting for it."""
        if self.rank == 0:
            self.best.to_final(self.out, final)
        barrier()
        return final


def write_final(best: BestSelection | None, export: Callable[[Path], Path], out: Path) -> Path:
    """``out/final``: the validated step that ``trainer.best_metric`` chose, else the policy as it
    is now (``export`` writes it into the folder it is given)."""
    if best is not None and best.chosen:
        return best.finish(out / "final")
    return export(out / "final")
