"""2 GRPO + 2 PPO steps of SmolLM2 in bf16 on one GPU (DeepSpeed bf16, bf16 in-process rollout
model, reference under autocast), then two steps whose weights sync into a GPU SGLang server.

Prints peak GPU memory, step time and tokens/s per step (run with ``-s`` / ``-rP`` to see them).
NOT RUN in the session that wrote it (no GPU was lent): the first GPU run is its first test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness.config import compose
from training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
pytestmark = [pytest.mark.gpu, pytest.mark.slow]
RECIPE = ROOT / "configs" / "train" / "smollm2_cpu_grpo.yaml"
SMALL = [
    f"data.data_dir={DATA}",
    "data.val_split=null",
    "rollout.prompts_per_step=4",
    "rollout.n_samples=4",
    "rollout.sampling.max_new_tokens=64",
    "model.dtype=bfloat16",
    "optim.bf16=true",
    "optim.threads=null",
    "trainer.save_every=0",
    "trainer.progress=false",
    "trainer.tensorboard=false",
]


def _need_data() -> None:
    if not (DATA / "hotpotqa" / "train100.jsonl").is_file():
        pytest.skip(f"no HotpotQA train100 under {DATA}")


@pytest.mark.parametrize(
    "algo",
    [[], ["algo.advantage=gae", "algo.kl_coef=0.001", "algo.kl_in_reward=true", "algo.critic_warmup=0"]],
    ids=["grpo", "ppo"],
)
def test_two_steps_bf16_on_gpu(tmp_path, algo):
    import torch

    from training.build import build_trainer

    _need_data()
    cfg = compose(TrainConfig, [RECIPE], [*SMALL, *algo])
    trainer = build_trainer(cfg, tmp_path / "run")
    assert trainer.device.type == "cuda"
    assert trainer.backend.device.type == "cuda"  # the in-process rollout model
    assert next(trainer.policy.module.parameters()).dtype == torch.bfloat16
    if trainer.critic is not None:
        assert next(trainer.critic.module.parameters()).device.type == "cuda"
    for _ in range(2):
        m = trainer.step()
        assert math.isfinite(m["grad_norm"]) and m["grad_norm"] > 0
        assert m["mem/gpu_peak_gb"] > 0 and m["tokens_per_s"] > 0
        print(
            json.dumps(
                {
                    "algo": "ppo" if algo else "grpo",
                    "step": trainer.step_no,
                    "gpu_peak_gb": round(m["mem/gpu_peak_gb"], 3),
                    "step_s": round(m["time/step_s"], 3),
                    "tokens_per_s": round(m["tokens_per_s"], 1),
                    "update_tokens_per_s": round(m["update_tokens_per_s"], 1),
                    "clip_frac": m.get("clip_frac"),
                }
            )
        )


def test_weight_sync_into_a_gpu_sglang_server(tmp_path):
    from typer.testing import CliRunner

    from cli.main import app
    from harness.engines import engine_dir, engine_ready

    _need_data()
    if not engine_ready("sglang"):
        pytest.skip(f"no sglang venv under {engine_dir()}: run make engines (a CUDA build for this tier)")
    run = tmp_path / "run"
    args = ["train", "-c", str(RECIPE), "--out", str(run), *SMALL, "trainer.max_steps=2"]
    args += ["rollout.backend.kind=sglang", "rollout.backend.launch=true", "rollout.backend.engine.device=cuda"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    versions = {r["step"]: set(r["trajectory"]["metadata"]["weight_versions"]) for r in rollouts}
    assert versions == {1: {"0"}, 2: {"1"}}, versions  # every step served by the weights just synced
    steps = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in steps if "loss" in m]
    print("mismatch/abs_log_ratio per step:", [f"{m['mismatch/abs_log_ratio']:.2e}" for m in steps])
    assert all(m["mismatch/abs_log_ratio"] < 0.1 for m in steps)  # bf16 engine vs bf16 trainer
