"""verl's update schedule: mini-batches, epochs, old log-probs once, critic warm-up, and the
DeepSpeed accumulation that makes each mini-batch exactly one optimizer step."""

from __future__ import annotations

import pytest
import torch

from harness.config import ConfigError, compose, from_dict
from tests.training.rl.test_trainer import make, recipe
from training.config import AlgoConfig, TrainConfig, mini_batch_rows


def cfg(tmp_path, *overrides: str) -> TrainConfig:
    return compose(TrainConfig, [recipe(tmp_path)], list(overrides))


def test_mini_batch_rows_by_hand(tmp_path):
    # The tiny recipe: 2 prompts × 2 samples = 4 rows per step.
    assert mini_batch_rows(cfg(tmp_path), 1) == 4  # no ppo_mini_batch_size: the whole batch
    assert mini_batch_rows(cfg(tmp_path, "algo.ppo_mini_batch_size=2", "optim.micro_batch_size=1"), 1) == 2
    assert mini_batch_rows(cfg(tmp_path, "algo.ppo_mini_batch_size=4"), 2) == 2  # 4 rows over 2 ranks
    with pytest.raises(ValueError, match="must divide the step's batch"):
        mini_batch_rows(cfg(tmp_path, "algo.ppo_mini_batch_size=4"), 3)  # 4 rows over 3 ranks
    with pytest.raises(ValueError, match="multiple of optim.micro_batch_size"):
        mini_batch_rows(
            cfg(tmp_path, "rollout.prompts_per_step=3", "algo.ppo_mini_batch_size=6", "optim.micro_batch_size=4"), 1
        )


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["algo.advantage=dual_granularity", "algo.kl_coef=0.01", "algo.kl_in_reward=true"], "does not apply to"),
        (["algo.critic_warmup=2"], "algo.critic_warmup=2 needs a critic"),
        (["algo.ppo_mini_batch_size=3"], "must divide the step's batch"),
        (["algo.filter_groups=true", "algo.ppo_mini_batch_size=2"], "one mini-batch of one micro-batch"),
        (["algo.filter_groups=true", "optim.micro_batch_size=4", "algo.advantage=gae"], "group-relative"),
        (["algo.filter_max_gen_batches=2"], "set algo.filter_groups=true"),
        (["algo.filter_groups=true", "optim.micro_batch_size=4", "algo.filter_max_gen_batches=-1"], ">= 0"),
    ],
)
def test_the_rl_recipe_checks_fire_when_the_recipe_loads(tmp_path, overrides, says):
    """The checks that hold for any rank count are the config's own: nothing is built first."""
    with pytest.raises(ConfigError, match=says):
        cfg(tmp_path, *overrides)
    assert cfg(tmp_path, *overrides, "algo.kind=sft").algo.kind == "sft"  # RL options only bind RL recipes


def test_the_rank_checks_run_for_the_rank_count(tmp_path):
    from training.config import check_ranks

    three = cfg(tmp_path, "rollout.prompts_per_step=3")  # loads: one rank rolls out 3 prompts
    check_ranks(three, 1)
    with pytest.raises(ValueError, match="rollout.prompts_per_step=3 must divide by 2 ranks"):
        check_ranks(three, 2)
    with pytest.raises(NotImplementedError, match="trainer.async with several ranks"):
        check_ranks(cfg(tmp_path, "trainer.async.enabled=true"), 2)
    refill = cfg(tmp_path, "algo.filter_groups=true", "optim.micro_batch_size=4", "algo.filter_max_gen_batches=0")
    check_ranks(refill, 1)
    with pytest.raises(NotImplementedError, match="refill.*several ranks"):
        check_ranks(refill, 2)


def test_epochs_checks_and_no_alias():
    assert AlgoConfig(ppo_epochs=2).ppo_epochs == 2
    with pytest.raises(ValueError, match="ppo_epochs must be"):
        AlgoConfig(ppo_epochs=0)
    with pytest.raises(ConfigError, match="update_epochs"):  # the old alias is gone: an unknown key
        from_dict(AlgoConfig, {"update_epochs": 2}, where="algo")


def _lm_head(trainer) -> torch.Tensor:
    return trainer.policy.module.lm_head.weight.detach().clone()


