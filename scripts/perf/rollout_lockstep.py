"""What lockstep admission costs RL rollouts, and what it buys (a benchmark, not a test).

One step's rollouts of an RL recipe (``collect``: ``rollout.prompts_per_step`` prompts ×
``n_samples``, sampled, the recipe's agent and retriever) on the in-process hf backend, run
``--rounds`` times in each mode, alternated A B B A:

- ``lockstep``: as RL runs them (:mod:`harness.backends.lockstep`): a batch is admitted only when
  every running rollout has its request waiting, in the rollouts' order;
- ``free``: whatever waits at a step boundary is admitted, in arrival order (the backend before
  lockstep; evaluation still admits this way).

Prints each run's wall seconds, decode steps and mean rows a step, and whether each mode's runs
drew the same tokens as its first run (lockstep: always; free: as timing allows).

    PYTHONPATH=. .venv/bin/python scripts/perf/rollout_lockstep.py \\
        -c configs/train/smollm2_cpu_grpo_demo.yaml model.path=SFT_MODEL
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import tempfile
import time
from pathlib import Path

from harness.backends.lockstep import Lockstep
from harness.config import compose
from training.build import build_trainer
from training.config import TrainConfig
from training.rl import rollout


def free_admission(backend: object, clients: int, concurrency: int) -> contextlib.AbstractContextManager[Lockstep]:
    """A gate the backend never sees: requests are admitted as they come."""
    return contextlib.nullcontext(Lockstep(clients, concurrency))


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--config", default=str(here.parents[2] / "configs" / "train" / "smollm2_cpu_grpo_demo.yaml"))
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--rounds", type=int, default=2, help="runs of each mode (alternated A B B A ...)")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    overrides = [f"data.data_dir={args.data_dir}", "data.val_split=null", "trainer.best_metric=null"]
    cfg = compose(TrainConfig, [args.config], [*overrides, "trainer.progress=false", *args.overrides])
    trainer = build_trainer(cfg, Path(tempfile.mkdtemp(prefix="rollout_lockstep_")))
    prompts = trainer.sampler.next(cfg.rollout.prompts_per_step)
    backend = trainer.backend
    real = rollout.lockstep_of
    order = [m for k in range(args.rounds) for m in (("lockstep", "free") if k % 2 == 0 else ("free", "lockstep"))]
    first: dict[str, list[list[int]]] = {}
    n, seed = cfg.rollout.n_samples, cfg.rollout_seed
    try:
        for mode in order:
            rollout.lockstep_of = real if mode == "lockstep" else free_admission
            steps0, toks0 = backend.steps_run, backend.tokens_generated
            t0 = time.perf_counter()
            batch = rollout.collect(trainer.agent, prompts, n, trainer.sampling, 0, seed)
            wall = time.perf_counter() - t0
            steps, toks = backend.steps_run - steps0, backend.tokens_generated - toks0
            tokens = [[t for s in tr.segments for t in (s.token_ids or [])] for tr in batch.trajectories]
            same = sum(a == b for a, b in zip(first.setdefault(mode, tokens), tokens, strict=True))
            print(
                f"{mode:8s} {wall:7.1f} s  {steps:5d} decode steps  {toks / max(steps, 1):5.1f} rows a step  "
                f"{same}/{len(tokens)} rollouts as this mode's first run",
                flush=True,
            )
    finally:
        rollout.lockstep_of = real
        backend.close()


if __name__ == "__main__":
    main()
