"""``harness train -c configs/train/NAME.yaml [--data-dir DIR] [--out DIR] [--resume RUN_DIR] [key=value ...]``
(or ``harness train --stages CHAIN.yaml [--out WORKDIR]``: a stage chain, see ``harness stages``)

Composes the recipe, starts an engine when ``rollout.backend.launch`` asks for one, and hands
the rest to ``training.build.build_trainer`` (backend, retriever, agent, examples, validation).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import typer

from harness.cli.common import console, fail, start_engine

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
    overrides: list[str] = typer.Argument(None, help="key.path=value overrides, e.g. trainer.max_steps=2"),
) -> None:
    """Train the search agent with a recipe; see the module docstring."""
    if stages:
        from harness.cli import stages_cmd

        if config or resume or overrides:
            fail("--stages runs a chain file: give it alone (with --out as the chain's workdir)")
        return stages_cmd.run_command(stages, workdir=out, sets=None, dry_run=False)
    from harness.cli import harr_cmd  # `policy: retriever`: HARR's retriever RL, generator frozen
    from training.retriever_config import is_retriever_policy

    if not resume and is_retriever_policy(config, overrides):
        return harr_cmd.train_retriever(list(config), data_dir, out, list(overrides or []))
    from harness.config import ConfigError, compose
    from training.config import TrainConfig

    if not config and not resume:
        fail("give a recipe with -c configs/train/NAME.yaml (or --resume RUN_DIR)")
    extra = list(overrides or [])
    if data_dir:
        extra.append(f"data.data_dir={data_dir}")
    try:
        files = list(config or [])
        if resume and not files:  # the run remembers its recipe
            files = [str(Path(resume) / "config.json")]
        cfg = compose(TrainConfig, files, extra)
    except (ConfigError, FileNotFoundError) as e:
        fail(str(e))
    run = Path(resume or out or Path(cfg.trainer.out) / cfg.name)
    if resume and overwrite:
        fail("--resume continues a run and --overwrite deletes it: give one of them")
    if resume and not (run / "checkpoints").is_dir():
        fail(f"--resume {run}: no checkpoints/ folder there")
    if not resume:
        _claim_run_folder(run, overwrite)
    import contextlib
    from dataclasses import replace

    from harness.engines import sigterm_as_exit
    from training.build import build_trainer, rollout_engine

    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(sigterm_as_exit())
            b = cfg.rollout.backend
            if b.launch:
                from training.trainer import mini_batch_rows

                # The update schedule is checked before an engine takes a minute to start.
                mini_batch_rows(cfg, int(os.environ.get("WORLD_SIZE", "1")))
                if int(os.environ.get("WORLD_SIZE", "1")) > 1:
                    # Every rank would start its own engine; one shared server is what RL needs.
                    raise ValueError(
                        "rollout.backend.launch=true starts one engine from a single-process run; with several "
                        "ranks start it once with `harness serve model --engine sglang` and set rollout.backend.url"
                    )
                engine, engine_cfg = rollout_engine(cfg)
                proc = start_engine(stack, engine, cfg.model.path, engine_cfg, run)
                cfg = replace(cfg, rollout=replace(cfg.rollout, backend=replace(b, url=[proc.url])))
            trainer = build_trainer(cfg, run)
            if resume:
                trainer.resume(run)
            final = trainer.train()
    except (ValueError, FileNotFoundError, RuntimeError, KeyError) as e:  # EngineError is a RuntimeError
        fail(f"{type(e).__name__}: {e}")
    if cfg.algo.kind == "prm":  # a reward model, not a policy: it scores steps, it is not evaluated
        use = f"score steps with algo.step_scorer_path={final} (step_scorer: prm) or harness serve prm --path {final}"
    else:
        use = f"eval it with harness eval --model {final}"
    console.print(f"trained {trainer.step_no} steps → {run} (model: {final}; {use})")


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
