"""Seconds a learned PRM adds to one RL step of the ProRAG recipe (a benchmark, not a test; issue 21).

The PRM is SmolLM2-sized: the embedded SmolLM2-135M body with a scalar head (``ValueHead``), the
head untrained (no trained PRM ships with the repository; the cost does not depend on the head's
values). A step's rollouts are synthetic trajectories of ``configs/train/prorag/cpu_rl.yaml``'s shape
by default: ``--rollouts`` trajectories, each a ``--prompt``-token prompt then ``--turns`` model turns of
``--turn`` tokens with ``--obs``-token observations between them. Every turn is scored on its prefix +
step (ProRAG's step reward), as ``PRMStepScorer`` does:

- ``per-trajectory``: the pre-issue-21 path, one ``score_steps`` call per trajectory;
- ``batched``: :meth:`training.prm.prm_scorer.PRMStepScorer.score_many`, the step's turns together in
  length-sorted batches of ``--batch``.

Alternates A B B A; prints seconds per RL step for each.

    .venv/bin/python scripts/perf/prm_scoring.py [--rollouts 8] [--turns 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from harness.models import load_tokenizer, resolve_model
from harness.types import Segment, Trajectory
from training.config import ModelConfig


def trajectories(n: int, prompt: int, turns: int, turn: int, obs: int, vocab: int) -> list:
    rng = np.random.default_rng(0)
    out = []
    for k in range(n):
        t = Trajectory(f"q{k}", "?", ["x"], "prorag")
        segs = [Segment("prompt", rng.integers(0, vocab, prompt).tolist())]
        for j in range(turns):
            segs.append(Segment("model", rng.integers(0, vocab, turn).tolist(), "s</step>\n<subquery>q</subquery>"))
            if j < turns - 1:
                segs.append(Segment("observation", rng.integers(0, vocab, obs).tolist(), "\n<retrieval>d</retrieval>"))
        t.segments = segs
        out.append(t)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rollouts", type=int, default=8, help="rollouts per RL step (cpu_rl: 2 prompts × 4)")
    p.add_argument("--prompt", type=int, default=200)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--turn", type=int, default=64, help="tokens per model turn (cpu_rl: max_new_tokens 64)")
    p.add_argument("--obs", type=int, default=150)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    # deferred: torch costs ~1.4 s at import
    import torch

    # deferred: training.engine imports torch (~1.4 s)
    from training.engine import ValueHead, build_model
    from training.prm.prm_scorer import PRM, PRMStepScorer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lm = build_model(ModelConfig())  # SmolLM2-135M, fp32 on CPU
    model = ValueHead(lm).eval()
    prm = PRM(model, load_tokenizer(resolve_model("smollm2-135m-instruct")), append_eos=True, max_len=4096)
    scorer = PRMStepScorer(url="http://unused", batch_size=args.batch)  # then given the in-process PRM
    scorer.prm, scorer.url = prm, None
    trajs = trajectories(args.rollouts, args.prompt, args.turns, args.turn, args.obs, lm.config.vocab_size)
    paths = {
        "per-trajectory": lambda: [scorer.score_steps(t) for t in trajs],
        "batched": lambda: scorer.score_many(trajs),
    }
    paths["batched"]()  # warm-up (thread pools, first allocations)
    times: dict[str, list[float]] = {k: [] for k in paths}
    print(
        f"load average {os.getloadavg()[0]:.2f}; threads {args.threads}; {args.rollouts} rollouts × {args.turns} turns "
        f"(prompt {args.prompt}, turn {args.turn}, observation {args.obs} tokens); PRM SmolLM2-135M fp32 on CPU"
    )
    for _ in range(args.repeats):
        for name in ("per-trajectory", "batched", "batched", "per-trajectory"):
            t0 = time.perf_counter()
            paths[name]()
            times[name].append(time.perf_counter() - t0)
            print(f"  {name:>15}: {times[name][-1]:.2f} s per RL step", flush=True)
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, ts in times.items():
        print(f"{name:>15}: median {float(np.median(ts)):.2f} s per RL step ({len(ts)} runs)")


if __name__ == "__main__":
    main()
