"""Seconds per training step of a recipe, split into rollout / reward / update / sync, and tokens/s
(a benchmark, not a test). Prints one line per step and a summary; the reward curve and every
other metric are in the run's metrics.jsonl.

    .venv/bin/python scripts/perf/train_step.py --steps 3 [-c configs/train/smollm2_cpu_grpo.yaml] [key=value ...]

Or summarise a run that already happened (e.g. a long ``harness train``) from its metrics.jsonl:

    .venv/bin/python scripts/perf/train_step.py --from-metrics RUN/metrics.jsonl
"""

from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

import numpy as np

from harness.config import compose
from harness.textfiles import read_jsonl
from training.build import build_trainer
from training.config import TrainConfig

PHASES = ("rollout", "reward", "update", "sync", "step")


def line(m: dict) -> str:
    """One step's figures: phase seconds, throughputs, and what the rollouts did."""
    return (
        " ".join(f"{p}={m[f'time/{p}_s']:.2f}s" for p in PHASES)
        + f" | rollout {m['rollout_tokens_per_s']:.1f} gen tok/s, update {m['update_tokens_per_s']:.1f} tok/s"
        + f" | reward={m['reward/mean']:.3f} searches={m['searches']:.2f} response_tokens={m['response_tokens']:.1f}"
    )


def summary(rows: list[dict]) -> None:
    keys = [f"time/{p}_s" for p in PHASES] + ["rollout_tokens_per_s", "update_tokens_per_s"]
    means = {k: float(np.mean([r[k] for r in rows])) for k in keys}
    print(f"mean over {len(rows)} steps: " + " ".join(f"{k.split('/')[-1]}={v:.2f}" for k, v in means.items()))
    rewards = [r["reward/mean"] for r in rows]
    print("reward curve: " + " ".join(f"{r:.3f}" for r in rewards))
    if len(rewards) >= 10:
        print(f"mean reward, first 5 steps: {np.mean(rewards[:5]):.3f}; last 5 steps: {np.mean(rewards[-5:]):.3f}")


def main() -> None:
    here = Path(__file__).resolve()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-c", "--config", default=str(here.parents[2] / "configs" / "train" / "smollm2_cpu_grpo.yaml"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--data-dir", default=str(here.parents[3] / "shared" / "data"))
    p.add_argument("--out", default=None)
    p.add_argument("--from-metrics", default=None, help="summarise an existing run's metrics.jsonl instead")
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.from_metrics:
        rows = [r for _, r in read_jsonl(args.from_metrics, tolerant=True)]
        rows = [r for r in rows if "time/step_s" in r]
        for r in rows:
            print(f"step {r['step']}: {line(r)}")
        summary(rows)
        return

    overrides = [f"data.data_dir={args.data_dir}", f"trainer.max_steps={args.steps}", "trainer.save_every=0"]
    # No validation: a recipe that keeps its best validated step (trainer.best_metric) keeps none here.
    overrides += ["data.val_split=null", "trainer.best_metric=null", "trainer.progress=false", *args.overrides]
    cfg = compose(TrainConfig, [args.config], overrides)
    out = Path(args.out or tempfile.mkdtemp(prefix="train_step_"))
    trainer = build_trainer(cfg, out)
    rows = []
    for _ in range(args.steps):
        rows.append(trainer.step())
        print(f"step {trainer.step_no}: {line(rows[-1])}", flush=True)
    summary(rows)
    print(f"metrics: {out / 'metrics.jsonl'}")
    trainer.backend.close()


if __name__ == "__main__":
    main()