@pytest.mark.slow
def test_clipping_engages_on_epoch_two(tmp_path):
    """Epoch 1 of one mini-batch runs at the old policy (ratio exactly 1, nothing clipped); after
    its optimizer step the ratio moves, so epoch 2 clips (lr 1e-2 on a tiny model moves it far)."""
    trainer = make(tmp_path, "algo.ppo_epochs=2", "algo.reward=test_length", "trainer.save_every=0")
    m = trainer.step()
    assert m["clip_frac/epoch_1"] == 0.0
    assert m["clip_frac/epoch_2"] > 0.0
    assert m["clip_frac"] > 0.0 and m["policy_updates"] == 2.0
    assert m["tokens_per_s"] > 0 and "mem/gpu_peak_gb" not in m  # CPU: no GPU memory to report


@pytest.mark.slow
def test_mini_batches_are_optimizer_steps_with_accumulation(tmp_path):
    """4 rows, mini-batches of 2 rows, micro-batches of 1: DeepSpeed accumulates 2 micro-batches,
    so 2 mini-batches × 2 epochs = 4 optimizer steps (one gradient norm each)."""
    trainer = make(
        tmp_path,
        "algo.ppo_mini_batch_size=2",
        "algo.ppo_epochs=2",
        "optim.micro_batch_size=1",
        "algo.reward=test_length",
        "trainer.save_every=0",
    )
    assert trainer.policy.gradient_accumulation_steps() == 2
    m = trainer.step()
    assert m["policy_updates"] == 4.0
    assert trainer.policy.global_steps == 4  # DeepSpeed's own count of optimizer steps


@pytest.mark.slow
def test_critic_warmup_updates_only_the_critic(tmp_path):
    trainer = make(
        tmp_path, "algo.advantage=gae", "algo.critic_warmup=2", "algo.reward=test_length", "trainer.save_every=0"
    )  # verl's count: the actor first learns at step 2
    p0, c0 = _lm_head(trainer), trainer.critic.module.head.weight.detach().clone()
    m = trainer.step()  # step 1: warm-up
    assert m["policy_updates"] == 0.0 and "value_loss" in m
    assert torch.equal(p0, _lm_head(trainer))
    assert not torch.equal(c0, trainer.critic.module.head.weight)
    m = trainer.step()  # step 2: both learn
    assert m["policy_updates"] == 1.0 and not torch.equal(p0, _lm_head(trainer))


@pytest.mark.slow
def test_critic_warmup_one_is_no_warmup_as_in_verl(tmp_path):
    """verl updates the actor when critic_warmup <= global_steps, its first step being 1."""
    trainer = make(
        tmp_path, "algo.advantage=gae", "algo.critic_warmup=1", "algo.reward=test_length", "trainer.save_every=0"
    )
    assert trainer.step()["policy_updates"] == 1.0


@pytest.mark.slow
def test_cpu_recipe_schedule_makes_four_updates_and_clips(tmp_path):
    """smollm2_cpu_grpo.yaml's own schedule (16 rows, mini-batches of 8, 2 epochs, micro 4) on the
    model.tiny path (demo data, in-memory retriever, short generations). The tiny random model
    needs a larger lr than the recipe's 2e-5 to move its ratio; the real SmolLM2 at 2e-5 was
    checked by hand (clip_frac 0.31, see the branch's report)."""
    from pathlib import Path

    from training.build import build_trainer

    root = Path(__file__).resolve().parents[3]
    cfg = compose(
        TrainConfig,
        [root / "configs" / "train" / "smollm2_cpu_grpo.yaml"],
        [
            "model.tiny={hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2}",
            "data.dataset=demo",
            "data.split=test",
            "data.val_split=null",
            "retriever.kind=memory",
            "rollout.sampling.max_new_tokens=8",
            "rollout.agent.few_shot=false",
            "algo.reward=test_length",
            "optim.lr=1.0e-2",
            "trainer.save_every=0",
            "trainer.progress=false",
            "trainer.tensorboard=false",
        ],
    )
    assert (cfg.algo.ppo_mini_batch_size, cfg.algo.ppo_epochs) == (8, 2)
    trainer = build_trainer(cfg, tmp_path / "run")
    assert trainer.policy.gradient_accumulation_steps() == 2  # 8 rows / micro-batches of 4
    m = trainer.step()
    assert m["policy_updates"] == 4.0 and m["clip_frac"] > 0.0


