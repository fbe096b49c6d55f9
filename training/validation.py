"""Validation through the eval path: a trainer's periodic greedy evaluation on ``data.val_split``.

:func:`build_validation` builds it as ``harness eval`` builds a run (the split's own corpus, the
agent's options at temperature 0) with the trainer's own backend, and :class:`Validation` runs it
into ``RUN/validation/step-N/``. What is evaluated is an eval config's method, agent, retriever
and backend blocks: by default the RL policy's rollout agent (:func:`policy_run`); retriever RL
hands its own (the frozen generator searching with the tower,
``training.retriever.retriever_rl.validated_run``) with the retriever it trains.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.build import build_eval
from benchmarks.evaluate import evaluate
from harness.backends.base import Backend
from harness.config import from_dict, to_dict
from harness.eval_config import EvalConfig
from harness.run_records import RunManifest, RunResults
from harness.types import Example
from pipelines.method import Method
from training.config import TrainConfig
from training.examples import first_dataset


@dataclass
class Validation:
    """Greedy evaluation of the current policy on the validation split, through ``evaluate``."""

    method: Method
    examples: list[Example]
    manifest: RunManifest
    metrics: tuple[str, ...]
    out: Path

    def __call__(self, step: int) -> RunResults:
        manifest = replace(self.manifest, model=f"{self.manifest.model}@step-{step}", extra=dict(self.manifest.extra))
        name = f"{manifest.method}-{manifest.dataset}-{manifest.split}"
        return evaluate(self.method, self.examples, self.out / f"step-{step}" / name, self.metrics, manifest)


def build_validation(
    cfg: TrainConfig, backend: Backend | None, out: Path, run: dict[str, Any] | None = None, retriever: Any = None
) -> Validation | None:
    """The validation of ``data.val_split`` (None without one), built like ``harness eval``
    builds a run: the split's own corpus, the rollout agent's options at temperature 0.
    ``run``: the eval config's method, agent, retriever and backend blocks (default: the RL
    policy's, :func:`policy_run`); ``retriever``: one already built to search with instead."""
    d = cfg.data
    if not d.val_split:
        return None
    ecfg = from_dict(
        EvalConfig,
        {
            **(policy_run(cfg) if run is None else run),
            "dataset": {"name": first_dataset(cfg), "split": d.val_split, "limit": d.val_limit, "data_dir": d.data_dir},
            "out": str(out / "validation"),
        },
        where="validation",
    )
    best = cfg.trainer.best_metric
    if best is not None and best not in ecfg.metrics:
        raise ValueError(f"trainer.best_metric={best!r} is not a validation metric (it reports {list(ecfg.metrics)})")
    built = build_eval(ecfg, backend=backend, retriever=retriever)
    return Validation(built.method, built.examples, built.manifest, tuple(ecfg.metrics), out / "validation")


def policy_run(cfg: TrainConfig) -> dict[str, Any]:
    """What an RL validation evaluates: the rollout agent, greedy, on the policy's backend and the
    recipe's retriever (an eval config's method, agent, retriever and backend blocks)."""
    return {
        "method": cfg.rollout.method,
        "retriever": to_dict(cfg.retriever),
        "backend": {"kind": cfg.rollout.backend.kind, "model": cfg.model.path},
        "agent": rollout_agent_options(cfg, validation=True),
    }


def rollout_agent_options(cfg: TrainConfig, validation: bool = False) -> dict[str, object]:
    """The agent options RL rollouts build the agent with: ``rollout.agent`` (validated when the
    recipe loaded) in the dialect's training mode (unless ``rollout.agent.mode`` says another),
    with ``rollout.sampling``'s temperature, top_p and max_new_tokens, the values the trainer
    samples with. The agent's own seed is left at its default: every rollout gets its seed from
    ``TrainConfig.rollout_seed``. ``validation``: the validation agent's instead, greedy in the
    dialect's default mode, with the same turn length. The recipe test resolves the effective
    agent from it."""
    s, options = cfg.rollout.sampling, to_dict(cfg.rollout.agent)
    if validation:
        return {**options, "max_new_tokens": s.max_new_tokens, "temperature": 0.0}
    mode = options["mode"] or "train"
    return {**options, "mode": mode, "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p}
