"""Every advantage estimator against numbers worked out by hand (in the comments)."""

from __future__ import annotations

import pytest
import torch

from harness.types import Doc, SearchRecord, Segment, Trajectory
from tests.helpers.trajectories import trajectory
from training.advantages import (
    ADVANTAGES,
    dual_granularity,
    gae,
    group_norm,
    grpo,
    masked_whiten,
    reinforce_pp,
    step_score_tensor,
    whiten_rsqrt,
)
from training.batch import collate
from training.rewards import STEP_SCORERS, RuleStepScorer


def test_registry_one_signature_matches_the_estimators():
    from types import SimpleNamespace

    from training.advantages import AdvantageInputs

    assert ADVANTAGES.names() == ["dual_granularity", "gae", "group_norm", "grpo", "reinforce_pp"]
    assert ADVANTAGES.info("gae")["needs_critic"] and ADVANTAGES.info("dual_granularity")["needs_step_scores"]
    algo = SimpleNamespace(
        norm_by_std=True, gamma=1.0, lam=1.0, dual_beta=0.3, whiten_advantages=False, adv_eps=None, step_eps=1e-8
    )
    r, g, m = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), torch.ones(3, 2)
    x = AdvantageInputs(r, g, m, values=torch.zeros(3, 2), step_scores=torch.ones(3, 2))
    adv, ret = ADVANTAGES.get("grpo")(x, algo)
    assert torch.equal(adv, grpo(r, g, m)) and ret is None
    assert torch.equal(ADVANTAGES.get("reinforce_pp")(x, algo)[0], reinforce_pp(r, g, m))
    assert torch.equal(ADVANTAGES.get("group_norm")(x, algo)[0], group_norm(r, g, m))
    adv, ret = ADVANTAGES.get("gae")(x, algo)  # no token rewards given: the outcome on the last token
    assert adv[:, 0].tolist() == pytest.approx([1.0, 0.0, 1.0]) and ret is not None
    assert torch.equal(ADVANTAGES.get("dual_granularity")(x, algo)[0], dual_granularity(r, x.step_scores, g, m))
    with pytest.raises(ValueError, match="step scores"):
        ADVANTAGES.get("dual_granularity")(AdvantageInputs(r, g, m), algo)
    assert STEP_SCORERS.get("rule") is RuleStepScorer


def test_grpo_by_hand():
    # Group 0: rewards 2, 0 -> mean 1, unbiased std sqrt((1 + 1) / 1) = 1.414214 -> ±0.707107.
    # Group 1: rewards 3, 0, 0 -> mean 1, deviations 2, -1, -1, var (4 + 1 + 1) / 2 = 3, std 1.732051
    #   -> 2 / 1.732051 = 1.154701 and -1 / 1.732051 = -0.577350.
    r = torch.tensor([2.0, 0.0, 3.0, 0.0, 0.0])
    g = torch.tensor([0, 0, 1, 1, 1])
    a = grpo(r, g, eps=0.0)  # [B]
    assert a.tolist() == pytest.approx([0.707107, -0.707107, 1.154701, -0.577350, -0.577350], abs=1e-6)
    # Without std (Dr. GRPO): just centred.
    assert grpo(r, g, norm_by_std=False).tolist() == pytest.approx([1.0, -1.0, 2.0, -1.0, -1.0])
    # Broadcast to tokens: masked positions get 0.
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    tok = grpo(r, g, mask, eps=0.0)  # [B, T]
    assert tok[0].tolist() == pytest.approx([0.707107, 0.0], abs=1e-6)
    assert tok[2].tolist() == pytest.approx([0.0, 1.154701], abs=1e-6)
    assert tok[4].tolist() == [0.0, 0.0]


