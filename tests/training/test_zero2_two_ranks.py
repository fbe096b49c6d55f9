"""Two processes, ZeRO-2, gloo on CPU: the real trainer (rollouts through the agent, GRPO update,
weight sync, checkpoint, export) under ``torch.distributed.run`` ends with identical parameters
on both ranks, although each rank rolled out different prompts.

Run as a script by the test (``python -m torch.distributed.run ... this_file OUT``): each rank
trains and writes a hash of its final parameters and the prompts it saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks.tiny_recipes import grpo_recipe
from tests.helpers.two_ranks import torchrun

# Each rank trains on its own prompts with the same seed; LetterA (below) varies on a random model's text.
RECIPE = grpo_recipe("zero2", "algo.reward=zero2_letter_a", "optim.zero_stage=2")


@pytest.mark.slow
def test_zero2_two_ranks_identical(tmp_path):
    (tmp_path / "recipe.yaml").write_text(RECIPE)
    proc = torchrun(__file__, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["params"] == r1["params"]  # data-parallel training leaves the ranks identical
    assert r0["changed"] and r1["changed"]
    assert r0["prompts"] != r1["prompts"]  # ...although each rank rolled out its own prompts
    ckpt = tmp_path / "run" / "checkpoints" / "step-2"
    assert {"model_optim_rank0.pt", "model_optim_rank1.pt", "model.safetensors"} <= {p.name for p in ckpt.iterdir()}
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def _worker(out: str) -> None:
    import torch

    from harness.config import compose
    from training.build import build_trainer
    from training.config import TrainConfig
    from training.engine import end_distributed
    from training.rewards import REWARDS

    class LetterA:  # random tiny models never answer; a reward that varies on their own turns' text
        def __call__(self, traj):
            return float(any("a" in s.text for s in traj.segments if s.role == "model")), {}

    REWARDS.register("zero2_letter_a", LetterA)
    rank = int(os.environ["RANK"])
    cfg = compose(TrainConfig, [Path(out) / "recipe.yaml"], [])
    trainer = build_trainer(cfg, Path(out) / "run")  # same seed: same initial weights on every rank
    start = torch.cat([p.detach().flatten() for p in trainer.policy.module.parameters()]).clone()
    prompts = []
    original = trainer.agent.arun

    async def spy(example, **kw):  # record which prompts this rank rolls out
        prompts.append(example.id)
        return await original(example, **kw)

    trainer.agent.arun = spy
    trainer.train()
    flat = torch.cat([p.detach().float().flatten() for p in trainer.policy.module.parameters()])
    record = {
        "params": hashlib.sha256(flat.numpy().tobytes()).hexdigest(),
        "changed": not torch.equal(flat, start.float()),
        "prompts": prompts,
    }
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(record))
    end_distributed()  # as training.build.train does: a rank that exits with live gloo threads can abort


if __name__ == "__main__":
    _worker(sys.argv[1])
