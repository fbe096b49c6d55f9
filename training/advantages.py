"""Advantage estimators: small pure torch functions with a shape comment on every tensor (REFERENCE §2).

Shapes: ``B`` rollouts, ``T`` per-token positions (targets, already shifted by the collator);
``mask`` [B, T] is 1 on model-generated tokens only, so prompt and observation tokens never get
an advantage. Groups are rollouts of the same prompt and ``group_ids`` [B] is the PROMPT's index
in the batch: a fresh id per sample makes every group a singleton and silently zeroes GRPO.

Conventions chosen here (and why):

- Group std is the unbiased one (``torch.std``), as verl's ``compute_grpo_outcome_advantage``
  and OpenRLHF's ``group_norm``; ε is each one's own (verl 1e-6, OpenRLHF 1e-9). A singleton
  group has no baseline, so its advantage is 0 (verl instead uses mean 0, std 1).
- Batch whitening follows each reference exactly. Reinforce++ (OpenRLHF's replay-buffer
  ``normalize``, as R1-Searcher's OpenRLHF fork runs it): (x − mean)·rsqrt(max(var_pop, 1e-8)).
  GAE (verl's ``masked_whiten``): (x − mean)·rsqrt(var_unbiased + 1e-8). Both over every valid
  token of the whole step's batch, every rank's: the sums are all-reduced when torch.distributed
  runs, as OpenRLHF's ``normalize`` all-reduces and verl whitens the gathered batch on its driver.
- GAE runs over model-token positions only: an observation token in the middle of a multi-turn
  rollout is skipped, i.e. the "next state" of a model token is the next MODEL token. This is
  verl's ``compute_gae_advantage_return`` ("skip values and TD-error on observation tokens").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from harness.registry import Registry
from training.algo_config import AlgoConfig

if TYPE_CHECKING:  # the estimators stay light to import (the recipe's check loads this registry)
    from harness.types import Trajectory
    from training.rewards import StepScorer


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std of its group's rewards; std 0 for singleton groups."""
    mean = torch.zeros_like(rewards)  # [B]
    std = torch.zeros_like(rewards)  # [B]
    for g in torch.unique(group_ids):
        sel = group_ids == g  # [B] bool
        r = rewards[sel]  # [n_g]
        mean[sel] = r.mean()
        std[sel] = r.std(unbiased=True) if r.numel() > 1 else r.new_zeros(())
    return mean, std