def test_grpo_groups_by_prompt_index_not_sample():
    # A fresh id per sample makes every group a singleton: no baseline, every advantage 0 (the bug).
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    assert grpo(r, torch.arange(4)).abs().sum() == 0
    # Collate groups by the prompt: two samples of prompt A, two of prompt B -> [0, 0, 1, 1].
    trajs = [_traj("A", [1, 2]), _traj("A", [1, 2]), _traj("B", [7]), _traj("B", [7])]
    g = collate(trajs).group_ids
    assert g.tolist() == [0, 0, 1, 1]
    # Rewards 1, 0 within each group -> ±0.5 / std(1, 0) = ±0.5 / 0.707107 = ±0.707107.
    assert grpo(r, g, eps=0.0).tolist() == pytest.approx([0.707107, -0.707107] * 2, abs=1e-6)


def test_reinforce_pp_by_hand():
    # Group 0 = rows 0, 1 (rewards 1, 0 -> centred +.5, -.5); group 1 = row 2 alone (centred 0).
    # γ = 1: returns +.5 on row 0's valid tokens (t0, t1), -.5 on row 1's (t1, t2), 0 on row 2's t0.
    # Whitening over those 5 valid values: mean 0, population var (4 × .25 + 0) / 5 = .2, std .447214
    #   -> ±.5 / .447214 = ±1.118034.
    rewards = torch.tensor([1.0, 0.0, 0.5])
    groups = torch.tensor([0, 0, 1])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    a = reinforce_pp(rewards, groups, mask)
    h = 1.118034
    assert a.tolist() == [pytest.approx(x, abs=1e-5) for x in ([h, h, 0.0], [0.0, -h, -h], [0.0, 0.0, 0.0])]
    # γ = .5: row 0 returns [.25, .5], row 1 [-.25, -.5], row 2 [0]; mean 0,
    # var (.0625 + .25 + .0625 + .25) / 5 = .125, std .353553 -> .25 -> .707107, .5 -> 1.414214.
    a = reinforce_pp(rewards, groups, mask, gamma=0.5)
    assert a[0].tolist() == pytest.approx([0.707107, 1.414214, 0.0], abs=1e-5)
    assert a[1].tolist() == pytest.approx([0.0, -0.707107, -1.414214], abs=1e-5)


def test_gae_skips_observation_tokens_in_the_middle():
    # One row: model, model, OBS, OBS, model; reward 1 on the last token; values .5, .4, (9, 9), .2.
    # γ = λ = 1, chain t4 -> t1 -> t0: δ4 = 1 - .2 = .8; δ1 = 0 + .2 - .4 = -.2; δ0 = 0 + .4 - .5 = -.1.
    # A4 = .8; A1 = -.2 + .8 = .6; A0 = -.1 + .6 = .5. Returns A + V = 1, 1, 1; observations 0.
    r = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.4, 9.0, 9.0, 0.2]])
    m = torch.tensor([[1.0, 1.0, 0.0, 0.0, 1.0]])
    adv, ret = gae(r, v, m)
    assert adv[0].tolist() == pytest.approx([0.5, 0.6, 0.0, 0.0, 0.8])
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 0.0, 0.0, 1.0])
    # λ = .5: A4 = .8; A1 = -.2 + .5 × .8 = .2; A0 = -.1 + .5 × .2 = 0. Returns .5, .6, 1.
    adv, ret = gae(r, v, m, gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.0, 0.2, 0.0, 0.0, 0.8], abs=1e-6)
    assert ret[0].tolist() == pytest.approx([0.5, 0.6, 0.0, 0.0, 1.0], abs=1e-6)
    # γ = .5, λ = 1: δ4 = .8; δ1 = .5 × .2 - .4 = -.3; δ0 = .5 × .4 - .5 = -.3;
    # A1 = -.3 + .5 × .8 = .1; A0 = -.3 + .5 × .1 = -.25.
    adv, _ = gae(r, v, m, gamma=0.5, lam=1.0)
    assert adv[0].tolist() == pytest.approx([-0.25, 0.1, 0.0, 0.0, 0.8], abs=1e-6)
    # The observation's (critic) values never matter.
    v2 = v.clone()
    v2[0, 2:4] = -100.0
    assert torch.equal(gae(r, v2, m)[0], gae(r, v, m)[0])
    # whiten=True (verl's masked_whiten): A over valid tokens .5, .6, .8 -> mean .633333, unbiased
    # var (.017778 + .001111 + .027778) / 2 = .023333, std .152753 -> -.872872, -.218218, 1.091089.
    w, _ = gae(r, v, m, whiten=True)
    assert w[0].tolist() == pytest.approx([-0.872872, -0.218218, 0.0, 0.0, 1.091089], abs=1e-5)


