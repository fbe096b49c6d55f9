"""Losses, aggregations, KL estimators, entropy and value clipping against hand arithmetic; masks."""

from __future__ import annotations

import math

import pytest
import torch

from harness.registry import RegistryError
from harness.types import Segment, Trajectory
from tests.helpers.trajectories import trajectory
from training.batch import collate, shift_for_next_token, token_logprobs
from training.config import RolloutCorrectionConfig
from training.losses import (
    RLLoss,
    aggregate,
    entropy_bonus,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    kl_reward,
    mismatch_stats,
    policy_loss,
    rollout_weights,
    value_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 100.0, 0.0], [50.0, 50.0, 50.0]])  # [B, T]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # row 2 has no model token


def test_aggregations_by_hand():
    # Valid: row 0 = 1 + 2 + 3 = 6 (3 tokens), row 1 = 4 (1 token); 100 and row 2 are masked.
    assert aggregate(LOSS, MASK, "token_mean").item() == pytest.approx(10 / 4)  # 2.5
    assert aggregate(LOSS, MASK, "seq_mean_token_mean").item() == pytest.approx((6 / 3 + 4 / 1) / 2)  # 3
    assert aggregate(LOSS, MASK, "dapo", global_tokens=8).item() == pytest.approx(10 / 8)
    assert aggregate(LOSS, MASK, "dapo").item() == pytest.approx(10 / 4)
    assert aggregate(LOSS, MASK, "dr_grpo", max_len=5).item() == pytest.approx(10 / (3 * 5))
    assert aggregate(LOSS, MASK, "dr_grpo").item() == pytest.approx(10 / (3 * 3))  # max_len defaults to T
    with pytest.raises(RegistryError, match="unknown loss aggregation 'sum'"):
        aggregate(LOSS, MASK, "sum")


def test_dapo_is_global_across_micro_batches():
    # Split rows 0 | 1 into two micro-batches. token_mean per micro-batch: 6/3 = 2 and 4/1 = 4,
    # averaged by gradient accumulation -> 3 (row 1's single token weighs 3x). dapo with the
    # global count 4: 6/4 + 4/4 = 2.5 = token_mean of the whole batch.
    per_mb = [aggregate(LOSS[i : i + 1], MASK[i : i + 1], "token_mean").item() for i in (0, 1)]
    assert sum(per_mb) / 2 == pytest.approx(3.0)
    dapo = [aggregate(LOSS[i : i + 1], MASK[i : i + 1], "dapo", global_tokens=4).item() for i in (0, 1)]
    assert sum(dapo) == pytest.approx(2.5)


def test_policy_loss_clips_both_sides_by_hand():
    # log-ratios .5, -.5, -.5, .5 -> ρ = 1.648721, .606531, .606531, 1.648721; A = +1, -1, +1, -1.
    # t0: max(-1.648721, -1.2) = -1.2        (A > 0, ρ above 1 + .2: clipped)
    # t1: max(.606531, .8) = .8               (A < 0, ρ below 1 - .2: clipped)
    # t2: max(-.606531, -.8) = -.606531       (A > 0, ρ low: the pessimistic term is unclipped)
    # t3: max(1.648721, 1.2) = 1.648721       (A < 0, ρ high: unclipped)
    # token_mean = (-1.2 + .8 - .606531 + 1.648721) / 4 = .160548; clip_frac = 2/4.
    logp = torch.tensor([[0.5, -0.5, -0.5, 0.5]], requires_grad=True)
    old = torch.zeros(1, 4)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, stats = policy_loss(logp, old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.2)
    assert loss.item() == pytest.approx(0.160548, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["approx_kl"] == pytest.approx(0.125)  # ½ × .25 on every token
    # Gradients: 0 where clipped; -A·ρ / 4 elsewhere:
    # t2 = -.606531 / 4 = -.151633, t3 = 1.648721 / 4 = .412180.
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 0.0, -0.151633, 0.412180], abs=1e-6)
    # Clip-higher (DAPO): 1 + .8 lets t0 through, -1.648721 replaces -1.2:
    # (-1.648721 + .8 - .606531 + 1.648721) / 4 = .193469 / 4 = .048367.
    loss_hi, _ = policy_loss(logp.detach(), old, adv, torch.ones(1, 4), clip_low=0.2, clip_high=0.8)
    assert loss_hi.item() == pytest.approx(0.048367, abs=1e-6)