def to_tokens(adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-sequence advantage to its valid tokens.  [B], [B, T] → [B, T]"""
    return adv[:, None] * mask.to(adv.dtype)


def grpo(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> torch.Tensor:
    """GRPO: A_i = (R_i − mean_g) / (std_g + ε) (no division when ``norm_by_std`` is False, Dr. GRPO).

    rewards [B], group_ids [B] → [B]; with ``mask`` [B, T] it is broadcast to tokens → [B, T].
    """
    r = rewards.float()  # [B]
    mean, std = _group_stats(r, group_ids)  # [B], [B]
    adv = r - mean  # [B]
    if norm_by_std:
        adv = adv / (std + eps)
    single = torch.stack([(group_ids == g).sum() == 1 for g in group_ids])  # [B] bool
    adv = torch.where(single, torch.zeros_like(adv), adv)  # [B]: no baseline → no signal
    return adv if mask is None else to_tokens(adv, mask)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last valid token (0 for an all-masked row).  [B, T] → [B]"""
    T = mask.shape[1]
    return (mask.bool() * torch.arange(T, device=mask.device)[None, :]).argmax(dim=1)  # [B]


def outcome_to_tokens(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sequence's scalar reward on its last valid (model) token.  [B], [B, T] → [B, T]"""
    token_r = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)  # [B, T]
    has = mask.bool().any(dim=1)  # [B]
    rows = torch.arange(mask.shape[0], device=mask.device)  # [B]
    token_r[rows, last_token_index(mask)] = torch.where(has, rewards.float(), torch.zeros_like(rewards.float()))
    return token_r


def returns_to_go(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = r_t + γ·G_{t'} with t' the next VALID token (masked tokens are skipped, get 0).  → [B, T]"""
    out = torch.zeros_like(token_rewards)  # [B, T]
    running = torch.zeros(token_rewards.shape[0], device=token_rewards.device)  # [B]
    for t in reversed(range(token_rewards.shape[1])):
        valid = mask[:, t].bool()  # [B]
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        out[:, t] = torch.where(valid, running, torch.zeros_like(running))
    return out


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x − mean) / std (population) over the valid tokens of the whole batch.  [B, T] → [B, T]"""
    vals = x[mask.bool()]  # [N_valid]
    if vals.numel() < 2:  # std undefined: only centre
        return x - (vals.mean() if vals.numel() else 0.0)
    return (x - vals.mean()) / (vals.std(unbiased=False) + eps)


def whiten_rsqrt(x: torch.Tensor, mask: torch.Tensor, unbiased: bool, eps: float = 1e-8) -> torch.Tensor:
    """Whitening as verl and OpenRLHF write it: (x − mean) · rsqrt(var), over the valid tokens.

    ``unbiased=True`` is verl's ``masked_whiten`` (Bessel-corrected var, ``rsqrt(var + eps)``);
    ``unbiased=False`` is OpenRLHF's ``normalize`` (population var, ``rsqrt(max(var, eps))``).
    A constant input thus scales by at most 1/√eps = 1e4, never by 1/eps. The mean and variance
    are over every rank's valid tokens (all-reduced sums) when torch.distributed runs.  [B, T] → [B, T]
    """
    m = mask.to(x.dtype)  # [B, T]
    n, total = _all_ranks_sum(torch.stack([m.sum(), (x * m).sum()]))  # scalars over every rank
    if n < 2:  # variance undefined: only centre
        return (x - total / n.clamp(min=1)) * m
    mean = total / n
    var = _all_ranks_sum((((x - mean) ** 2) * m).sum()[None])[0] / n
    if unbiased:
        return (x - mean) * torch.rsqrt(var * n / (n - 1) + eps) * m
    return (x - mean) * var.clamp(min=eps).rsqrt() * m


def _all_ranks_sum(t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over every rank when torch.distributed runs with more than one, else ``t``."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t)
    return t


def outcome_returns(
    per_seq: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, token_penalty: torch.Tensor | None = None
) -> torch.Tensor:
    """OpenRLHF's REINFORCE returns: each row's scalar on its last model token, plus the per-token
    KL penalty ``token_penalty`` (−β·KL_t, its ``compute_reward``; None without KL), then the
    return-to-go (``get_cumulative_returns``).  per_seq [B], mask [B, T] → [B, T]"""
    token_r = outcome_to_tokens(per_seq, mask)  # [B, T]
    if token_penalty is not None:
        token_r = token_r + token_penalty * mask
    return returns_to_go(token_r, mask, gamma)


def reinforce_pp(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    eps: float = 1e-8,
    token_penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reinforce++ with a group-mean baseline, as R1-Searcher runs it (its OpenRLHF fork,
    ``--advantage_estimator reinforce_baseline``): subtract the group mean (no std), then
    :func:`outcome_returns` (last token, KL penalty, return-to-go), then whiten over every valid
    token of the batch with OpenRLHF's formula (:func:`whiten_rsqrt`).  rewards [B] → [B, T]"""
    mean, _ = _group_stats(rewards.float(), group_ids)  # [B]
    returns = outcome_returns(rewards.float() - mean, mask, gamma, token_penalty)  # [B, T]
    return whiten_rsqrt(returns, mask, unbiased=False, eps=eps)


def group_norm(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    eps: float = 1e-9,
    token_penalty: torch.Tensor | None = None,
) -> torch.Tensor:
    """OpenRLHF's ``--advantage_estimator group_norm`` (R1-Searcher stage 1): (R − mean_g) /
    (std_g + 1e-9) with the unbiased group std, then :func:`outcome_returns` (last token, the
    −β·KL_t penalty, return-to-go). No batch whitening: its trainer skips the replay buffer's
    ``normalize`` for group_norm. (OpenRLHF then clips the normalised reward to ±10, which a
    group of n ≤ 100 cannot reach: |z| ≤ (n − 1)/√n.)  rewards [B] → [B, T]"""
    z = grpo(rewards, group_ids, eps=eps)  # [B]: a singleton group gets 0 (OpenRLHF: NaN)
    return outcome_returns(z, mask, gamma, token_penalty)


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
    eps: float = 1e-8,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over model tokens only (PPO; Search-R1 uses γ = λ = 1).

    δ_t = r_t + γ·V_{t'} − V_t and A_t = δ_t + γλ·A_{t'}, where t' is the next valid token (0
    after the last). Observation tokens (mask 0) in the middle of a rollout are skipped, as verl's
    multi-turn GAE does. Returns (advantages, returns) [B, T], zero on masked positions;
    returns = A + V are the critic's targets. ``whiten=True`` whitens the advantages over the
    batch's valid tokens afterwards (verl does; the returns are left as they are).
    """
    B, T = token_rewards.shape
    adv = torch.zeros(B, T, device=values.device)  # [B, T]
    next_value = torch.zeros(B, device=values.device)  # [B] value at the next valid token
    next_adv = torch.zeros(B, device=values.device)  # [B] advantage at the next valid token
    for t in reversed(range(T)):
        valid = mask[:, t].bool()  # [B]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]  # [B]
        a = delta + gamma * lam * next_adv  # [B]
        adv[:, t] = torch.where(valid, a, torch.zeros_like(a))
        # An observation token must not become anyone's "next state": carry the old values over it.
        next_value = torch.where(valid, values[:, t], next_value)
        next_adv = torch.where(valid, a, next_adv)
    returns = (adv + values) * mask  # [B, T]
    if whiten:
        adv = whiten_rsqrt(adv, mask, unbiased=True, eps=eps)
    return adv, returns


# ---- ProRAG dual-granularity -------------------------------------------------------------------
def step_score_tensor(trajs: list[Trajectory], scorer: StepScorer, T: int) -> torch.Tensor:
    """Paint each step's score on its tokens, in the TARGET axis (token i is target i − 1).  → [B, T]

    ``scorer`` is a ``training.rewards.StepScorer`` (the rule scorer or a learned PRM)."""
    out = torch.zeros(len(trajs), T)  # [B, T]
    # A learned PRM scores the whole step's turns together (batched); the rule scorer one by one.
    steps = scorer.score_many(trajs) if hasattr(scorer, "score_many") else [scorer.score_steps(t) for t in trajs]
    for i, per_traj in enumerate(steps):
        for start, end, score in per_traj:
            a, b = max(0, start - 1), min(T, end - 1)
            if a < b:
                out[i, a:b] = score
    return out


def dual_granularity(
    outcome: torch.Tensor,
    step_scores: torch.Tensor,
    group_ids: torch.Tensor,
    mask: torch.Tensor,
    beta: float = 0.3,
    eps: float = 1e-4,
    step_eps: float = 1e-8,
) -> torch.Tensor:
    """ProRAG: A_{i,t} = A^out_i + β · A^step_{i,t} (``prorag/rl/trainer.py`` 164-197).

    ``outcome`` [B] is group-normalised as in GRPO, (R − mean_g) / (std_g + ``eps``);
    ``step_scores`` [B, T] holds each step's score on that step's generated tokens and is
    normalised over all valid tokens of the group: (s − mean) / sqrt(var_pop + ``step_eps``).  → [B, T]
    """
    a_out = grpo(outcome, group_ids, mask, eps)  # [B, T]
    a_step = torch.zeros(step_scores.shape, dtype=torch.float32, device=step_scores.device)  # [B, T]
    for g in torch.unique(group_ids):
        sel = group_ids == g  # [B] bool
        vals = step_scores[sel][mask[sel].bool()].float()  # [N_valid in group]
        if vals.numel():
            std = (vals.var(unbiased=False) + step_eps).sqrt()  # one token: var 0, and s − mean = 0
            a_step[sel] = (step_scores[sel].float() - vals.mean()) / std
    return (a_out + beta * a_step) * mask


# ---- the registry: one signature for every estimator ---------------------------------------------
@dataclass
class AdvantageInputs:
    """What an estimator may read. Tensors are in the trainer's response window W.

    ``rewards`` [B] outcome rewards; ``group_ids`` [B] prompt index; ``mask`` [B, W] model tokens;
    ``values`` [B, W] the critic's (PPO); ``kl_reward`` [B, W] the KL folded into the reward,
    −β·KL_t on model tokens (``algo.kl_in_reward``; None otherwise); ``step_scores`` [B, W] each
    step's score painted on its tokens (ProRAG).
    """

    rewards: torch.Tensor
    group_ids: torch.Tensor
    mask: torch.Tensor
    values: torch.Tensor | None = None
    kl_reward: torch.Tensor | None = None
    step_scores: torch.Tensor | None = None


AdvantageFn = Callable[[AdvantageInputs, AlgoConfig], tuple[torch.Tensor, torch.Tensor | None]]


def adv_eps(algo: AlgoConfig, name: str) -> float:
    """``algo.adv_eps``, or (null) estimator ``name``'s own ε, registered with it (``ADVANTAGES`` info ``eps``)."""
    return algo.adv_eps if algo.adv_eps is not None else ADVANTAGES.info(name)["eps"]


def _grpo(x: AdvantageInputs, algo: AlgoConfig) -> tuple[torch.Tensor, None]:
    scores = x.rewards.float()  # [B]
    if x.kl_reward is not None:  # verl normalises token_level_rewards.sum(-1): R − β·Σ_t KL_t
        scores = scores + x.kl_reward.sum(-1)
    return grpo(scores, x.group_ids, x.mask, adv_eps(algo, "grpo"), norm_by_std=algo.norm_by_std), None


def _group_norm(x: AdvantageInputs, algo: AlgoConfig) -> tuple[torch.Tensor, None]:
    return group_norm(
        x.rewards, x.group_ids, x.mask, algo.gamma, adv_eps(algo, "group_norm"), token_penalty=x.kl_reward
    ), None


def _reinforce_pp(x: AdvantageInputs, algo: AlgoConfig) -> tuple[torch.Tensor, None]:
    return reinforce_pp(
        x.rewards, x.group_ids, x.mask, algo.gamma, adv_eps(algo, "reinforce_pp"), token_penalty=x.kl_reward
    ), None


def _gae(x: AdvantageInputs, algo: AlgoConfig) -> tuple[torch.Tensor, torch.Tensor]:
    if x.values is None:
        raise ValueError("gae advantages need the critic's values")
    token_rewards = outcome_to_tokens(x.rewards, x.mask)  # [B, W] the outcome on the last model token
    if x.kl_reward is not None:  # PPO: r_t − β·KL_t on every token
        token_rewards = token_rewards + x.kl_reward
    return gae(token_rewards, x.values, x.mask, algo.gamma, algo.lam, algo.whiten_advantages, adv_eps(algo, "gae"))


def _dual_granularity(x: AdvantageInputs, algo: AlgoConfig) -> tuple[torch.Tensor, None]:
    if x.step_scores is None:
        raise ValueError("dual_granularity advantages need step scores (a step scorer)")
    if x.kl_reward is not None:
        raise ValueError("dual_granularity advantages take no KL in the reward")
    return dual_granularity(
        x.rewards, x.step_scores, x.group_ids, x.mask, algo.dual_beta, adv_eps(algo, "dual_granularity"), algo.step_eps
    ), None


# Every estimator is called as ``fn(inputs, algo_config) -> (advantages [B, W], returns [B, W] or None)``.
# Registry info says what the trainer must provide: a critic (values), step scores; and whether the
# estimator takes the KL in the reward (``kl_in_reward``; the trainer refuses the flag otherwise).
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage")
# ``eps``: each estimator's own ε (``algo.adv_eps: null``), as its source writes it: verl's GRPO
# std + 1e-6 (core_algos.py compute_grpo_outcome_advantage); OpenRLHF's group_norm std + 1e-9 and
# its normalize rsqrt(max(var, 1e-8)) (reinforce_pp); verl's masked_whiten rsqrt(var + 1e-8) (gae);
# ProRAG's std + 1e-4 (prorag/rl/trainer.py:173).
ADVANTAGES.register("grpo", _grpo, kl_in_reward=True, eps=1e-6)
ADVANTAGES.register("group_norm", _group_norm, kl_in_reward=True, eps=1e-9)
ADVANTAGES.register("reinforce_pp", _reinforce_pp, kl_in_reward=True, eps=1e-8)
ADVANTAGES.register("gae", _gae, needs_critic=True, kl_in_reward=True, eps=1e-8)
ADVANTAGES.register("dual_granularity", _dual_granularity, needs_step_scores=True, eps=1e-4)