def test_dual_granularity_by_hand():
    # Outcome 1, 0 in one group -> A_out = ±.5 / .707107 = ±.707107.
    # Step scores on VALID tokens: 1, 0 (row 0; its 7 is masked) and 0, 0, 1 (row 1)
    #   -> mean .4, population var (.36 + .16 × 3 + .36) / 5 = .24, std .489898;
    #   A_step(1) = .6 / .489898 = 1.224745, A_step(0) = -.4 / .489898 = -.816497.
    # β = .3: row 0 = [.707107 + .367423, .707107 - .244949, 0] = [1.074530, .462158, 0];
    #         row 1 = [-.952056, -.952056, -.707107 + .367423 = -.339683].
    out = torch.tensor([1.0, 0.0])
    steps = torch.tensor([[1.0, 0.0, 7.0], [0.0, 0.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    a = dual_granularity(out, steps, torch.tensor([0, 0]), mask, beta=0.3, eps=0.0)
    assert a[0].tolist() == pytest.approx([1.074530, 0.462158, 0.0], abs=1e-5)
    assert a[1].tolist() == pytest.approx([-0.952056, -0.952056, -0.339683], abs=1e-5)


def test_dual_granularity_epsilons_are_prorags():
    """prorag/rl/trainer.py:169-190: A_out = (R − mean) / (std_unbiased + 1e-4); the step scores'
    σ = sqrt(var_pop + 1e-8) (not std + ε).
    Outcome 1, 0: .5 / (.707107 + 1e-4) = ±.707007 (verl's 1e-6 would give ±.707106).
    Steps .5 and .5001 (float32: .5001000166), one token each: mean .50005, var_pop 2.5008e-9,
    σ = sqrt(1.25008e-8) = 1.118069e-4, A_step = ±5.0008e-5 / σ = ±.447274 (std + 1e-6 would give ±.980546).
    β = 1: row 0 = −.447274 + .707007 = .259733; row 1 = .447274 − .707007 = −.259733."""
    out, g, mask = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 1)
    steps = torch.tensor([[0.5], [0.5001]])
    a = dual_granularity(out, steps, g, mask, beta=1.0)
    assert a[:, 0].tolist() == pytest.approx([0.259733, -0.259733], abs=2e-4)
    assert dual_granularity(out, torch.zeros(2, 1), g, mask)[:, 0].tolist() == pytest.approx(
        [0.707007, -0.707007], abs=1e-6
    )
    # algo.adv_eps overrides the estimator's own; null takes it from the registry.
    from types import SimpleNamespace

    algo = SimpleNamespace(dual_beta=1.0, adv_eps=None, step_eps=1e-8)
    from training.advantages import AdvantageInputs

    x = AdvantageInputs(out, g, mask, step_scores=torch.zeros(2, 1))
    assert ADVANTAGES.info("dual_granularity")["eps"] == 1e-4 and ADVANTAGES.info("grpo")["eps"] == 1e-6
    assert ADVANTAGES.get("dual_granularity")(x, algo)[0][:, 0].tolist() == pytest.approx(
        [0.707007, -0.707007], abs=1e-6
    )
    algo.adv_eps = 1e-6
    assert ADVANTAGES.get("dual_granularity")(x, algo)[0][:, 0].tolist() == pytest.approx(
        [0.707106, -0.707106], abs=1e-6
    )


def test_rule_step_scorer_and_its_tensor():
    t = trajectory(
        ["Paris"],
        segments=[
            Segment("prompt", [1, 2]),
            Segment("model", [3, 4], "<search>capital of france</search>"),
            Segment("observation", [5, 6, 7], "<information>Paris is the capital</information>"),
            Segment("model", [8], "<answer>Paris</answer>"),
        ],
        searches=[
            SearchRecord(0, "capital of france", ["1"], [1.0], 0.0, docs=[Doc("1", "F", "Paris is the capital")])
        ],
        finish_reason="answer",
    )
    # Turn 1 (tokens 2..4) searched and hit a gold answer -> 1; turn 2 (tokens 7..8) answered -> .5.
    assert RuleStepScorer().score_steps(t) == [(2, 4, 1.0), (7, 8, 0.5)]
    # In the target axis token i is target i - 1: targets 1, 2 get 1; target 6 gets .5.
    assert step_score_tensor([t], RuleStepScorer(), 7)[0].tolist() == [0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.5]
    # Legacy form used by the trainer: scores for the collated spans.
    assert RuleStepScorer().score_steps(t, collate([t]).step_spans[0]) == [1.0, 0.5]


def test_masked_whiten_ignores_masked_values():
    x = torch.tensor([[1.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 0.0]])
    # valid 1, 3: mean 2, population std 1.
    assert masked_whiten(x, m)[0, :2].tolist() == pytest.approx([-1.0, 1.0], rel=1e-5)


def _traj(example_id: str, prompt: list[int]) -> Trajectory:
    return Trajectory(
        example_id=example_id,
        question="q",
        answers=["a"],
        method="m",
        segments=[Segment("prompt", prompt), Segment("model", [9, 9], logprobs=[-0.1, -0.1])],
    )


def test_whiten_rsqrt_by_hand_verl_and_openrlhf():
    # Valid values 1, 2, 3 (the 100 is masked): mean 2, squared deviations 1, 0, 1.
    # verl (unbiased): var = 2 / 2 = 1 → (x − 2)·rsqrt(1 + 1e-8) = −1, 0, 1.
    # OpenRLHF (population): var = 2 / 3 → (x − 2)·sqrt(3/2) = ∓1.224745, 0.
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert whiten_rsqrt(x, m, unbiased=True)[0].tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
    assert whiten_rsqrt(x, m, unbiased=False)[0].tolist() == pytest.approx([-1.224745, 0.0, 1.224745, 0.0], abs=1e-6)
    # A constant input: var 0 → OpenRLHF scales the (zero) deviations by rsqrt(1e-8) = 1e4, never 1e8.
    c = torch.tensor([[0.5, 0.5 + 1e-7]])
    out = whiten_rsqrt(c, torch.ones(1, 2), unbiased=False)
    assert out.abs().max() < 1e-2  # 0.5e-7 · 1e4 = 5e-4 (the old (std + 1e-8) form gave ≈ 1)


def test_reinforce_pp_kl_penalty_enters_the_returns_before_whitening():
    # One group of two, rewards 1 and 0 → centred ±0.5 on the last token. Row 0 has a −0.1 KL
    # penalty on its first token only: returns row 0 = [0.5 − 0.1, 0.5] = [0.4, 0.5], row 1 = [−0.5, −0.5].
    # Population whitening of [0.4, 0.5, −0.5, −0.5]: mean −0.025, var = (0.180625 + 0.275625 + 2·0.225625)/4
    # = 0.226875 → rstd 2.099465.
    r, g, m = torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), torch.ones(2, 2)
    pen = torch.tensor([[-0.1, 0.0], [0.0, 0.0]])
    a = reinforce_pp(r, g, m, token_penalty=pen)
    rstd = 1 / 0.226875**0.5
    expect = [[(0.4 + 0.025) * rstd, (0.5 + 0.025) * rstd], [(-0.475) * rstd, (-0.475) * rstd]]
    assert a.tolist() == [pytest.approx(row, abs=1e-5) for row in expect]


def test_gae_whitening_is_on_by_default_for_ppo():
    from types import SimpleNamespace

    from training.advantages import AdvantageInputs
    from training.config import AlgoConfig

    assert AlgoConfig().whiten_advantages is True
    # Rewards 1, 0, 1 on one token each, values 0: raw advantages 1, 0, 1; verl's whitening:
    # mean 2/3, unbiased var = ((1/3)² + (2/3)² + (1/3)²) / 2 = 1/3 → (x − 2/3)·√3 = 0.57735, −1.1547, 0.57735.
    r, g, m = torch.tensor([1.0, 0.0, 1.0]), torch.tensor([0, 0, 1]), torch.ones(3, 1)
    algo = SimpleNamespace(gamma=1.0, lam=1.0, whiten_advantages=True, adv_eps=None)
    adv, ret = ADVANTAGES.get("gae")(AdvantageInputs(r, g, m, values=torch.zeros(3, 1)), algo)
    assert adv[:, 0].tolist() == pytest.approx([0.57735, -1.154701, 0.57735], abs=1e-5)
    assert ret[:, 0].tolist() == pytest.approx([1.0, 0.0, 1.0])  # returns are not whitened


def test_group_norm_by_hand():
    """OpenRLHF's group_norm (R1-Searcher stage 1): group z-score with ε 1e-9 on the last model
    token, the −β·KL_t penalty on every model token, return-to-go, no whitening.

    Group 0: rewards 1, 0 → mean .5, unbiased std √(.25 + .25) = .707107 → z = ±.707107.
    Row 0, mask [1, 1, 0, 1] (t2 an observation), penalty −.1 per model token (the −.5 on t2 is
    masked): token rewards [−.1, −.1, 0, .707107 − .1]; returns-to-go over model tokens only:
    t3 .607107, t1 −.1 + .607107 = .507107, t0 −.1 + .507107 = .407107, t2 0.
    Row 1, mask [1, 1, 0, 0], no penalty: −.707107 on t1, carried back to t0.
    Row 2 is alone in group 1: no baseline, 0 everywhere (OpenRLHF would give NaN)."""
    r, g = torch.tensor([1.0, 0.0, 5.0]), torch.tensor([0, 0, 1])
    m = torch.tensor([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    pen = torch.tensor([[-0.1, -0.1, -0.5, -0.1], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    a = group_norm(r, g, m, token_penalty=pen)
    assert a[0].tolist() == pytest.approx([0.407107, 0.507107, 0.0, 0.607107], abs=1e-6)
    assert a[1].tolist() == pytest.approx([-0.707107, -0.707107, 0.0, 0.0], abs=1e-6)
    assert a[2].tolist() == [0.0, 0.0, 0.0, 0.0]
    # Without KL each row is its z on every model token: no whitening (Reinforce++ would whiten).
    assert group_norm(r, g, m)[0].tolist() == pytest.approx([0.707107, 0.707107, 0.0, 0.707107], abs=1e-6)
    # ε is 1e-9: rewards 1e-6 and 0 → std 7.07107e-7, z = .5e-6 / (7.07107e-7 + 1e-9) = .706108
    # (GRPO's ε 1e-6 would give .5e-6 / 1.707107e-6 = .292893).
    tiny = group_norm(torch.tensor([1e-6, 0.0]), torch.tensor([0, 0]), torch.ones(2, 1))
    assert tiny[:, 0].tolist() == pytest.approx([0.706108, -0.706108], abs=1e-5)


def test_kl_in_the_reward_reaches_every_estimator_that_takes_it():
    """verl's GRPO with use_kl_in_reward normalises token_level_rewards.sum(-1) = R − β·Σ KL_t.

    Rewards 1, 0, 0 (one group); KL penalties summing to −.2, 0, −.4 → scores .8, 0, −.4: mean
    .133333, deviations .666667, −.133333, −.533333, unbiased var (.444444 + .017778 + .284444) / 2
    = .373333, std .611010 → 1.091088, −.218218, −.872870 (without KL: 1.154701, −.57735, −.57735)."""
    from types import SimpleNamespace

    from training.advantages import AdvantageInputs

    algo = SimpleNamespace(
        norm_by_std=True, gamma=1.0, lam=1.0, whiten_advantages=False, dual_beta=0.3, adv_eps=None, step_eps=1e-8
    )
    r, g, m = torch.tensor([1.0, 0.0, 0.0]), torch.tensor([0, 0, 0]), torch.ones(3, 2)
    kl = torch.tensor([[-0.1, -0.1], [0.0, 0.0], [-0.3, -0.1]])
    adv, _ = ADVANTAGES.get("grpo")(AdvantageInputs(r, g, m, kl_reward=kl), algo)
    assert adv[:, 0].tolist() == pytest.approx([1.091088, -0.218218, -0.872870], abs=1e-5)
    assert adv[:, 1].tolist() == adv[:, 0].tolist()  # one advantage per sequence
    # group_norm and reinforce_pp take it per token (OpenRLHF); gae adds it to the token rewards.
    x = AdvantageInputs(r, g, m, values=torch.zeros(3, 2), kl_reward=kl)
    assert torch.equal(ADVANTAGES.get("group_norm")(x, algo)[0], group_norm(r, g, m, token_penalty=kl))
    assert torch.equal(ADVANTAGES.get("reinforce_pp")(x, algo)[0], reinforce_pp(r, g, m, token_penalty=kl))
    adv, _ = ADVANTAGES.get("gae")(x, algo)  # γ = λ = 1, V = 0: A_t = Σ_{t' ≥ t} r_t'
    assert adv[0].tolist() == pytest.approx([1 - 0.2, 1 - 0.1])
    assert adv[2].tolist() == pytest.approx([-0.4, -0.1])
    assert [n for n in ADVANTAGES.names() if not ADVANTAGES.info(n).get("kl_in_reward")] == ["dual_granularity"]
    with pytest.raises(ValueError, match="no KL in the reward"):
        ADVANTAGES.get("dual_granularity")(AdvantageInputs(r, g, m, kl_reward=kl, step_scores=m), algo)


def _whiten_on_rank(rank: int, port: int, x: torch.Tensor, mask: torch.Tensor, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        half = slice(rank * 2, rank * 2 + 2)  # each rank holds two of the four rows
        for unbiased in (False, True):
            torch.save(whiten_rsqrt(x[half], mask[half], unbiased), f"{out}/{rank}-{unbiased}.pt")
    finally:
        dist.destroy_process_group()


def test_whitening_is_over_every_ranks_tokens(tmp_path):
    """OpenRLHF's normalize all-reduces the sum, count and squared deviations (R1-Searcher stage 2);
    verl whitens the whole batch. Two gloo ranks holding half the rows each must give the rows
    exactly what one process whitening all four gives."""
    import torch.multiprocessing as mp

    from harness.ports import free_port

    x = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0], [10.0, 12.0, 0.0], [-4.0, 5.0, 6.0]])  # [4, 3]
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    mp.spawn(_whiten_on_rank, args=(free_port(), x, mask, str(tmp_path)), nprocs=2, join=True)
    for unbiased in (False, True):
        whole = whiten_rsqrt(x, mask, unbiased)
        parts = torch.cat([torch.load(tmp_path / f"{r}-{unbiased}.pt") for r in (0, 1)])
        assert torch.allclose(parts, whole, atol=1e-6)
        # per rank would differ: rank 0's rows alone have another mean
        assert not torch.allclose(whiten_rsqrt(x[:2], mask[:2], unbiased), whole[:2], atol=1e-3)
