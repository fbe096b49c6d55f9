"""Losses: clipped policy loss with four aggregations, KL estimators, entropy, clipped value loss.

All inputs are per target token: ``logp``/``old_logp``/``ref_logp``/``adv``/``mask`` are [B, T],
``mask`` is 1 on model tokens only, so prompt and observation tokens never reach a gradient
(they are multiplied by 0 before any sum, so their logprobs get exactly zero gradient).

Aggregations (how per-token losses become one number):

- ``token_mean`` (verl): sum over all valid tokens of the micro-batch / their count.
- ``seq_mean_token_mean`` (OpenRLHF): mean over each sequence's tokens, then over sequences.
- ``dapo``: sum over valid tokens / ``global_tokens``, the valid-token count of the whole batch
  across gradient-accumulation micro-batches (so every token weighs the same however the batch
  was split); without ``global_tokens`` it equals ``token_mean``. The difference from
  ``token_mean`` is only the denominator's scope: per micro-batch vs the whole step (DAPO, TRL).
- ``dr_grpo`` (Dr. GRPO): sum over valid tokens / (B × ``max_len``), a constant denominator, so
  long and short answers are not re-weighted by their length.

Config picks these by name: ``AGGREGATIONS`` (aggregations) and ``KL_ESTIMATORS``; :class:`RLLoss`
composes them into the trainer's one configured objective.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "dapo", "dr_grpo")
KL_ESTIMATORS = ("k1", "k2", "k3")


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token_mean",
    global_tokens: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Per-token losses [B, T] → scalar (see the module docstring for each ``agg``)."""
    loss = torch.where(mask.bool(), loss, torch.zeros_like(loss))  # [B, T]: masked → exactly 0, no grad
    mask = mask.to(loss.dtype)  # [B, T]
    total = loss.sum()  # scalar
    if agg == "token_mean":
        return total / mask.sum().clamp(min=1)
    if agg == "seq_mean_token_mean":
        per_seq = loss.sum(1) / mask.sum(1).clamp(min=1)  # [B]
        has = (mask.sum(1) > 0).to(loss.dtype)  # [B]
        return (per_seq * has).sum() / has.sum().clamp(min=1)
    if agg == "dapo":
        return total / (global_tokens if global_tokens is not None else mask.sum().clamp(min=1))
    if agg == "dr_grpo":
        return total / (loss.shape[0] * (max_len if max_len is not None else loss.shape[1]))
    raise ValueError(f"unknown loss aggregation {agg!r}; use one of {', '.join(AGGREGATIONS)}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token_mean",
    global_tokens: float | None = None,
    max_len: int | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO-clip per token: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = exp(logp − old_logp),
    aggregated with ``agg``. ``clip_high`` > ``clip_low`` is DAPO's clip-higher.

    Returns (loss, stats): ``clip_frac`` = share of valid tokens where the clipped term is the
    active one; ``approx_kl`` = mean over valid tokens of ½(logp − old_logp)², the k2 estimator
    (verl logs the k1 mean instead, which can go negative).
    """
    m = mask.bool()  # [B, T]
    # Masked positions get log-ratio 0 (ρ = 1) so padding/observation garbage can never make inf·0 = nan.
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -adv * ratio  # [B, T]
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # [B, T]
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    loss = aggregate(per_token, mask, agg, global_tokens, max_len)
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((clipped > unclipped) & m).sum() / n),
            "approx_kl": float((0.5 * log_ratio**2 * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) estimators.  [B, T] → [B, T]

    k1 = logp − ref; k2 = ½ (logp − ref)²; k3 = exp(ref − logp) − (ref − logp) − 1 (≥ 0, unbiased).
    """
    d = ref_logp - logp  # [B, T] log(π_ref/π)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d**2
    if kind == "k3":
        return torch.exp(d) - d - 1
    raise ValueError(f"unknown KL estimator {kind!r}; use k1, k2 or k3")


def kl_loss(
    logp: torch.Tensor,
    ref_logp: torch.Tensor,
    mask: torch.Tensor,
    kind: str = "k3",
    agg: str = "token_mean",
    **agg_kw,
) -> torch.Tensor:
    """KL to the reference as a loss term (GRPO/ReSearch: k3, β·KL added to the policy loss),
    aggregated like the policy loss.  [B, T] → scalar"""
    return aggregate(kl_penalty(logp, ref_logp, kind), mask, agg, **agg_kw)


def kl_in_reward(
    token_rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, beta: float, kind: str = "k1"
) -> torch.Tensor:
    """PPO's reward shaping: r_t − β·KL_t on every token (detached: the KL then acts through
    the advantages, not as a gradient path).  [B, T] → [B, T]"""
    return token_rewards - beta * kl_penalty(logp, ref_logp, kind).detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the next-token distribution.  [B, T, V] → [B, T]"""
    logp = torch.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    return -(logp.exp() * logp).sum(-1)  # [B, T]


def entropy_bonus(logits: torch.Tensor, mask: torch.Tensor, agg: str = "token_mean", **agg_kw) -> torch.Tensor:
    """Aggregated entropy of the policy; subtract ``coef ×`` this from the loss to encourage
    exploration.  [B, T, V], [B, T] → scalar"""
    return aggregate(entropy_from_logits(logits), mask, agg, **agg_kw)


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip: float = 0.2,
    agg: str = "token_mean",
) -> tuple[torch.Tensor, dict]:
    """PPO's clipped value loss: ½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²), aggregated.

    values/old_values/returns/mask [B, T] → scalar, stats (``vf_clip_frac``: share of valid
    tokens where the clipped error is the larger one).
    """
    clipped = old_values + torch.clamp(values - old_values, -clip, clip)  # [B, T]
    per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)  # [B, T]
    m = mask.bool()  # [B, T]
    frac = float((((clipped - returns) ** 2 > (values - returns) ** 2) & m).sum() / m.sum().clamp(min=1))
    return aggregate(per_token, mask, agg), {"vf_clip_frac": frac}


@dataclass(frozen=True)
class RLLoss:
    """The whole objective of one micro-batch, configured once (compare torchtune's loss modules):

    clipped policy loss (``agg``; DAPO's sum is rescaled by the gradient-accumulation steps,
    since DeepSpeed divides by them and ``dapo`` already normalises over the step) + ``kl_coef``
    · KL to the reference (unless the KL is folded into the rewards, PPO style) − ``entropy_coef``
    · entropy. Returns the loss and its stats (``clip_frac``, ``kl``, ``entropy``, ...).
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: str = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    max_len: int | None = None

    @classmethod
    def from_config(cls, algo: Any) -> RLLoss:
        """From a ``training.config.AlgoConfig``."""
        return cls(
            algo.clip_low,
            algo.clip_high,
            algo.loss_agg,
            algo.kl_coef,
            algo.kl_estimator,
            algo.kl_in_reward,
            algo.entropy_coef,
            algo.max_len,
        )

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        logits: torch.Tensor,
        ref_logp: torch.Tensor | None = None,
        global_tokens: float | None = None,
        grad_accum: int = 1,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``logp``, ``old_logp``, ``adv``, ``mask``, ``ref_logp``: [b, W]; ``logits``: [b, w, V], w ≤ W."""
        loss, stats = policy_loss(
            logp, old_logp, adv, mask, self.clip_low, self.clip_high, self.agg, global_tokens, self.max_len
        )
        if self.agg == "dapo":
            loss = loss * grad_accum
        if ref_logp is not None and not self.kl_in_reward:
            kl = aggregate(kl_penalty(logp, ref_logp, self.kl_estimator), mask)
            loss, stats["kl"] = loss + self.kl_coef * kl, float(kl)
        ent_mask = mask[:, : logits.shape[1]]  # [b, w]: the rows end within w
        with torch.set_grad_enabled(bool(self.entropy_coef) and torch.is_grad_enabled()):
            entropy = aggregate(entropy_from_logits(logits), ent_mask)
        if self.entropy_coef:
            loss = loss - self.entropy_coef * entropy
        stats["entropy"] = float(entropy.detach())
        return loss, stats
