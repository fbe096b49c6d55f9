"""Divergence (issue 31, defect 1): a non-finite loss or gradient skips its update on every engine
configuration and every trainer, N such steps in a row stop the run with exit 1 naming the step,
and no checkpoint is ever written from non-finite weights or pushes a finite one out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from benchmarks import tiny_recipes
from tests.training.test_checkpoint import engine
from training.checkpoint import checkpoints, export_hf, save_and_prune
from training.divergence import DivergenceError, NonFiniteGuard, poisoned, update_applied
from training.engine import full_state_dict


def batch(seed: int) -> torch.Tensor:
    return torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))  # [2, 12]


def step(eng, seed: int, nan: bool = False) -> None:
    from training.engine import optimizer_step

    x = batch(seed)
    loss = eng(input_ids=x, labels=x).loss
    if nan:  # NaN through a term with no gradient: the gradients alone would look finite
        loss = loss + torch.tensor(float("nan"))
    eng.backward(poisoned(loss))
    optimizer_step(eng)


@pytest.mark.parametrize("stage", [0, 2])
def test_a_non_finite_loss_skips_the_update_on_plain_and_zero_engines(stage):
    """Stage 0 fp32 steps our FiniteAdamW directly; ZeRO wraps it in DeepSpeed's optimizer. Both skip:
    no weight, optimizer-moment or LR-schedule change, and the engine says the step was not applied."""
    eng = engine(stage)
    step(eng, 1)
    assert update_applied(eng)
    before = full_state_dict(eng)
    lr, skipped = eng.get_lr()[0], eng.skipped_steps
    step(eng, 2, nan=True)
    assert not update_applied(eng) and eng.skipped_steps == skipped + 1
    after = full_state_dict(eng)
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step changed the weights"
    assert eng.get_lr()[0] == lr  # the warmup schedule did not move
    step(eng, 3)  # the next finite step trains again
    assert update_applied(eng)
    assert any(not torch.equal(after[k], v) for k, v in full_state_dict(eng).items())


def test_the_guard_counts_steps_in_a_row_and_names_the_step():
    g = NonFiniteGuard(3)
    assert g.record(1, 0) == {"nonfinite/skipped_updates": 0.0, "nonfinite/steps_total": 0.0}
    for s, skipped in ((2, 1), (3, 2), (4, 0), (5, 1), (6, 1)):
        g.record(s, skipped)
        g.stop_if_diverged()  # never 3 in a row so far
    assert not g.may_checkpoint()  # inside a streak
    assert g.record(7, 1)["nonfinite/steps_total"] == 5.0
    with pytest.raises(DivergenceError, match=r"diverged at step 7: steps 5 to 7"):
        g.stop_if_diverged()
    off = NonFiniteGuard(0)  # 0: skip, never stop
    for s in range(1, 20):
        off.record(s, 1)
    off.stop_if_diverged()


def test_non_finite_weights_are_never_written_and_prune_nothing(tmp_path):
    eng = engine(0)
    state = {"run_id": "r", "sampler": {}}
    for s in (1, 2):
        step(eng, s)
        save_and_prune(tmp_path / "checkpoints", s, eng, state, keep=2)
    with torch.no_grad():
        next(eng.module.parameters()).view(-1)[0] = float("inf")
    with pytest.raises(DivergenceError, match=r"step-3: weight .* is not finite"):
        save_and_prune(tmp_path / "checkpoints", 3, eng, state, keep=2)
    assert [p.name for _, p in checkpoints(tmp_path / "checkpoints")] == ["step-1", "step-2"]  # nothing pruned
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1", "step-2"]  # no temporary
    from harness.tokenization import byte_tokenizer

    with pytest.raises(DivergenceError, match="final"):
        export_hf(eng, byte_tokenizer(), tmp_path / "final")
    assert not (tmp_path / "final").exists()


# ---- the trainers ------------------------------------------------------------------------------
def sft_recipe(tmp_path: Path) -> Path:
    """The tiny SFT recipe for 20 steps, a checkpoint every 2 (the newest 2 kept)."""
    return tiny_recipes.sft_recipe(tmp_path, "trainer.max_steps=20", "trainer.save_every=2", name="sft-diverge")


def all_finite(folder: Path) -> bool:
    from safetensors.torch import load_file

    files = list(folder.glob("*.safetensors"))
    return bool(files) and all(bool(torch.isfinite(t).all()) for f in files for t in load_file(str(f)).values())


@pytest.mark.slow  # one short CLI training (~10 s)
def test_cli_sft_at_lr_1e30_stops_with_exit_1_and_writes_nothing_non_finite(tmp_path):
    """The issue's reproduction: the loss is NaN from step 2; the run used to print "trained 20
    steps", exit 0, and replace every checkpoint with NaN ones."""
    from cli.main import app

    run = tmp_path / "run"
    args = ["train", "-c", str(sft_recipe(tmp_path)), "--out", str(run), "optim.lr=1e30", "trainer.save_every=5"]
    res = CliRunner().invoke(app, args)
    out = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "diverged at step 6: steps 2 to 6" in out and "Traceback" not in out, out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite/skipped_updates"] for r in rows] == [0, 1, 1, 1, 1, 1]
    # step 5 fell inside the streak: no checkpoint of the weights that gave NaN, and no final model
    assert not (run / "final").exists() and checkpoints(run / "checkpoints") == []