def test_kl_estimators_by_hand():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-2.0, -1.0]])  # ref - logp = -1, +1
    assert kl_penalty(logp, ref, "k1")[0].tolist() == pytest.approx([1.0, -1.0])  # logp - ref
    assert kl_penalty(logp, ref, "k2")[0].tolist() == pytest.approx([0.5, 0.5])  # ½ (logp - ref)²
    # k3 = e^d - d - 1: d = -1 -> .367879 + 1 - 1 = .367879; d = 1 -> 2.718282 - 1 - 1 = .718282.
    assert kl_penalty(logp, ref, "k3")[0].tolist() == pytest.approx([0.367879, 0.718282], abs=1e-6)
    assert kl_penalty(logp, ref, "k3_unclamped")[0].tolist() == pytest.approx([0.367879, 0.718282], abs=1e-6)
    assert kl_penalty(ref, ref, "k3").abs().sum() == 0.0
    with pytest.raises(RegistryError, match="unknown KL estimator 'k4'"):
        kl_penalty(logp, ref, "k4")
    # As a loss term: token_mean of k3 = (.367879 + .718282) / 2 = .543081; with t1 masked, .367879.
    assert kl_loss(logp, ref, torch.ones(1, 2), "k3").item() == pytest.approx(0.543081, abs=1e-6)
    assert kl_loss(logp, ref, torch.tensor([[1.0, 0.0]]), "k3").item() == pytest.approx(0.367879, abs=1e-6)
    # In the reward (PPO, OpenRLHF: k1, β = .1): -.1 × (1, -1) on model tokens, 0 on the masked one.
    r = kl_reward(logp, ref, torch.tensor([[1.0, 0.0]]), beta=0.1)
    assert r[0].tolist() == pytest.approx([-0.1, 0.0])


def test_k3_is_clamped_as_verls_low_var_kl():
    # d = ref - logp. d = 2: e² - 3 = 4.389056 (inside the clamp, unchanged).
    # d = 3: e³ - 4 = 16.085537 -> clamped to 10; unclamped stays 16.085537.
    # d = 100: verl first clamps d to 20 (e^20 - 21, then 10); the gradient is 0 and finite, while
    # the unclamped e^100 overflows float32 to inf.
    logp = torch.tensor([[0.0, 0.0, -100.0]], requires_grad=True)
    ref = torch.tensor([[2.0, 3.0, 0.0]])
    kl = kl_penalty(logp, ref, "k3")
    assert kl[0].tolist() == pytest.approx([4.389056, 10.0, 10.0], abs=1e-5)
    kl.sum().backward()
    # d/dlogp (e^d - d - 1) = 1 - e^d = 1 - e² = -6.389056 inside; 0 where clamped.
    assert logp.grad[0].tolist() == pytest.approx([-6.389056, 0.0, 0.0], abs=1e-5)
    assert kl_penalty(logp.detach(), ref, "k3_unclamped")[0, 1].item() == pytest.approx(16.085537, abs=1e-5)
    assert kl_penalty(logp.detach(), ref, "k3_unclamped")[0, 2].item() == float("inf")


def test_entropy_by_hand():
    # Uniform over 4: ln 4 = 1.386294. Logits [0, ln 3] -> p = .25, .75:
    # H = .25 × 1.386294 + .75 × .287682 = .346574 + .215762 = .562335.
    logits = torch.tensor([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3), -1e9, -1e9]]])  # [1, 2, 4]
    assert entropy_from_logits(logits)[0].tolist() == pytest.approx([1.386294, 0.562335], abs=1e-5)
    assert entropy_bonus(logits, torch.tensor([[0.0, 1.0]])).item() == pytest.approx(0.562335, abs=1e-5)


def test_value_loss_clip_by_hand():
    # t0: V 1, V_old 0, R 2: clipped V = .2; max((1-2)², (.2-2)²) = max(1, 3.24) = 3.24 -> ×½ = 1.62.
    # t1: V .1 (inside the clip): both errors (1.9)² = 3.61 -> 1.805.
    # t2: V -1, V_old 0, R -.9: unclipped (-.1)² = .01, clipped (-.2 + .9)² = .49 -> .245.
    # mean = (1.62 + 1.805 + .245) / 3 = 1.223333; clipped error larger on t0, t2 -> 2/3.
    v = torch.tensor([[1.0, 0.1, -1.0]])
    old = torch.zeros(1, 3)
    ret = torch.tensor([[2.0, 2.0, -0.9]])
    loss, stats = value_loss(v, old, ret, torch.ones(1, 3), clip=0.2)
    assert loss.item() == pytest.approx(1.223333, abs=1e-5)
    assert stats["vf_clip_frac"] == pytest.approx(2 / 3)


def multi_turn() -> Trajectory:
    return trajectory(
        ["a"],
        segments=[
            Segment("prompt", [1, 2]),
            Segment("model", [3, 4], "<search>x</search>", logprobs=[-0.1, -0.2]),
            Segment("observation", [5, 6, 7], "<information>d</information>"),
            Segment("model", [8], "<answer>a</answer>", logprobs=[-0.3]),
        ],
    )


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "dapo", "dr_grpo"])
def test_observation_tokens_get_no_loss_and_no_gradient(agg):
    b = collate([multi_turn()], rewards=[1.0], group_ids=[0], pad_id=0)
    logits = torch.randn(1, b.input_ids.shape[1], 12, requires_grad=True)  # [B, L, V]
    lg, targets, mask = shift_for_next_token(logits, b.input_ids, b.loss_mask)  # [B, T, V], [B, T], [B, T]
    logp = token_logprobs(lg, targets)  # [B, T]
    logp.retain_grad()
    loss, _ = policy_loss(logp, logp.detach() + 0.3, torch.ones_like(logp), mask, agg=agg)
    loss = loss + 0.1 * kl_loss(logp, logp.detach() - 0.5, mask, "k3") - 0.01 * entropy_bonus(lg, mask)
    loss.backward()
    # Targets 0..6 are tokens 2..8: prompt(2), model(3, 4), obs(5, 6, 7), model(8).
    assert mask[0].tolist() == [0, 1, 1, 0, 0, 0, 1]
    for pos, m in enumerate(mask[0].tolist()):
        assert (logp.grad[0, pos] != 0) == bool(m), pos
        assert (logits.grad[0, pos].abs().sum() > 0) == bool(m), pos
    assert logits.grad[0, -1].abs().sum() == 0  # the last position predicts nothing


