"""The multi-node launch path on one machine: ``harness train`` under ``torchrun`` with two CPU
processes, the same command a 2-node run uses with ``--nnodes 2 --node_rank N`` (README,
"Multi-node"). Both ranks train; rank 0 alone writes the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.test_zero2_two_ranks import RECIPE, free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_harness_train_under_torchrun_two_local_processes(tmp_path):
    recipe = RECIPE.replace("reward: zero2_letter_a", "reward: em")
    recipe = recipe.replace("max_steps: 2, save_every: 2", "max_steps: 1, save_every: 1")
    (tmp_path / "recipe.yaml").write_text(recipe)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(DS_ACCELERATOR="cpu", PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node_rank", "0"]
    cmd += ["--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    cmd += ["-m", "harness.cli.main", "train", "-c", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows if "loss" in r] == [1]  # one writer (rank 0), one row per step
    ckpt = run / "checkpoints" / "step-1"
    assert {"model_optim_rank0.pt", "model_optim_rank1.pt"} <= {p.name for p in ckpt.iterdir()}
    assert (run / "final" / "model.safetensors").is_file()
