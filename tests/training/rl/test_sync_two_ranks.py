"""Two CPU ranks (gloo) sharing one rollout server, a stand-in for SGLang on loopback: only rank 0
exports and posts each update, behind a barrier, so the server gets exactly one
``/update_weights_from_disk`` per step (plus the initial sync), and both ranks' rollouts after
step N carry version N.

Run as a script by the test (``python -m torch.distributed.run ... this_file OUT URL``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from benchmarks.tiny_recipes import grpo_recipe
from tests.helpers.two_ranks import torchrun

# Rollouts through the stand-in's HTTP API; Length (below) is a reward that varies on a random model's text.
RECIPE = grpo_recipe(
    "sync2",
    "rollout.backend.kind=sglang",
    "rollout.sampling.max_new_tokens=8",
    "rollout.agent.max_total_tokens=3000",
    "algo.reward=sync2_length",
    "optim.zero_stage=2",
    "trainer.save_every=0",
    "trainer.save_rollouts=false",
)


@pytest.mark.slow
def test_two_ranks_post_one_update_per_step(tmp_path):
    from tests.harness.conftest import ServerThread
    from tests.helpers.sglang_standin import SGLangStandIn

    (tmp_path / "recipe.yaml").write_text(RECIPE)
    standin = SGLangStandIn()
    with ServerThread(standin.app()) as server:
        proc = torchrun(__file__, str(tmp_path), server.url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    updates = standin.of("/update_weights_from_disk")
    assert [u["weight_version"] for u in updates] == ["0", "1", "2"]  # one per step, never one per rank
    assert len(standin.of("/flush_cache")) == 3
    assert sorted(p.name for p in (tmp_path / "run" / "sync").iterdir()) == ["weights-v2"]  # rank 0's only
    for r in (0, 1):
        seen = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert seen == {"1": ["0"], "2": ["1"]}, (r, seen)  # rollouts of step N served by version N-1


def _worker(out: str, url: str) -> None:
    from harness.backends.sglang import SGLangBackend
    from harness.config import compose
    from harness.tokenization import byte_tokenizer
    from training.build import build_trainer
    from training.config import TrainConfig
    from training.engine import end_distributed
    from training.rewards import REWARDS

    class Length:
        def __call__(self, traj):
            return len(traj.response_text) / 10.0, {}

    REWARDS.register("sync2_length", Length)
    rank = int(os.environ["RANK"])
    cfg = compose(TrainConfig, [Path(out) / "recipe.yaml"], [])
    backend = SGLangBackend(url, tokenizer=byte_tokenizer(), health_check=False, max_context=4096)
    trainer = build_trainer(cfg, Path(out) / "run", backend=backend)
    seen: dict[str, list[str]] = {}
    reward = trainer.reward_fn

    def spy(traj):  # every rollout of this rank passes here, tagged with the versions that served it
        seen.setdefault(str(trainer.step_no + 1), []).extend(traj.metadata["weight_versions"])
        return reward(traj)

    trainer.reward_fn = spy
    for _ in range(2):
        trainer.step()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps({k: sorted(set(v)) for k, v in seen.items()}))
    end_distributed()  # as training.build.train does: a rank that exits with live gloo threads can abort


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
