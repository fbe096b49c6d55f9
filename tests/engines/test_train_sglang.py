"""``harness train`` with ``rollout.backend.launch=true``: SGLang is started for the run, rollouts come
from it, every update reaches it through ``/update_weights_from_disk`` (the rollouts of step N
report the weights of step N-1), and it is stopped when training ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.engines import engine_dir, engine_ready
from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"


def _args(run: Path) -> list[str]:
    return [
        "train",
        "-c",
        str(ROOT / "configs" / "train" / "smollm2_cpu_grpo.yaml"),
        "--data-dir",
        str(DATA),
        "--out",
        str(run),
        "rollout.backend.kind=sglang",
        "rollout.backend.launch=true",
        "rollout.backend.engine.device=cpu",
        "rollout.backend.engine.args=" + json.dumps(checks.ENGINE_ARGS["sglang"]),
        "rollout.prompts_per_step=2",
        "rollout.n_samples=2",
        "algo.ppo_mini_batch_size=4",  # the recipe's 8 rows per update do not fit this 4-row step
        "rollout.sampling.max_new_tokens=16",
        "data.val_split=null",
        "trainer.max_steps=2",
        "trainer.save_every=0",
        "trainer.progress=false",
        "trainer.tensorboard=false",
    ]


def _skip_without_sglang() -> None:
    if not engine_ready("sglang"):
        pytest.skip(f"no sglang venv under {engine_dir()}: run make engines")
    if not (DATA / "hotpotqa" / "train100.jsonl").is_file():
        pytest.skip(f"no HotpotQA train100 under {DATA}")


def test_two_steps_with_a_launched_sglang(tmp_path):
    _skip_without_sglang()
    from cli.main import app

    run = tmp_path / "run"
    res = CliRunner().invoke(app, _args(run))
    assert res.exit_code == 0, res.output
    assert "sglang up at http://127.0.0.1:" in res.output
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    versions = {
        r["step"]: {
            v for r2 in rollouts if r2["step"] == r["step"] for v in r2["trajectory"]["metadata"]["weight_versions"]
        }
        for r in rollouts
    }
    assert versions == {1: {"0"}, 2: {"1"}}, versions  # served by the synced weights, never stale
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2]
    # The engine's sampling logprobs against the trainer's recomputation of the same tokens.
    print("mismatch/abs_log_ratio per step:", [f"{m['mismatch/abs_log_ratio']:.2e}" for m in steps])
    assert all(m["mismatch/abs_log_ratio"] < 0.05 for m in steps)
    logs = list(run.joinpath("engines").glob("sglang-*.log"))
    assert logs and "update_weights_from_disk" in logs[0].read_text()
    port = logs[0].stem.split("-")[1]
    assert not checks.processes_with(f"--port {port}"), "engine left running after training"


def test_async_steps_with_a_launched_sglang(tmp_path):
    """``trainer.async`` against real SGLang: the producer generates while the trainer updates,
    every update reaches the server with the requests in flight retracted and continued
    (``interrupt: continue``), AReaL's decoupled loss (the token-level rollout correction, cap 5)
    weighs stale tokens by the server's own logprobs, and the staleness bound holds on every step
    and every segment."""
    _skip_without_sglang()
    from cli.main import app

    run = tmp_path / "run"
    extra = [
        "trainer.max_steps=4",
        "trainer.async.enabled=true",
        "trainer.async.max_staleness=1",
        "algo.rollout_correction.kind=mask",
        "algo.rollout_correction.hi=5",
    ]
    res = CliRunner().invoke(app, [*_args(run), *extra])
    assert res.exit_code == 0, res.output
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m]
    assert [m["step"] for m in steps] == [1, 2, 3, 4]
    for m in steps:
        assert 0 <= m["async/staleness_max"] <= 1 and "mismatch/weight_mean" in m and "async/trainer_wait_s" in m
    print("trainer wait per step:", [round(m["async/trainer_wait_s"], 1) for m in steps])
    print("behaviour weight per step:", [round(m["mismatch/weight_mean"], 4) for m in steps])
    for r in (json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()):
        head, step = r["trajectory"]["policy_version"], r["step"]
        seg = [x["version"] for x in r["trajectory"]["segments"] if x["role"] == "model"]
        assert step - 2 <= head <= step - 1 and seg and all(head <= v <= step - 1 for v in seg), (step, head, seg)
    logs = list(run.joinpath("engines").glob("sglang-*.log"))
    port = logs[0].stem.split("-")[1]
    assert not checks.processes_with(f"--port {port}"), "engine left running after training"
