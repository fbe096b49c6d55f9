"""``harness train -c configs/train/NAME.yaml [--data-dir DIR] [--out DIR] [--resume RUN_DIR] [key=value ...]``
(or ``harness train --plan -c RECIPE [--gpus N --gpu-mem GB]``: the per-GPU memory plan, see
``training.memory_plan``)
(or ``harness train --stages CHAIN.yaml [--out WORKDIR]``: a stage chain, see ``harness stages``)

One entry for every trainer: ``algo.kind`` (rl, sft, prm, retriever) picks it from
``training.build.TRAINERS``, and :func:`training.build.train` runs it (starting an engine when
``rollout.backend.launch`` asks for one).
"""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from harness.cli.common import console, fail

logger = logging.getLogger(__name__)


def train_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="Training recipe YAML (configs/train/...)."),
    data_dir: str = typer.Option(None, "--data-dir", help="FlashRAG-layout data dir."),
    out: str = typer.Option(None, "--out", help="Run folder (default trainer.out/name)."),
    resume: str = typer.Option(None, "--resume", help="A training run folder to continue from its last checkpoint."),
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Delete what a non-empty run folder holds (a previous run) and start afresh."
    ),
    stages: str = typer.Option(
        None, "--stages", help="Run a stage chain (configs/train/prorag/chain.yaml) as `harness stages run` does."
    ),
    plan: bool = typer.Option(
        False, "--plan", help="Print the per-GPU memory plan of the recipe (no weights loaded) and exit."
    ),
    gpus: int = typer.Option(8, "--gpus", help="--plan: data-parallel GPUs."),
    gpu_mem: float = typer.Option(80.0, "--gpu-mem", help="--plan: memory of one GPU, GB."),
    arch: str = typer.Option(None, "--arch", help="--plan: architecture (shipped name or config.json) to plan with."),
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. trainer.max_steps=2"),
) -> None:
    """Train with a recipe; see the module docstring."""
    if plan:
        from harness.config import ConfigError
        from training.memory_plan import plan_report

        if not config:
            fail("--plan needs a recipe: -c configs/train/NAME.yaml")
        try:
            console.print(
                plan_report(list(config), list(overrides or []), gpus, gpu_mem, arch), highlight=False, soft_wrap=True
            )
        except (ConfigError, FileNotFoundError, ValueError) as e:
            fail(f"--plan: {e}")
        return
    if stages:
        from harness.cli import stages_cmd

        if config or resume or overrides:
            fail("--stages runs a chain file: give it alone (with --out as the chain's workdir)")
        return stages_cmd.run_command(stages, workdir=out, sets=None, dry_run=False)
    from harness.config import ConfigError
    from training.build import next_step, run_folder, train, train_config

    if not config and not resume:
        fail("give a recipe with -c configs/train/NAME.yaml (or --resume RUN_DIR)")
    try:
        cfg = train_config(list(config or []), list(overrides or []), data_dir, resume)
    except (ConfigError, FileNotFoundError) as e:
        fail(str(e))
    run = run_folder(cfg, out, resume)
    if resume and overwrite:
        fail("--resume continues a run and --overwrite deletes it: give one of them")
    if resume and not (run / "checkpoints").is_dir():
        fail(f"--resume {run}: no checkpoints/ folder there")
    if not resume:
        _claim_run_folder(run, overwrite)
    try:
        trainer, final = train(cfg, run, resume=bool(resume), say=lambda m: console.print(m, highlight=False))
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as e:  # EngineError is a RuntimeError
        fail(f"{type(e).__name__}: {e}")
    console.print(f"trained {trainer.step_no} steps → {run} (model: {final}; {next_step(cfg, final)})")


# What a training run writes into its folder: --overwrite deletes only folders that hold these.
_RUN_MARKERS = ("config.json", "metrics.jsonl", "checkpoints", "final", "rollouts.jsonl")


def _claim_run_folder(run: Path, overwrite: bool) -> None:
    """A fresh run needs an empty (or new) folder: two runs in one folder mix their logs,
    checkpoints and final model. ``--overwrite`` empties a previous training run's folder."""
    import shutil

    if not run.exists():
        return
    if not run.is_dir():
        fail(f"run folder {run} is a file")
    held = sorted(p.name for p in run.iterdir())
    if not held:
        return
    if not overwrite:
        fail(
            f"run folder {run} is not empty ({', '.join(held[:5])}{', ...' if len(held) > 5 else ''}): "
            f"continue it with --resume {run}, replace it with --overwrite, or pick another --out"
        )
    if not any(m in held for m in _RUN_MARKERS):
        fail(
            f"--overwrite: {run} does not look like a training run folder "
            f"(none of {', '.join(_RUN_MARKERS)}); not deleting it"
        )
    logger.warning("--overwrite: deleting the previous run in %s", run)
    for p in run.iterdir():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