@pytest.mark.slow  # ~10 s
def test_sft_divergence_keeps_the_last_good_checkpoints(tmp_path):
    """Four good steps (step-2, step-4 kept), then the LR jumps to 1e30: the weights blow up, the run
    stops after trainer.max_nonfinite_steps skipped steps, and keep_checkpoints=2 still holds the
    good step-2 and step-4, byte for byte."""
    from harness.config import compose
    from training.build import build_trainer
    from training.config import TrainConfig

    cfg = compose(TrainConfig, [sft_recipe(tmp_path)], ["trainer.max_nonfinite_steps=3"])
    trainer = build_trainer(cfg, tmp_path / "run")
    for _ in range(4):
        trainer.step()
    ckpts = tmp_path / "run" / "checkpoints"
    good = {p.name: (p / "model.safetensors").read_bytes() for _, p in checkpoints(ckpts)}
    assert sorted(good) == ["step-2", "step-4"]
    for g in trainer.policy.optimizer.param_groups:
        g["lr"] = 1e30
    with pytest.raises(DivergenceError, match=r"diverged at step \d+"):
        trainer.train()
    kept = {p.name: (p / "model.safetensors").read_bytes() for _, p in checkpoints(ckpts)}
    assert kept == good
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["nonfinite/skipped_updates"] == 1 and rows[-1]["nonfinite/steps_total"] == 3


@pytest.mark.slow  # ~15 s: a few RL steps on the tiny Llama
def test_rl_nan_rewards_skip_every_update_and_stop(tmp_path):
    """A reward that returns NaN makes the GRPO loss NaN: no update reaches the policy (weights and
    the rollout backend unchanged), each step counts it, and the second one in a row stops the run."""
    from tests.training.rl.test_trainer import make
    from training.rewards import REWARDS

    if "test_nan" not in REWARDS:

        class NaNReward:
            def __call__(self, traj):
                return float("nan"), {}

        REWARDS.register("test_nan", NaNReward)
    # trainer.preflight=false: the preflight refuses a NaN reward before any step (issue 49); this
    # test is about NaN reaching the update.
    trainer = make(
        tmp_path,
        "algo.reward=test_nan",
        "trainer.max_steps=5",
        "trainer.max_nonfinite_steps=2",
        "trainer.preflight=false",
    )
    before = {k: v.clone() for k, v in trainer.policy.module.state_dict().items()}
    with pytest.raises(DivergenceError, match="diverged at step 2: steps 1 to 2"):
        trainer.train()
    after = trainer.policy.module.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["nonfinite/skipped_updates"] for r in rows] == [1, 1]
    assert not (tmp_path / "run" / "checkpoints").exists() or not checkpoints(tmp_path / "run" / "checkpoints")