@pytest.mark.slow
def test_warmup_moves_once_per_training_step(tmp_path):
    """2 mini-batches × 2 epochs = 4 optimizer steps per training step; warmup 2 training steps.
    verl's schedule: training step t runs at lr · t / 2 → 0, 5e-3, 1e-2 (lr 1e-2); every optimizer
    step of a training step at the same LR. Counting optimizer steps (the old way) would have
    reached the full LR inside the first training step. The critic warms up on its own (1 step:
    0, then 1e-5); the policy does not move at all in training step 0 (LR 0, no weight decay)."""
    trainer = make(
        tmp_path,
        "algo.advantage=gae",
        "algo.ppo_mini_batch_size=2",
        "algo.ppo_epochs=2",
        "optim.micro_batch_size=1",
        "optim.warmup_steps=2",
        "optim.critic_warmup_steps=1",
        "algo.reward=test_length",
        "trainer.save_every=0",
    )
    assert trainer.updates_per_step == 4
    p0 = _lm_head(trainer)
    lrs, critic_lrs = [], []
    for _ in range(3):
        m = trainer.step()
        assert m["policy_updates"] == 4.0
        lrs.append(m["lr"])
        critic_lrs.append(m["critic_lr"])
        if len(lrs) == 1:
            assert torch.equal(p0, _lm_head(trainer))
    assert lrs == pytest.approx([0.0, 5e-3, 1e-2])
    assert critic_lrs == pytest.approx([0.0, 1e-5, 1e-5])
    assert trainer.policy.global_steps == 12  # DeepSpeed's count: 3 training steps × 4


@pytest.mark.slow
@pytest.mark.parametrize(
    ("unit", "want"),
    [
        # verl: the LR moves once per training step: 1e-2 · (2 − t)/2 for both optimizer steps of t.
        ("training_step", [1e-2, 1e-2, 5e-3, 5e-3]),
        # HF / OpenRLHF: every optimizer step moves it, 4 in all: 1e-2 · (4 − s)/4.
        ("optimizer_step", [1e-2, 7.5e-3, 5e-3, 2.5e-3]),
    ],
)
def test_linear_decay_counts_its_unit(tmp_path, unit, want):
    """2 mini-batches per training step (2 optimizer steps), 2 training steps, linear decay to 0:
    the LR of each optimizer step, the logged LR (each training step's first), and 0 at the end."""
    trainer = make(
        tmp_path,
        "algo.ppo_mini_batch_size=2",
        "optim.micro_batch_size=1",
        "optim.schedule=linear",
        f"optim.schedule_unit={unit}",
        "algo.reward=test_length",
        "trainer.save_every=0",
    )
    factor = trainer.policy.lr_scheduler.lr_lambdas[0]  # optimizer step → LR multiplier
    assert [1e-2 * factor(s) for s in range(4)] == pytest.approx(want)
    assert [trainer.step()["lr"] for _ in range(2)] == pytest.approx(want[::2])
    assert trainer.policy.global_steps == 4 and trainer.policy.get_lr()[0] == pytest.approx(0.0)


def test_informative_rows_by_hand():
    from training.rl.trainer import informative_rows

    # group 0 all equal (dropped), group 1 mixed (kept), group 2 a single rollout (dropped)
    assert informative_rows([0, 0, 1, 1, 2], [0.1, 0.1, 0.0, 1.0, 1.0]) == [2, 3]
    assert informative_rows([0, 0], [1.0, 1.0]) == []


def test_filter_groups_needs_one_micro_batch_and_a_group_advantage(tmp_path):
    from training.config import check_filter_groups

    one = "optim.micro_batch_size=4"  # the tiny recipe: 4 rows per step
    check_filter_groups(cfg(tmp_path, "algo.filter_groups=true", one), 1)
    with pytest.raises(ValueError, match="one mini-batch of one micro-batch"):
        check_filter_groups(cfg(tmp_path, "algo.filter_groups=true"), 1)  # micro-batches of 2
    with pytest.raises(ValueError, match="one mini-batch of one micro-batch"):
        check_filter_groups(cfg(tmp_path, "algo.filter_groups=true", one, "algo.ppo_mini_batch_size=2"), 1)
    with pytest.raises(ValueError, match="group-relative"):
        check_filter_groups(cfg(tmp_path, "algo.filter_groups=true", one, "algo.advantage=gae"), 1)


