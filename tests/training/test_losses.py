"""Losses, aggregations, KL estimators, entropy and value clipping against hand arithmetic; masks."""

from __future__ import annotations

import math

import pytest
import torch

from harness.registry import RegistryError
from harness.types import Segment, Trajectory
from training.batch import collate, shift_for_next_token, token_logprobs
from training.losses import (
    aggregate,
    entropy_bonus,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    kl_reward,
    policy_loss,
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
    return Trajectory(
        example_id="q",
        question="q",
        answers=["a"],
        method="m",
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
        decoupled_loss=False,
        behav_imp_weight_cap=None,
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


# ---- decoupled PPO (AReaL's ppo_actor_loss_fn, inclusionAI/AReaL areal/utils/functional.py) ----------
# old_logp = the proximal policy (before this update), behav_logp = the policy that generated each token.


def test_decoupled_with_behaviour_equal_to_proximal_is_the_plain_loss():
    # The clipping example above: w = exp(old − behav) = e⁰ = 1 on every token, so every term is
    # unchanged: .160548, gradient [0, 0, −.151633, .412180], clip_frac 2/4.
    logp = torch.tensor([[0.5, -0.5, -0.5, 0.5]], requires_grad=True)
    old, adv, mask = torch.zeros(1, 4), torch.tensor([[1.0, -1.0, 1.0, -1.0]]), torch.ones(1, 4)
    plain, plain_st = policy_loss(logp, old, adv, mask)
    dec, st = policy_loss(logp, old, adv, mask, behav_logp=old.clone(), behav_imp_weight_cap=2.0)
    assert torch.equal(dec, plain) and dec.item() == pytest.approx(0.160548, abs=1e-6)
    (g_plain,) = torch.autograd.grad(plain, logp)
    (g_dec,) = torch.autograd.grad(dec, logp)
    assert torch.equal(g_dec, g_plain)
    assert g_dec[0].tolist() == pytest.approx([0.0, 0.0, -0.151633, 0.412180], abs=1e-6)
    assert st["behav_imp_weight"] == 1.0 and st["behav_kl"] == 0.0 and st["behav_drop_frac"] == 0.0
    assert {k: st[k] for k in plain_st} == plain_st  # clip_frac, approx_kl, ratio_mean: against the proximal
    assert "behav_imp_weight" not in plain_st


def test_decoupled_mixed_versions_by_hand():
    """Row 0 on-policy (behav = old), row 1 stale: behav below old by ln 2 on t1 and .5 on t2.

    old (proximal) = 0, so ρ = e^logp.  mask all 1, N = 6 tokens, token_mean, clip .2.
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
    Stats: w mean (1 + 1 + 1 + 1 + 2 + 1.648721) / 6 = 1.274787; behav_kl (ln 2 + .5) / 6 = .198858.
    """
    logp = torch.tensor([[0.0, 0.1, -0.1], [0.0, 0.3, 0.3]], requires_grad=True)
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, -1.0], [1.0, -1.0, 1.0]])
    behav = torch.tensor([[0.0, 0.0, 0.0], [0.0, -math.log(2), -0.5]])
    mask = torch.ones(2, 3)
    loss, st = policy_loss(logp, old, adv, mask, behav_logp=behav)
    assert loss.item() == pytest.approx(-0.246514, abs=1e-6)
    assert policy_loss(logp, old, adv, mask)[0].item() == pytest.approx(-0.341746, abs=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.166667, -0.184195, 0.150806], abs=1e-6)
    assert logp.grad[1].tolist() == pytest.approx([-0.166667, 0.449953, 0.0], abs=1e-6)
    assert st["behav_imp_weight"] == pytest.approx(1.274787, abs=1e-6)
    assert st["behav_kl"] == pytest.approx(0.198858, abs=1e-6)
    assert st["behav_drop_frac"] == 0.0 and st["clip_frac"] == pytest.approx(1 / 6)


def test_decoupled_cap_drops_heavy_tokens_but_keeps_them_in_the_denominator():
    """cap 2: w = 1, 1.648721, 3, inf are kept, kept, dropped, dropped; t4 is masked (w = e^50 there
    must not count as a drop). logp = old = 0 (ρ = 1), A = 1, 2, 3, 4: terms −A·w.
      kept: −1 × 1 = −1, −2 × 1.648721 = −3.297443; dropped: 0, 0.
    AReaL divides by loss_mask.count_nonzero() = 4 valid tokens, dropped ones included:
      (−1 − 3.297443) / 4 = −1.074361   (not / 2 kept = −2.148721).
    Gradient: −A·w / 4 = −.25, −.824361, then 0, 0 (finite although w = inf on t3), 0 on t4.
    Stats: w mean over kept (1 + 1.648721) / 2 = 1.324361; behav_kl (0 + .5) / 2 = .25; drops 2/4."""
    logp = torch.zeros(1, 5, requires_grad=True)
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    behav = torch.tensor([[0.0, -0.5, -math.log(3), -1e4, -50.0]])  # e^1e4 overflows float32 to inf
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    loss, st = policy_loss(logp, old, adv, mask, behav_logp=behav, behav_imp_weight_cap=2.0)
    assert loss.item() == pytest.approx(-1.074361, abs=1e-6)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.824361, 0.0, 0.0, 0.0], abs=1e-6)
    assert st["behav_imp_weight"] == pytest.approx(1.324361, abs=1e-6)
    assert st["behav_kl"] == pytest.approx(0.25) and st["behav_drop_frac"] == pytest.approx(0.5)
    # A higher cap (3.5) keeps t2 (w = 3): (−1 − 3.297443 − 9) / 4 = −3.324361; t3 (inf) still dropped.
    loss, st = policy_loss(logp.detach(), old, adv, mask, behav_logp=behav, behav_imp_weight_cap=3.5)
    assert loss.item() == pytest.approx(-3.324361, abs=1e-5) and st["behav_drop_frac"] == pytest.approx(0.25)


