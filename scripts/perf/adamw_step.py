"""Seconds per AdamW step over SmolLM2-135M's parameter shapes: torch's fused kernel against its
per-parameter loop (``optim.fused``; a benchmark, not a test). A B B A, after one warm-up step
each; random gradients (the step's cost does not depend on their values).

    .venv/bin/python scripts/perf/adamw_step.py [--threads 1] [--steps 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from training.engine import adamw_kernel

# SmolLM2-135M: a 49,152 x 576 embedding (tied head) and 30 layers of q/o (576²), k/v (576 x 192)
# and the MLP's gate/up/down (576 x 1536); the norms are left out (0.03% of the parameters).
SHAPES = [(49152, 576)] + [(576, 576)] * 60 + [(192, 576)] * 60 + [(1536, 576)] * 90


def seconds_per_step(params: list[torch.nn.Parameter], fused: bool, steps: int) -> float:
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, **adamw_kernel(fused))
    opt.step()  # the moments are allocated here
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    params = [torch.nn.Parameter(torch.randn(s)) for s in SHAPES]
    for q in params:
        q.grad = torch.randn_like(q)
    print(f"{sum(q.numel() for q in params) / 1e6:.1f}M parameters, {args.threads} thread(s)")
    for fused in (False, True, True, False):
        print(
            f"{'fused' if fused else 'loop '}: {seconds_per_step(params, fused, args.steps):.3f} s a step", flush=True
        )


if __name__ == "__main__":
    main()
