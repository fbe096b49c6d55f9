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
import math

import typer

from cli.common import console, error_text, fail
from cli.options import DataDir

logger = logging.getLogger(__name__)

# OS errors of a folder that cannot be written: read-only, full, no permission, over quota.


def train_command(
    config: list[str] = typer.Option(None, "-c", "--config", help="Training recipe YAML (configs/train/...)."),
    data_dir: DataDir = None,
    out: str = typer.Option(None, "--out", help="Run folder (default trainer.out/name)."),
    resume: str = typer.Option(None, "--resume", help="A training run folder to continue from its last checkpoint."),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Delete a previous training run in --out (only a folder harness made, holding only what it wrote).",
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
        # deferred: the command's library loads when it runs, not at every harness --help
        from harness.config import ConfigError
        from training.memory_plan import plan_recipe, plan_report

        if not config:
            fail("--plan needs a recipe: -c configs/train/NAME.yaml")
        if gpus < 1:
            fail(f"--gpus must be at least 1 (the data-parallel GPUs to plan for), got {gpus}")
        if not (math.isfinite(gpu_mem) and gpu_mem > 0):
            fail(f"--gpu-mem must be a positive number of GB (one GPU's memory), got {gpu_mem}")
        try:
            plans = plan_recipe(list(config), list(overrides or []), gpus, gpu_mem, arch)
            console.print(plan_report(plans, config[0]), highlight=False, soft_wrap=True)
        except (ConfigError, FileNotFoundError, ValueError) as e:
            fail(f"--plan: {e}")
        return
    if stages:
        # deferred: the command's library loads when it runs, not at every harness --help
        from cli import stages_cmd

        if config or resume or overrides:
            fail("--stages runs a chain file: give it alone (with --out as the chain's workdir)")
        return stages_cmd.run_command(stages, workdir=out, sets=None, dry_run=False)
    # deferred: the command's library loads when it runs, not at every harness --help
    from harness.config import ConfigError
    from training.build import next_step, run_folder, train, train_config
    from training.divergence import DivergenceError

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
    try:
        trainer, final = train(
            cfg, run, resume=bool(resume), say=lambda m: console.print(m, highlight=False), overwrite=overwrite
        )
    except DivergenceError as e:  # the run itself failed (exit 1), not its input (exit 2)
        fail(str(e), code=1)
    except (OSError, ValueError, RuntimeError, KeyError) as e:  # EngineError, RunLockedError: RuntimeErrors
        if isinstance(e, OSError) and e.filename is None and str(run) not in str(e):
            # A write that failed after its open (a full disk) names no file: the run folder it went to.
            fail(f"cannot write into {run}: {e.strerror or e}; free some space, then --resume {run} continues it")
        fail(error_text(e))
    console.print(f"trained {trainer.step_no} steps → {run} (model: {final}; {next_step(cfg, final)})")