def test_decoupled_under_every_aggregation_by_hand():
    """logp = old = 0 (ρ = 1); A = 1 on row 0, 2 on row 1; row 1's t2 is masked.
    row 0: w 1, 1, 1 -> terms −1, −1, −1 (Σ −3, 3 tokens).
    row 1: w 1.5, 4 with cap 2.5 -> −2 × 1.5 = −3, t1 dropped (0) but counted (Σ −3, 2 tokens).
      token_mean:          (−3 − 3) / 5 = −1.2
      seq_mean_token_mean: (−3/3 + −3/2) / 2 = −1.25   (row 1's own denominator keeps the drop)
      dapo, 10 step tokens: −6 / 10 = −.6; through RLLoss with 2 accumulation steps: × 2 = −1.2
      dr_grpo:             −6 / (2 × 3) = −1.0
    """
    from training.losses import RLLoss

    logp, old = torch.zeros(2, 3), torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    behav = torch.tensor([[0.0, 0.0, 0.0], [-math.log(1.5), -math.log(4), 0.0]])
    kw = {"behav_logp": behav, "behav_imp_weight_cap": 2.5}
    assert policy_loss(logp, old, adv, mask, agg="token_mean", **kw)[0].item() == pytest.approx(-1.2)
    assert policy_loss(logp, old, adv, mask, agg="seq_mean_token_mean", **kw)[0].item() == pytest.approx(-1.25)
    assert policy_loss(logp, old, adv, mask, agg="dapo", global_tokens=10, **kw)[0].item() == pytest.approx(-0.6)
    assert policy_loss(logp, old, adv, mask, agg="dr_grpo", **kw)[0].item() == pytest.approx(-1.0)
    f = RLLoss(agg="dapo", decoupled=True, behav_imp_weight_cap=2.5)
    loss, st = f(logp, old, adv, mask, global_tokens=10, grad_accum=2, behav_logp=behav)
    assert loss.item() == pytest.approx(-1.2) and st["behav_drop_frac"] == pytest.approx(1 / 5)
    assert st["behav_imp_weight"] == pytest.approx((3 + 1.5) / 4)


def test_rl_loss_decoupled_needs_the_behaviour_logprobs_and_plain_refuses_them():
    from training.config import AlgoConfig
    from training.losses import RLLoss

    logp, mask = torch.zeros(1, 3), torch.ones(1, 3)
    f = RLLoss.from_config(AlgoConfig(decoupled_loss=True, behav_imp_weight_cap=5.0))
    assert f.decoupled and f.behav_imp_weight_cap == 5.0
    with pytest.raises(ValueError, match=r"decoupled=True.*needs behav_logp"):
        f(logp, logp, torch.ones(1, 3), mask)
    loss, st = f(logp, logp, torch.ones(1, 3), mask, behav_logp=logp - math.log(2))  # w = 2 everywhere
    assert loss.item() == pytest.approx(-2.0) and st["behav_imp_weight"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="set algo.decoupled_loss=true"):
        RLLoss()(logp, logp, torch.ones(1, 3), mask, behav_logp=logp)
    assert not RLLoss.from_config(AlgoConfig()).decoupled


def test_behav_imp_weight_cap_is_validated_as_areal_does():
    from harness.config import compose
    from training.config import AlgoConfig, TrainConfig

    assert AlgoConfig(decoupled_loss=True, behav_imp_weight_cap=5.0).behav_imp_weight_cap == 5.0
    assert AlgoConfig(decoupled_loss=True).behav_imp_weight_cap is None  # no cap: every token kept
    for cap in (1.0, 0.5, -2.0, float("nan")):  # AReaL: "must be > 1.0"
        with pytest.raises(ValueError, match="algo.behav_imp_weight_cap must be > 1.0"):
            AlgoConfig(decoupled_loss=True, behav_imp_weight_cap=cap)
    # AReaL's help: "use_decoupled_loss must be true" for the cap.
    with pytest.raises(ValueError, match="applies to the decoupled loss only"):
        AlgoConfig(behav_imp_weight_cap=5.0)
    cfg = compose(TrainConfig, [], ["algo.decoupled_loss=true", "algo.behav_imp_weight_cap=3"])
    assert cfg.algo.decoupled_loss and cfg.algo.behav_imp_weight_cap == 3.0