def test_rl_loss_composes_policy_kl_and_entropy_by_hand():
    from types import SimpleNamespace

    from training.losses import RLLoss

    logp, old = torch.tensor([[0.5, -0.5, 0.0]]), torch.zeros(1, 3)
    adv, mask = torch.tensor([[1.0, -1.0, 2.0]]), torch.ones(1, 3)
    logits = torch.zeros(1, 3, 4)  # uniform over 4: entropy ln 4 on every token
    ref = logp - 1.0  # ref - logp = -1 -> k3 = e^-1 + 1 - 1 = e^-1
    algo = SimpleNamespace(
        clip_low=0.2,
        clip_high=0.2,
        loss_agg="token_mean",
        kl_coef=0.1,
        kl_estimator="k3",
        kl_in_reward=False,
        entropy_coef=0.01,
        max_len=None,
        rollout_correction=RolloutCorrectionConfig(),
    )
    loss, st = RLLoss.from_config(algo)(logp, old, adv, mask, entropy_from_logits(logits), ref)
    policy = (-1.2 + 0.8 - 2.0) / 3  # the clipped policy loss of test_policy_loss_clips_both_sides_by_hand
    assert loss.item() == pytest.approx(policy + 0.1 * math.exp(-1) - 0.01 * math.log(4), rel=1e-5)
    assert st["kl"] == pytest.approx(math.exp(-1)) and st["entropy"] == pytest.approx(math.log(4))
    assert st["clip_frac"] == pytest.approx(2 / 3)
    # KL folded into the rewards (PPO): no KL term.
    no_kl, st = RLLoss(kl_coef=0.1, kl_in_reward=True)(logp, old, adv, mask, entropy_from_logits(logits), ref)
    assert no_kl.item() == pytest.approx(policy) and "kl" not in st


def test_rl_loss_aggregates_kl_and_entropy_like_the_policy_loss():
    """verl's actor: agg_loss(kld, mask, loss_agg_mode) and agg_loss(entropy, ...), with the policy's mode.

    Row 0: 3 tokens, A = 1, ref = logp - 1 (k3 = e^-1 = .367879); row 1: 1 token (2 masked), A = 2,
    ref = logp + 1 (k3 = e - 2 = .718282). logp = old: ratio 1, per-token policy loss -A.
    Entropy ln 4 = 1.386294 on every token (uniform logits over 4)."""
    from training.losses import RLLoss

    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    ref = torch.tensor([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0]])
    logits = torch.zeros(2, 3, 4)
    e1, e2, ln4 = math.exp(-1), math.e - 2, math.log(4)
    # seq_mean_token_mean: policy (-1 + -2) / 2 = -1.5; KL (e1 + e2) / 2 = .543081 (token_mean would
    # give (3·e1 + e2) / 4 = .455480, the old, mis-weighted value); entropy ln 4.
    f = RLLoss(agg="seq_mean_token_mean", kl_coef=0.1, entropy_coef=0.01)
    loss, st = f(logp, logp, adv, mask, entropy_from_logits(logits), ref)
    assert loss.item() == pytest.approx(-1.5 + 0.1 * (e1 + e2) / 2 - 0.01 * ln4, rel=1e-6)
    assert st["kl"] == pytest.approx((3 * e1 + e2) / 4, rel=1e-6)  # logged as the token mean
    # dapo over a step of 10 tokens, 2 accumulation steps: every term is Σ/10, and the whole sum × 2.
    # Σ policy = -(3·1 + 2) = -5; Σ KL = 3·e1 + e2 = 1.821920; Σ entropy = 4·ln 4 = 5.545177.
    # 2 × (-.5 + .1 × .182192 - .01 × .554518) = -.974652 (before, KL and entropy escaped the × 2:
    # 2 × -.5 + .1 × .455480 - .01 × 1.386294 = -.968315).
    f = RLLoss(agg="dapo", kl_coef=0.1, entropy_coef=0.01)
    loss, _ = f(logp, logp, adv, mask, entropy_from_logits(logits), ref, global_tokens=10, grad_accum=2)
    assert loss.item() == pytest.approx(2 * (-5 / 10 + 0.1 * (3 * e1 + e2) / 10 - 0.01 * 4 * ln4 / 10), rel=1e-6)
    assert loss.item() == pytest.approx(-0.974652, abs=1e-6)
    # dr_grpo: a constant denominator rows × W = 2 × 3 for every term.
    f = RLLoss(agg="dr_grpo", kl_coef=0.1, entropy_coef=0.01)
    loss, _ = f(logp, logp, adv, mask, entropy_from_logits(logits), ref)
    assert loss.item() == pytest.approx((-5 + 0.1 * (3 * e1 + e2) - 0.01 * 4 * ln4) / 6, rel=1e-6)


