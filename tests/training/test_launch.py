"""The multi-node launch paths on one machine: ``harness train`` under ``torchrun`` and under the
DeepSpeed launcher with a hostfile, two CPU processes each, the same commands a 2-node run uses
(``torchrun --nnodes 2 --node_rank N``; ``deepspeed --hostfile H --no_ssh --node_rank N``;
docs/scale-out.md). Both ranks train; rank 0 alone writes the run folder."""

from __future__ import annotations

import json

import pytest

from benchmarks.tiny_recipes import grpo_recipe
from tests.helpers.two_ranks import launch, torchrun
from tests.training.test_zero2_two_ranks import RECIPE


def _train_args(tmp_path) -> list[str]:
    overrides = ["algo.reward=em", "optim.zero_stage=2", "trainer.max_steps=1", "trainer.save_every=1"]
    (tmp_path / "recipe.yaml").write_text(grpo_recipe("zero2", *overrides))
    return ["-m", "cli.main", "train", "-c", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "run")]


@pytest.mark.slow
def test_harness_train_under_torchrun_two_local_processes(tmp_path):
    proc = torchrun("--nnodes", "1", "--node_rank", "0", *_train_args(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_two_rank_run(tmp_path / "run")


@pytest.mark.slow
def test_harness_train_under_the_deepspeed_launcher_with_a_hostfile(tmp_path):
    """``deepspeed --hostfile`` with one host of 2 slots, ``--no_ssh --node_rank 0``: the launcher
    reads the hostfile, starts one process per slot with RANK/WORLD_SIZE/MASTER_* set. On 2 nodes
    the hostfile lists both hosts and each node runs the same command with its ``--node_rank``
    (or, with passwordless ssh/pdsh, node 0 alone runs it without ``--no_ssh``)."""
    (tmp_path / "hostfile").write_text("localhost slots=2\n")
    runner = ["-m", "deepspeed.launcher.runner", "--hostfile", str(tmp_path / "hostfile")]
    runner += ["--no_ssh", "--node_rank", "0"]
    # The module gets no --local_rank argument (the CLI does not take one; LOCAL_RANK is in the env).
    proc = launch(runner, "--no_local_rank", "--module", "cli.main", *_train_args(tmp_path)[2:])
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "localhost" in proc.stdout + proc.stderr  # the launcher's world info came from the hostfile
    _check_two_rank_run(tmp_path / "run")


def _check_two_rank_run(run) -> None:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert [r["step"] for r in rows if "loss" in r] == [1]  # one writer (rank 0), one row per step
    ckpt = run / "checkpoints" / "step-1"
    assert {"model_optim_rank0.pt", "model_optim_rank1.pt"} <= {p.name for p in ckpt.iterdir()}
    assert (run / "final" / "model.safetensors").is_file()


VLLM_LOGPROBS = ["--logprobs-mode", "processed_logprobs"]


@pytest.mark.parametrize(
    ("kind", "lora", "engine", "env", "args"),
    [
        ("sglang", [], "sglang", {}, ["--x"]),
        ("openai", [], "vllm", {"VLLM_SERVER_DEV_MODE": "1"}, [*VLLM_LOGPROBS, "--x"]),
        (
            "openai",
            ["model.lora={r: 4, sync: adapter}"],
            "vllm",
            {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"},
            [*VLLM_LOGPROBS, "--enable-lora", "--max-lora-rank", "4", "--x"],
        ),
        ("sglang", ["model.lora={r: 4, sync: merged}"], "sglang", {}, ["--x"]),
    ],
)
def test_launched_rollout_engine_gets_what_weight_sync_needs(tmp_path, kind, lora, engine, env, args):
    from harness.config import compose
    from training.build import rollout_engine
    from training.config import TrainConfig

    (tmp_path / "r.yaml").write_text(RECIPE)
    overrides = [
        *lora,
        f"rollout.backend.kind={kind}",
        "rollout.backend.launch=true",
        'rollout.backend.engine.args=["--x"]',
    ]
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], overrides)
    got_engine, ecfg = rollout_engine(cfg)
    assert (got_engine, ecfg.env, ecfg.args) == (engine, env, args)


@pytest.mark.parametrize(
    ("given", "added"),
    [
        (["--logprobs-mode=raw_logprobs"], ["--enable-lora", "--max-lora-rank", "4"]),  # the recipe's mode wins
        (["--enable-lora", "--max-lora-rank", "16"], VLLM_LOGPROBS),  # LoRA set up on the engine by hand
    ],
)
def test_flags_the_recipe_gives_the_engine_are_not_added_twice(tmp_path, given, added):
    from harness.config import compose
    from training.build import rollout_engine
    from training.config import TrainConfig

    (tmp_path / "r.yaml").write_text(RECIPE)
    overrides = ["model.lora={r: 4, sync: adapter}", "rollout.backend.kind=openai", "rollout.backend.launch=true"]
    overrides.append(f"rollout.backend.engine.args={given}")
    _, ecfg = rollout_engine(compose(TrainConfig, [tmp_path / "r.yaml"], overrides))
    assert ecfg.args == [*added, *given]
    assert ecfg.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"  # adapter sync still needs runtime loading
