"""Two CPU ranks (gloo) sharing one rollout server, a stand-in for SGLang on loopback: only rank 0
exports and posts each update, behind a barrier, so the server gets exactly one
``/update_weights_from_disk`` per step (plus the initial sync), and both ranks' rollouts after
step N carry version N.

Run as a script by the test (``python -m torch.distributed.run ... this_file OUT URL``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.test_zero2_two_ranks import free_port

REPO = Path(__file__).resolve().parents[2]

RECIPE = """
name: sync2
papers: "test"
model:
  tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
data: {dataset: demo, split: test, limit: 8}
rollout:
  method: search_r1
  n_samples: 2
  prompts_per_step: 2
  backend: {kind: sglang}
  sampling: {max_new_tokens: 8}
  agent: {max_turns: 1, max_total_tokens: 3000, chat: false, max_doc_tokens: 24}
retriever: {kind: memory}
algo: {advantage: grpo, reward: sync2_length}
optim: {lr: 1.0e-2, micro_batch_size: 1, zero_stage: 2}
trainer: {max_steps: 2, save_every: 0, tensorboard: false, progress: false, save_rollouts: false}
"""


@pytest.mark.slow
def test_two_ranks_post_one_update_per_step(tmp_path):
    from tests.harness.conftest import ServerThread
    from tests.helpers.sglang_standin import SGLangStandIn

    (tmp_path / "recipe.yaml").write_text(RECIPE)
    standin = SGLangStandIn()
    with ServerThread(standin.app()) as server:
        env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        env.update(DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1"]
        cmd += ["--master_port", str(free_port()), __file__, str(tmp_path), server.url]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
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