def test_rl_loss_entropy_only_when_given_and_required_by_its_coefficient():
    from training.losses import RLLoss

    logp, mask = torch.zeros(1, 3), torch.ones(1, 3)
    loss, st = RLLoss()(logp, logp, torch.ones(1, 3), mask)  # coefficient 0, no entropy: not computed
    assert "entropy" not in st and loss.item() == pytest.approx(-1.0)
    assert RLLoss(entropy_coef=0.01).needs_entropy and not RLLoss().needs_entropy
    with pytest.raises(ValueError, match="entropy_coef != 0 needs the per-token entropy"):
        RLLoss(entropy_coef=0.01)(logp, logp, torch.ones(1, 3), mask)


# ---- rollout correction (algo.rollout_correction) -------------------------------------------------
# old_logp = the trainer's pre-update policy (AReaL's proximal), behav_logp = the backend's log-probs
# of the tokens it sampled (the behaviour policy); ρ = exp(old − behav), per token or per row.
RC = RolloutCorrectionConfig
AREAL_NO_CAP = RC("tis", "token", cap=None)  # AReaL's decoupled loss without behav_imp_weight_cap


def corrected_loss(logp, old, adv, mask, behav, rc, **kw):
    """The policy loss with the correction's weights, as RLLoss applies them."""
    return policy_loss(logp, old, adv, mask, is_weight=rollout_weights(old, behav, mask, rc)[0], **kw)


@pytest.mark.parametrize(
    "rc", [RC("tis"), RC("tis", "sequence", cap=3.0), RC("mask", hi=2.0), RC("mask", "sequence", hi=3.0), AREAL_NO_CAP]
)
def test_a_correction_with_behaviour_equal_to_old_is_the_plain_loss(rc):
    # The clipping example above: ρ = e⁰ = 1 on every token (and row), so every term is unchanged:
    # .160548, gradient [0, 0, −.151633, .412180], clip_frac 2/4; nothing capped or masked.
    logp = torch.tensor([[0.5, -0.5, -0.5, 0.5]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 4), torch.tensor([[1.0, -1.0, 1.0, -1.0]]), torch.ones(1, 4)
    plain, plain_st = policy_loss(logp, old, adv, mask)
    fixed, st = RLLoss(correction=rc)(logp, old, adv, mask, behav_logp=old.clone())
    assert torch.equal(fixed, plain) and fixed.item() == pytest.approx(0.160548, abs=1e-6)
    (g_plain,) = torch.autograd.grad(plain, logp)
    (g_fixed,) = torch.autograd.grad(fixed, logp)
    assert torch.equal(g_fixed, g_plain)
    assert g_fixed[0].tolist() == pytest.approx([0.0, 0.0, -0.151633, 0.412180], abs=1e-6)
    assert st == plain_st  # clip_frac, approx_kl, ratio_mean: against the old (proximal) policy
    m = mismatch_stats(old, old.clone(), mask, rc)
    assert m["mismatch/abs_log_ratio"] == m["mismatch/kl_k3"] == m["mismatch/corrected_frac"] == 0.0
    assert m["mismatch/ratio_p5"] == m["mismatch/ratio_p50"] == m["mismatch/ratio_p95"] == 1.0
    assert m["mismatch/weight_mean"] == 1.0


def test_untruncated_token_weights_are_arealss_decoupled_loss_by_hand():
    """Row 0 on-policy (behav = old), row 1 stale: behav below old by ln 2 on t1 and .5 on t2.

    old (proximal) = 0, so the PPO ratio is e^logp.  mask all 1, N = 6 tokens, token_mean, clip .2.
    row 0: logp 0, .1, −.1; A 1, 1, −1; w 1, 1, 1.
      t0: ρ 1                -> −1
      t1: ρ 1.105171 (inside) -> −1.105171
      t2: ρ .904837, A −1     -> .904837                      row 0 Σ = −1.200334
    row 1: logp 0, .3, .3; A 1, −1, 1; w = e^0 = 1, e^(ln 2) = 2, e^.5 = 1.648721.
      t0: ρ 1                                  -> −1 × 1 = −1
      t1: ρ 1.349859, A −1: max(1.349859, 1.2) = 1.349859 (unclipped) -> × 2 = 2.699718
      t2: ρ 1.349859, A 1: max(−1.349859, −1.2) = −1.2 (clipped) -> × 1.648721 = −1.978465
                                                                  row 1 Σ = −.278747
    loss = (−1.200334 − .278747) / 6 = −1.479081 / 6 = −.246514
    (the plain loss would weigh row 1 as −1 + 1.349859 − 1.2: (−1.200334 − .850141) / 6 = −.341746).
    Gradient w.r.t. logp: −A·ρ·w / 6 where the unclipped term is active, 0 where clipped:
      row 0: −1/6 = −.166667, −1.105171/6 = −.184195, .904837/6 = .150806
      row 1: −1/6 = −.166667, 1.349859 × 2 / 6 = .449953, 0
    Mismatch: |log ρ| mean (ln 2 + .5) / 6 = .198858; weight mean (1 × 4 + 2 + 1.648721) / 6 = 1.274787.
    """
    logp = torch.tensor([[0.0, 0.1, -0.1], [0.0, 0.3, 0.3]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, -1.0], [1.0, -1.0, 1.0]])
    behav = torch.tensor([[0.0, 0.0, 0.0], [0.0, -math.log(2), -0.5]])
    mask = torch.ones(2, 3)
    loss, st = corrected_loss(logp, old, adv, mask, behav, AREAL_NO_CAP)
    assert loss.item() == pytest.approx(-0.246514, abs=1e-6)
    assert policy_loss(logp, old, adv, mask)[0].item() == pytest.approx(-0.341746, abs=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.166667, -0.184195, 0.150806], abs=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([-0.166667, 0.449953, 0.0], abs=1e-6)
    assert st["clip_frac"] == pytest.approx(1 / 6)
    m = mismatch_stats(old, behav, mask, AREAL_NO_CAP)
    assert m["mismatch/abs_log_ratio"] == pytest.approx(0.198858, abs=1e-6)
    assert m["mismatch/weight_mean"] == pytest.approx(1.274787, abs=1e-6)
    assert m["mismatch/corrected_frac"] == 0.0  # no cap: nothing truncated