@pytest.mark.slow  # ~10 s: rollouts on the toy corpus
def test_retriever_rl_stops_at_the_update_that_made_the_tower_non_finite(tmp_path):
    from tests.training.retriever.test_retriever_rl import EXAMPLES, _setup
    from training.retriever.retriever_rl import RetrieverRL
    from training.retriever_config import RetrieverRLConfig

    retriever, runner = _setup(tmp_path)
    cfg = RetrieverRLConfig(group_size=4, questions_per_step=2, steps=6, lr=float("inf"), kl_coef=0.0, seed=0)
    rl = RetrieverRL(retriever, runner, cfg, tmp_path / "run", max_nonfinite_steps=2)
    with pytest.raises(DivergenceError, match="step 1: weight .* is not finite"):
        rl.train(EXAMPLES)  # an infinite LR makes the first update NaN: it stops there
    assert not (tmp_path / "run" / "encoder").exists() and rl.step_no == 0


@pytest.mark.parametrize("schedule", [[], ["optim.schedule=linear", "optim.warmup_steps=2"]])
def test_resume_trains_at_the_lr_it_is_given(tmp_path, schedule):
    """Issue 44 defect 2: ``--resume RUN optim.lr=X`` recorded X in config.json and trained at the
    checkpoint's LR (the optimizer's and the scheduler's states, loaded after the new config
    built them, brought the old LR back); the divergence advice to lower it did nothing."""
    from cli.main import app

    run = tmp_path / "run"
    args = ["train", "-c", str(sft_recipe(tmp_path)), "--out", str(run), "trainer.max_steps=2", *schedule]
    assert (res := CliRunner().invoke(app, args)).exit_code == 0, res.output
    res = CliRunner().invoke(app, ["train", "--resume", str(run), "trainer.max_steps=4", "optim.lr=0.5"])
    assert res.exit_code == 0, res.output
    assert json.loads((run / "config.json").read_text())["optim"]["lr"] == 0.5
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    if not schedule:
        assert [lrs[s] for s in (1, 2, 3, 4)] == pytest.approx([1e-3, 1e-3, 0.5, 0.5]), lrs
    else:  # the schedule's position kept, its peak the new LR (``lr`` is logged after the step: the next one's)
        from training.engine import lr_factor

        assert lrs[1] == pytest.approx(1e-3 * lr_factor("linear", 1, 2, 2))
        assert lrs[3] == pytest.approx(0.5 * lr_factor("linear", 3, 2, 4)) and lrs[3] > 0, lrs


def test_an_exploded_finite_checkpoint_never_pushes_out_the_last_one_before_the_first_non_finite_step(tmp_path):
    """Issue 44 defect 2 (related): after a run of skipped steps ends, training goes on from weights
    that blew up but stay finite; their checkpoints pushed the last good one out of
    keep_checkpoints, and the message still said "the checkpoints kept are finite". The last
    checkpoint before the first non-finite step (step 5: step-3, as step-4's weights gave step 5's
    NaN) is kept, and the message names it."""
    from training.checkpoint import divergence_advice

    eng = engine(0)
    out = tmp_path / "run" / "checkpoints"
    guard = NonFiniteGuard(2, lambda first: divergence_advice(out, first))
    for s in range(1, 9):
        step(eng, s)
        guard.record(s, int(s in (5, 8)))  # step 5 skipped, then finite steps, then skips again
        save_and_prune(out, s, eng, {"run_id": "r", "sampler": {}, "nonfinite": guard.state()}, keep=2)
    assert [p.name for _, p in checkpoints(out)] == ["step-3", "step-7", "step-8"]
    guard.record(9, 1)
    with pytest.raises(DivergenceError) as e:
        guard.stop_if_diverged()
    said = str(e.value)
    assert f"before the first non-finite step (step 5) is {out / 'step-3'}" in said, said
    assert "move step-7, step-8 out of" in said and "finite; train" not in said
    assert "No checkpoint precedes the first non-finite step (step 2)" in divergence_advice(out, 2)