if "test_by_group" not in __import__("training.rewards", fromlist=["REWARDS"]).REWARDS:
    from training.rewards import REWARDS

    class _ByGroup:
        """Group 0's rollouts all score 1 (no signal); every other rollout scores its length."""

        def __call__(self, traj):
            if _ByGroup.uniform_id in (traj.example_id, "*"):
                return 1.0, {}
            return len(traj.response_text) / 100.0, {}

        uniform_id = ""

    REWARDS.register("test_by_group", _ByGroup)


@pytest.mark.slow
def test_filter_groups_leaves_uniform_groups_out_of_the_update(tmp_path):
    from training.rewards import REWARDS

    one = "optim.micro_batch_size=4"
    trainer = make(tmp_path, "algo.filter_groups=true", one, "algo.reward=test_by_group", "trainer.save_every=0")
    first = trainer.sampler.next(1)[0]  # the step's first prompt (group 0) scores uniformly
    trainer.sampler.load({"epoch": 0, "index": 0})
    REWARDS.get("test_by_group").uniform_id = first.id
    w0 = _lm_head(trainer)
    m = trainer.step()
    assert m["groups/kept_frac"] == 0.5  # 2 of the 4 rows: group 1 only
    assert m["policy_updates"] == 1.0 and not torch.equal(w0, _lm_head(trainer))
    # Every group uniform: no update, the step still counts.
    REWARDS.get("test_by_group").uniform_id = "*"
    trainer2 = make(tmp_path / "b", "algo.filter_groups=true", one, "algo.reward=test_by_group", "trainer.save_every=0")
    w1 = _lm_head(trainer2)
    m2 = trainer2.step()
    assert m2["groups/kept_frac"] == 0.0 and m2["policy_updates"] == 0.0 and trainer2.step_no == 1
    assert torch.equal(w1, _lm_head(trainer2))


@pytest.mark.slow
def test_the_refill_draws_prompts_until_every_group_trained_is_informative(tmp_path):
    """DAPO's refill (algo.filter_max_gen_batches): a step whose batch kept fewer informative groups
    than rollout.prompts_per_step draws another batch of prompts and trains the first groups that
    fill it; at the limit it trains what it has (here: nothing)."""
    from training.rewards import REWARDS

    over = ["algo.filter_groups=true", "algo.filter_max_gen_batches=3", "optim.micro_batch_size=4"]
    trainer = make(tmp_path, *over, "algo.reward=test_by_group", "trainer.save_every=0")
    first = trainer.sampler.next(1)[0]  # the step's first prompt (group 0) scores uniformly
    trainer.sampler.load({"epoch": 0, "index": 0})
    REWARDS.get("test_by_group").uniform_id = first.id
    m = trainer.step()
    # batch 1: group 1 kept; batch 2 (two more prompts): its first group fills the step's two
    assert m["filter/gen_batches"] == 2.0 and m["groups/kept_frac"] == 4 / 8 and m["policy_updates"] == 1.0
    assert trainer.sampler.state() == {"epoch": 0, "index": 4}  # two batches of two prompts drawn
    REWARDS.get("test_by_group").uniform_id = "*"  # every group uniform: three batches, then no update
    trainer2 = make(tmp_path / "b", *over, "algo.reward=test_by_group", "trainer.save_every=0")
    m2 = trainer2.step()
    assert m2["filter/gen_batches"] == 3.0 and m2["groups/kept_frac"] == 0.0 and m2["policy_updates"] == 0.0


def test_rl_rolls_out_an_agent_on_tokens_only(tmp_path):
    """The chat-API agent (harness eval --method tool_call_chat) returns text without token ids:
    a recipe that rolls it out is refused by name before anything is built."""
    from training.build import _rl_trainer

    with pytest.raises(ValueError, match="'tool_call_chat' evaluates only; RL rolls out an agent on tokens"):
        _rl_trainer(cfg(tmp_path, "rollout.method=tool_call_chat"), tmp_path / "out")