# Four valid tokens whose ratios are 1, e^.5 = 1.648721, 3 and e^1e4 (bounded to e^20 ≈ 4.9e8, as
# verl bounds it: exp would overflow to inf); t4 is masked (ρ = e^50 there must count nowhere).
# logp = old = 0 (the PPO ratio is 1), A = 1, 2, 3, 4: each term is −A·w.
HEAVY_BEHAV = torch.tensor([[0.0, -0.5, -math.log(3), -1e4, -50.0]])
HEAVY_MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
HEAVY_ADV = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])


def test_mask_drops_heavy_tokens_but_keeps_them_in_the_denominator():
    """band [0, 2] (AReaL's behav_imp_weight_cap 2, TRL's token_mask with cap 2): w = 1, 1.648721
    kept; 3 and e^20 masked to 0.  kept terms −1 × 1 = −1, −2 × 1.648721 = −3.297443.
    AReaL and TRL divide by the 4 valid tokens, masked ones included:
      (−1 − 3.297443) / 4 = −1.074361   (not / 2 kept = −2.148721).
    Gradient: −A·w / 4 = −.25, −.824361, then 0, 0 (finite although ρ is huge on t3), 0 on t4.
    Mismatch: masked 2 of 4; weight mean over the kept (1 + 1.648721) / 2 = 1.324361."""
    logp = torch.zeros(1, 5, requires_grad=True)
    old = torch.zeros(1, 5)
    rc = RC("mask", hi=2.0)
    loss, _ = corrected_loss(logp, old, HEAVY_ADV, HEAVY_MASK, HEAVY_BEHAV, rc)
    assert loss.item() == pytest.approx(-1.074361, abs=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.824361, 0.0, 0.0, 0.0], abs=1e-6)
    m = mismatch_stats(old, HEAVY_BEHAV, HEAVY_MASK, rc)
    assert m["mismatch/corrected_frac"] == pytest.approx(0.5)
    assert m["mismatch/weight_mean"] == pytest.approx(1.324361, abs=1e-6)
    # A wider band (hi 3.5) keeps t2 (w = 3): (−1 − 3.297443 − 9) / 4 = −3.324361; t3 still masked.
    loss, _ = corrected_loss(logp.detach(), old, HEAVY_ADV, HEAVY_MASK, HEAVY_BEHAV, RC("mask", hi=3.5))
    assert loss.item() == pytest.approx(-3.324361, abs=1e-5)
    # A lower bound: lo .5 masks a token whose ratio is 1/e = .367879 (behav above old by 1).
    w, corrected = rollout_weights(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), RC("mask", lo=0.5))
    assert w.tolist() == [[0.0, 1.0]] and corrected.tolist() == [[True, False]]


def test_tis_truncates_heavy_tokens_at_the_cap():
    """cap 2 (verl's rollout_is token level, TRL's token_truncate): w = min(ρ, 2) = 1, 1.648721, 2, 2.
    terms −1, −3.297443, −3 × 2 = −6, −4 × 2 = −8: Σ −18.297443 / 4 = −4.574361; 2 of 4 capped."""
    logp, old = torch.zeros(1, 5), torch.zeros(1, 5)
    rc = RC("tis", cap=2.0)
    w, corrected = rollout_weights(old, HEAVY_BEHAV, HEAVY_MASK, rc)
    assert w[0].tolist() == pytest.approx([1.0, 1.648721, 2.0, 2.0, 0.0], abs=1e-6)
    assert corrected[0].tolist() == [False, False, True, True, False]
    loss, _ = corrected_loss(logp, old, HEAVY_ADV, HEAVY_MASK, HEAVY_BEHAV, rc)
    assert loss.item() == pytest.approx(-4.574361, abs=1e-5)
    m = mismatch_stats(old, HEAVY_BEHAV, HEAVY_MASK, rc)
    assert m["mismatch/corrected_frac"] == pytest.approx(0.5)
    assert m["mismatch/weight_mean"] == pytest.approx((1 + 1.648721 + 2 + 2) / 4, abs=1e-6)


