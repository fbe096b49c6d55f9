"""Divergence: a non-finite loss or gradient never reaches the weights, and a run that keeps
producing them stops. Every trainer (RL, SFT, PRM, retriever RL) goes through these pieces.

- :func:`poisoned`: the loss a trainer back-propagates. A non-finite loss is turned into a NaN
  one, so its gradients are NaN everywhere and the optimizer step that follows is skipped by the
  same check that catches a non-finite gradient (a loss that is NaN through a detached term could
  otherwise leave finite gradients).
- The skip itself is the engine's: DeepSpeed's bf16, fp16 and ZeRO optimizers skip a step whose
  gradient norm is not finite (no weight, moment or LR-schedule change; ``engine.skipped_steps``
  counts it), and for the plain fp32 stage-0 case :class:`training.engine.FiniteAdamW` reports the
  same overflow. So a skipped step is the same on every engine configuration, and ranks agree
  (gradients are all-reduced before the check). :func:`update_applied` reads the outcome.
- :class:`NonFiniteGuard` counts the training steps with a skipped update; ``max_in_row`` of them
  in a row raise :class:`DivergenceError` naming the step (``trainer.max_nonfinite_steps``).
- :func:`check_finite`: checkpoints and exports call it on the weights they are about to write,
  so a non-finite tensor never lands on disk and pruning never trades a finite checkpoint for one;
  and no periodic checkpoint is taken during a run of skipped steps
  (:meth:`NonFiniteGuard.may_checkpoint`), whose weights gave the non-finite loss.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # deferred at run time: optional extra (harness[train])
    from deepspeed import DeepSpeedEngine

logger = logging.getLogger(__name__)


class DivergenceError(RuntimeError):
    """The run diverged (non-finite steps in a row, or non-finite weights); the message says where."""


def is_finite(x: float | torch.Tensor) -> bool:
    """Whether a scalar (a float or a one-element tensor) is finite."""
    if isinstance(x, torch.Tensor):
        return bool(torch.isfinite(x.detach()).all())
    return bool(torch.isfinite(torch.tensor(float(x))))


def poisoned(loss: torch.Tensor) -> torch.Tensor:
    """``loss`` itself when finite; else a NaN loss on the same graph (see the module docstring)."""
    if is_finite(loss):
        return loss
    return loss * float("nan")


def update_applied(engine: DeepSpeedEngine) -> bool:
    """Whether the engine's latest optimizer step changed the weights (False: skipped as non-finite)."""
    return bool(engine.was_step_applied())


def check_finite(weights: Mapping[str, torch.Tensor], where: str) -> None:
    """Raise :class:`DivergenceError` naming the first tensor of ``weights`` with a NaN or inf."""
    for name, t in weights.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise DivergenceError(f"{where}: weight {name} is not finite (NaN or inf)")


class NonFiniteGuard:
    """Counts training steps whose update was skipped for a non-finite loss or gradient.

    :meth:`record` after each step gives its metrics; :meth:`stop_if_diverged` (after the step is
    logged) raises :class:`DivergenceError` once ``max_in_row`` steps in a row had a skip (0: never
    stops; the skips still happen). Its counts are part of a checkpoint's state (:meth:`state`),
    the run's first non-finite step (``first``) included: the newest checkpoint before it is never
    pruned (:func:`training.checkpoint.save_and_prune`). ``advice(first)``: what the divergence
    message says to do (a trainer with checkpoints names that checkpoint:
    :func:`training.checkpoint.divergence_advice`)."""

    def __init__(self, max_in_row: int, advice: Callable[[int | None], str] | None = None) -> None:
        self.max_in_row = max_in_row
        self.in_row = 0  # consecutive steps with a skipped update
        self.total = 0  # steps with a skipped update, this run
        self.first: int | None = None  # the run's first step with a skipped update
        self.last_step = 0
        self.advice = advice or (lambda first: "Train again with a lower optim.lr (or optim.grad_clip)")

    def record(self, step: int, skipped_updates: int) -> dict[str, float]:
        """Count step ``step`` (``skipped_updates``: its optimizer steps skipped); returns its metrics."""
        self.last_step = step
        if skipped_updates:
            self.in_row += 1
            self.total += 1
            self.first = step if self.first is None else self.first
        else:
            self.in_row = 0
        return {"nonfinite/skipped_updates": float(skipped_updates), "nonfinite/steps_total": float(self.total)}

    def may_checkpoint(self) -> bool:
        """False while the latest steps skipped their updates: the weights are those the streak
        began with, which gave a non-finite loss, so a periodic checkpoint of them would only push
        a good one out of ``trainer.keep_checkpoints``; the previous checkpoint stays the newest."""
        if self.in_row:
            logger.warning(
                "step %d: no checkpoint (the last %d step(s) had a non-finite loss or gradient)",
                self.last_step,
                self.in_row,
            )
        return not self.in_row

    def stop_if_diverged(self) -> None:
        if self.max_in_row and self.in_row >= self.max_in_row:
            first = self.last_step - self.in_row + 1
            raise DivergenceError(
                f"diverged at step {self.last_step}: steps {first} to {self.last_step} all had a non-finite loss or "
                f"gradient (their updates were skipped; trainer.max_nonfinite_steps={self.max_in_row}). "
                + self.advice(self.first)
            )

    def state(self) -> dict[str, int | None]:
        return {"in_row": self.in_row, "total": self.total, "first": self.first}

    def load(self, state: Mapping[str, int | None] | None) -> None:
        """Counts from a checkpoint's state (none in checkpoints written before this guard)."""
        state = state or {}
        self.in_row, self.total = int(state.get("in_row") or 0), int(state.get("total") or 0)
        self.first = None if state.get("first") is None else int(state["first"])