def test_sequence_level_weighs_each_row_by_its_summed_ratio():
    """TRL 0.26's sequence modes (ProRAG: sequence_mask, cap 3): one ratio per row,
    exp Σ(old − behav) over its model tokens, on every token of the row.
    row 0: log ρ .1, .2 (t2 masked) -> Σ .3, ρ = 1.349859; row 1: .5, .7, .4 -> Σ 1.6, ρ = 4.953032.
    logp = old (PPO ratio 1), A = 1 on row 0, 2 on row 1; token_mean over the 5 valid tokens.
      mask, band [0, 3]: row 0 w 1.349859, row 1 masked: (−1.349859 × 2 + 0) / 5 = −.539944
      tis, cap 3:        row 1 w 3: (−2.699718 − 2 × 3 × 3) / 5 = −4.139944
    Mismatch (token level where it is per token): |log ρ| mean 1.9 / 5 = .38; k3 mean
    Σ (e^d − d − 1) / 5 = (.005171 + .021403 + .148721 + .313753 + .091825) / 5 = .116174.
    Quantiles of the 2 row ratios (linear between them): p5 1.349859 + .05 × 3.603173 = 1.530017,
    p50 3.151446, p95 4.772874; 1 of 2 rows masked; kept weight mean 1.349859."""
    old = torch.zeros(2, 3)
    behav = -torch.tensor([[0.1, 0.2, 9.0], [0.5, 0.7, 0.4]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    trl_mask = RC("mask", "sequence", hi=3.0)
    w, corrected = rollout_weights(old, behav, mask, trl_mask)
    assert w.flatten().tolist() == pytest.approx([1.349859, 1.349859, 0.0, 0.0, 0.0, 0.0], abs=1e-6)
    assert corrected.tolist() == [[False, False, False], [True, True, True]]
    assert corrected_loss(old, old, adv, mask, behav, trl_mask)[0].item() == pytest.approx(-0.539944, abs=1e-6)
    trl_truncate = RC("tis", "sequence", cap=3.0)
    assert corrected_loss(old, old, adv, mask, behav, trl_truncate)[0].item() == pytest.approx(-4.139944, abs=1e-6)
    m = mismatch_stats(old, behav, mask, trl_mask)
    assert m["mismatch/abs_log_ratio"] == pytest.approx(0.38, abs=1e-6)
    assert m["mismatch/kl_k3"] == pytest.approx(0.116174, abs=1e-6)
    assert m["mismatch/ratio_p5"] == pytest.approx(1.530017, abs=1e-5)
    assert m["mismatch/ratio_p50"] == pytest.approx(3.151446, abs=1e-5)
    assert m["mismatch/ratio_p95"] == pytest.approx(4.772874, abs=1e-5)
    assert m["mismatch/corrected_frac"] == 0.5 and m["mismatch/weight_mean"] == pytest.approx(1.349859, abs=1e-6)


def test_token_ratio_quantiles_by_hand():
    """ρ = .5, 1, 1.5, 2, 4 (sorted; positions 0..4): p5 at 0.2 -> .5 + .2 × .5 = .6, p50 1.5,
    p95 at 3.8 -> 2 + .8 × 2 = 3.6 (numpy's linear interpolation)."""
    behav = -torch.log(torch.tensor([[2.0, 0.5, 1.0, 4.0, 1.5]]))  # ρ = e^(0 − behav), in another order
    m = mismatch_stats(torch.zeros(1, 5), behav, torch.ones(1, 5), RC())
    assert [m[f"mismatch/ratio_p{q}"] for q in (5, 50, 95)] == pytest.approx([0.6, 1.5, 3.6], abs=1e-6)
    assert mismatch_stats(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2), RC()) == {}  # no valid token
    # A synced engine's gap: d = 1e-4 a token, k3 = e^d − d − 1 ≈ d²/2 = 5e-9 (float32 would give
    # 1.6e-8 or less than 0: the cancellation), so it is computed in float64.
    tiny = mismatch_stats(torch.zeros(1, 3), torch.full((1, 3), -1e-4), torch.ones(1, 3), RC())
    assert tiny["mismatch/kl_k3"] == pytest.approx(5e-9, rel=1e-3)


def test_a_correction_under_every_aggregation_by_hand():
    """logp = old = 0 (ρ_ppo = 1); A = 1 on row 0, 2 on row 1; row 1's t2 is masked.
    row 0: w 1, 1, 1 -> terms −1, −1, −1 (Σ −3, 3 tokens).
    row 1: ρ 1.5, 4 with band [0, 2.5] -> −2 × 1.5 = −3, t1 masked (0) but counted (Σ −3, 2 tokens).
      token_mean:          (−3 − 3) / 5 = −1.2
      seq_mean_token_mean: (−3/3 + −3/2) / 2 = −1.25   (row 1's own denominator keeps the masked token)
      dapo, 10 step tokens: −6 / 10 = −.6; through RLLoss with 2 accumulation steps: × 2 = −1.2
      dr_grpo:             −6 / (2 × 3) = −1.0
    """
    logp, old = torch.zeros(2, 3), torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    behav = torch.tensor([[0.0, 0.0, 0.0], [-math.log(1.5), -math.log(4), 0.0]])
    rc = RC("mask", hi=2.5)

    def loss(agg, **kw):
        return corrected_loss(logp, old, adv, mask, behav, rc, agg=agg, **kw)[0].item()

    assert loss("token_mean") == pytest.approx(-1.2)
    assert loss("seq_mean_token_mean") == pytest.approx(-1.25)
    assert loss("dapo", global_tokens=10) == pytest.approx(-0.6)
    assert loss("dr_grpo") == pytest.approx(-1.0)
    f = RLLoss(agg="dapo", correction=rc)
    assert f(logp, old, adv, mask, global_tokens=10, grad_accum=2, behav_logp=behav)[0].item() == pytest.approx(-1.2)


# ---- the rejections: geo_mask, token_mask, outlier_mask; masked_in_denominator ------------------


def test_geo_mask_rejects_a_row_by_its_geometric_mean_ratio():
    """SkyRL's recommended band [0.99, 1.01] (``sequence_mask_metric: geometric``).
    row 0: log ρ .004, .012 (t2 masked, 9 there counts nowhere) -> mean .008, e^.008 = 1.008032: kept.
    row 1: log ρ .03, −.01, .01 -> mean .01, e^.01 = 1.010050 > 1.01: rejected (its t1 alone is inside).
    (Their products e^.016 and e^.03 would both be outside a [0.99, 1.01] band: the mean is per token.)
    logp = old (PPO ratio 1), A = 1 on row 0, 2 on row 1: each term −A·w, w = 1 kept, 0 rejected.
      token_mean, masked counted (SkyRL, 5 valid):  (−1 − 1 + 0) / 5 = −.4
      token_mean, masked_in_denominator false (2 kept): −2 / 2 = −1.0
      seq_mean_token_mean: counted (−2/2 + 0/3) / 2 = −.5; dropped: row 1 has no token left, −1.0
    Mismatch: 1 of 2 rows rejected; kept weight mean 1."""
    old = torch.zeros(2, 3)
    behav = -torch.tensor([[0.004, 0.012, 9.0], [0.03, -0.01, 0.01]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    rc = RC("geo_mask", lo=0.99, hi=1.01)
    w, corrected = rollout_weights(old, behav, mask, rc)
    assert w.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    assert corrected.tolist() == [[False, False, False], [True, True, True]]
    drop = RC("geo_mask", lo=0.99, hi=1.01, masked_in_denominator=False)
    for agg, counted, dropped in (("token_mean", -0.4, -1.0), ("seq_mean_token_mean", -0.5, -1.0)):
        assert RLLoss(agg=agg, correction=rc)(old, old, adv, mask, behav_logp=behav)[0].item() == pytest.approx(counted)
        assert RLLoss(agg=agg, correction=drop)(old, old, adv, mask, behav_logp=behav)[0].item() == pytest.approx(
            dropped
        )
    m = mismatch_stats(old, behav, mask, rc)
    assert m["mismatch/corrected_frac"] == 0.5 and m["mismatch/weight_mean"] == 1.0


def test_token_mask_rejects_tokens_outside_the_band_with_weight_one_inside():
    """SkyRL's token mask (IcePop's band without its ρ factor), band [0.5, 2] on the heavy tokens:
    ρ 1, 1.648721 kept with weight 1 (not ρ: the `mask` kind, IcePop's M(ρ), gives −1.074361 above);
    3 and e^20 rejected.  terms −1 × 1, −2 × 1, 0, 0:
      counted: −3 / 4 = −.75;   masked_in_denominator false: −3 / 2 = −1.5.
    Gradient counted: −A/4 = −.25, −.5, 0, 0, 0.  2 of 4 tokens rejected.
    A lower bound: ρ = 1/e = .367879 < .5 is rejected too."""
    logp = torch.zeros(1, 5, requires_grad=True)
    old = torch.zeros(1, 5)
    rc = RC("token_mask", lo=0.5, hi=2.0)
    w, corrected = rollout_weights(old, HEAVY_BEHAV, HEAVY_MASK, rc)
    assert w.tolist() == [[1.0, 1.0, 0.0, 0.0, 0.0]]
    assert corrected.tolist() == [[False, False, True, True, False]]
    loss, _ = RLLoss(correction=rc)(logp, old, HEAVY_ADV, HEAVY_MASK, behav_logp=HEAVY_BEHAV)
    assert loss.item() == pytest.approx(-0.75)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.5, 0.0, 0.0, 0.0])
    drop = RC("token_mask", lo=0.5, hi=2.0, masked_in_denominator=False)
    assert RLLoss(correction=drop)(old, old, HEAVY_ADV, HEAVY_MASK, behav_logp=HEAVY_BEHAV)[0].item() == -1.5
    m = mismatch_stats(old, HEAVY_BEHAV, HEAVY_MASK, rc)
    assert m["mismatch/corrected_frac"] == 0.5 and m["mismatch/weight_mean"] == 1.0
    w, _ = rollout_weights(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), torch.ones(1, 2), rc)
    assert w.tolist() == [[0.0, 1.0]]


def test_outlier_mask_rejects_a_row_with_any_token_outside_the_band():
    """SkyRL's outlier mask, band [0.5, 2.5]; A = 1, 2, 3 by row; logp = old.
    row 0: ρ 1, 1.5 (t2 masked: e^50 there counts nowhere)  -> kept, terms −1, −1
    row 1: ρ 1, 3, 1                                          -> rejected (t1), terms 0, 0, 0
    row 2: ρ .4, 1 (t2 masked)                                -> rejected (t0 under .5), 0, 0
      token_mean over 7 valid: −2/7 = −.285714; masked_in_denominator false: −2/2 = −1.0
    token_mask on the same band keeps row 1's t0, t2 and row 2's t1:
      (−1 − 1 − 2 − 2 − 3) / 7 = −9/7 = −1.285714.  2 of 3 rows rejected."""
    old = torch.zeros(3, 3)
    behav = -torch.log(torch.tensor([[1.0, 1.5, 1.0], [1.0, 3.0, 1.0], [0.4, 1.0, 1.0]]))
    behav[0, 2] = -50.0
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([[1.0] * 3, [2.0] * 3, [3.0] * 3])
    rc = RC("outlier_mask", lo=0.5, hi=2.5)
    w, corrected = rollout_weights(old, behav, mask, rc)
    assert w.tolist() == [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert corrected.tolist() == [[False, False, False], [True, True, True], [True, True, False]]
    assert RLLoss(correction=rc)(old, old, adv, mask, behav_logp=behav)[0].item() == pytest.approx(-2 / 7)
    drop = RC("outlier_mask", lo=0.5, hi=2.5, masked_in_denominator=False)
    assert RLLoss(correction=drop)(old, old, adv, mask, behav_logp=behav)[0].item() == pytest.approx(-1.0)
    tok = RC("token_mask", lo=0.5, hi=2.5)
    assert RLLoss(correction=tok)(old, old, adv, mask, behav_logp=behav)[0].item() == pytest.approx(-9 / 7)
    m = mismatch_stats(old, behav, mask, rc)
    assert m["mismatch/corrected_frac"] == pytest.approx(2 / 3)


def test_masked_in_denominator_false_drops_a_masked_token_from_every_term():
    """verl's rejection sampling rewrites response_mask, so the KL and entropy terms lose the token
    too. `mask` band [0, 2] on ρ 1, 4 (t1 masked), A = 1; logp = old = 0; ref = −1 on every token,
    k3 per token e^(−1) + 1 − 1 = .367879; entropy .5 on t0, 1.5 on t1; kl_coef .1, entropy .01.
      counted:  −1/2 + .1 × .367879 − .01 × (.5 + 1.5)/2 = −.5 + .036788 − .01 = −.473212
      dropped:  −1/1 + .1 × .367879 − .01 × .5           = −1 + .036788 − .005 = −.968212"""
    z = torch.zeros(1, 2)
    behav, ref, ent, mask = (
        torch.tensor([[0.0, -math.log(4)]]),
        torch.full((1, 2), -1.0),
        torch.tensor([[0.5, 1.5]]),
        torch.ones(1, 2),
    )
    for counted, want in ((True, -0.473212), (False, -0.968212)):
        f = RLLoss(kl_coef=0.1, entropy_coef=0.01, correction=RC("mask", hi=2.0, masked_in_denominator=counted))
        assert f(z, z, torch.ones(1, 2), mask, ent, ref, behav_logp=behav)[0].item() == pytest.approx(want, abs=1e-6)


def test_rl_loss_with_a_correction_needs_the_behaviour_logprobs_and_without_refuses_them():
    from training.config import AlgoConfig

    logp, mask = torch.zeros(1, 3), torch.ones(1, 3)
    f = RLLoss.from_config(AlgoConfig(rollout_correction=RC("mask", hi=5.0)))
    assert f.corrects and f.correction.hi == 5.0
    with pytest.raises(ValueError, match=r"rollout_correction.kind=mask needs behav_logp"):
        f(logp, logp, torch.ones(1, 3), mask)
    loss, _ = f(logp, logp, torch.ones(1, 3), mask, behav_logp=logp - math.log(2))  # w = 2 everywhere
    assert loss.item() == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="kind=none; set a kind"):
        RLLoss()(logp, logp, torch.ones(1, 3), mask, behav_logp=logp)
    assert not RLLoss.from_config(AlgoConfig()).corrects


def test_rollout_correction_config_is_validated():
    from harness.config import ConfigError, compose
    from training.config import TrainConfig

    for bad in ({"cap": 0.0}, {"cap": float("nan")}, {"hi": 0.9}, {"lo": 1.5, "hi": None}, {"lo": 2.0, "hi": 2.0}):
        with pytest.raises(ValueError, match="rollout_correction"):
            RC("mask", **bad)
    with pytest.raises(ValueError, match="masked_in_denominator=false does not apply to algo.loss_agg=dapo"):
        compose(TrainConfig, [], ["algo.loss_agg=dapo", "algo.rollout_correction.masked_in_denominator=false"])
    cfg = compose(TrainConfig, [], ["algo.rollout_correction.kind=mask", "algo.rollout_correction.level=sequence"])
    assert cfg.algo.rollout_correction == RC("mask", "sequence")
    with pytest.raises(ConfigError, match="level"):
        compose(TrainConfig, [], ["algo.rollout_correction.level=row"])
    # AReaL's keys are gone: its decoupled loss is a rollout correction (one way to ask for it).
    with pytest.raises(ConfigError, match="decoupled_loss"):
        compose(TrainConfig, [], ["algo.decoupled_loss=true"])
