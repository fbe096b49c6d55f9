"""Losses: clipped policy loss, registered loss aggregations and KL estimators, entropy, clipped value loss.

All inputs are per target token: ``logp``/``old_logp``/``ref_logp``/``adv``/``mask`` are [B, T],
``mask`` is 1 on model tokens only, so prompt and observation tokens never reach a gradient
(they are multiplied by 0 before any sum, so their logprobs get exactly zero gradient).

Aggregations (how per-token losses become one number), registered in ``AGGREGATIONS`` as pure
functions, as verl's ``core_algos.agg_loss`` modes:

- ``token_mean`` (verl): sum over all valid tokens of the micro-batch / their count.
- ``seq_mean_token_mean`` (OpenRLHF; TRL's and HARR's ``grpo`` loss type): mean over each
  sequence's tokens, then over the sequences that have any.
- ``dapo``: sum over valid tokens / ``global_tokens``, the valid-token count of the whole batch
  across gradient-accumulation micro-batches (so every token weighs the same however the batch
  was split); without ``global_tokens`` it equals ``token_mean``. The difference from
  ``token_mean`` is only the denominator's scope: per micro-batch vs the whole step (DAPO, TRL).
- ``dr_grpo`` (Dr. GRPO): sum over valid tokens / (B × ``max_len``), a constant denominator, so
  long and short answers are not re-weighted by their length.

KL estimators (``KL_ESTIMATORS``, per token, from log π and log π_ref), as verl's ``kl_penalty``:
``k1``, ``k2``, ``k3`` (verl's ``low_var_kl``, clamped as verl clamps it) and ``k3_unclamped``
(TRL's and HARR's k3, no clamp).

:class:`RLLoss` composes them into the trainer's one configured objective; every term of it (policy,
KL, entropy) is aggregated the same way, as verl's actor does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from harness.registry import Registry

# ---- aggregations ------------------------------------------------------------------------------
# Every aggregation is ``fn(loss [B, T] (0 where masked), mask [B, T] float, global_tokens, max_len) -> scalar``.
AggregationFn = Callable[[torch.Tensor, torch.Tensor, "float | None", "int | None"], torch.Tensor]
AGGREGATIONS: Registry[AggregationFn] = Registry("loss aggregation")


@AGGREGATIONS.register("token_mean")
def token_mean(
    loss: torch.Tensor, mask: torch.Tensor, global_tokens: float | None, max_len: int | None
) -> torch.Tensor:
    """Σ valid / count of valid tokens in these rows (verl's ``token-mean``)."""
    return loss.sum() / mask.sum().clamp(min=1)


@AGGREGATIONS.register("seq_mean_token_mean")
def seq_mean_token_mean(
    loss: torch.Tensor, mask: torch.Tensor, global_tokens: float | None, max_len: int | None
) -> torch.Tensor:
    """Mean over each row's valid tokens, then over the rows that have any (OpenRLHF's masked_mean(dim=-1).mean())."""
    per_seq = loss.sum(1) / mask.sum(1).clamp(min=1)  # [B]
    has = (mask.sum(1) > 0).to(loss.dtype)  # [B]
    return (per_seq * has).sum() / has.sum().clamp(min=1)


@AGGREGATIONS.register("dapo")
def dapo(loss: torch.Tensor, mask: torch.Tensor, global_tokens: float | None, max_len: int | None) -> torch.Tensor:
    """Σ valid / the optimizer step's valid-token count (``token_mean`` when that is not given)."""
    return loss.sum() / (global_tokens if global_tokens is not None else mask.sum().clamp(min=1))


@AGGREGATIONS.register("dr_grpo")
def dr_grpo(loss: torch.Tensor, mask: torch.Tensor, global_tokens: float | None, max_len: int | None) -> torch.Tensor:
    """Σ valid / (rows × ``max_len``, or × T): a constant denominator (Dr. GRPO)."""
    return loss.sum() / (loss.shape[0] * (max_len if max_len is not None else loss.shape[1]))


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token_mean",
    global_tokens: float | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Per-token losses [B, T] → scalar with the registered aggregation ``agg`` (see the module docstring)."""
    fn = AGGREGATIONS.get(agg)
    loss = torch.where(mask.bool(), loss, torch.zeros_like(loss))  # [B, T]: masked → exactly 0, no grad
    return fn(loss, mask.to(loss.dtype), global_tokens, max_len)


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
    behav_logp: torch.Tensor | None = None,
    behav_imp_weight_cap: float | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO-clip per token: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = exp(logp − old_logp),
    aggregated with ``agg``. ``clip_high`` > ``clip_low`` is DAPO's clip-higher.

    Returns (loss, stats): ``clip_frac`` = share of valid tokens where the clipped term is the
    active one; ``approx_kl`` = mean over valid tokens of ½(logp − old_logp)², the k2 estimator
    (verl logs the k1 mean instead, which can go negative).

    Decoupled PPO (AReaL, for asynchronous rollouts), when ``behav_logp`` [B, T] is given: the
    log-probs of the BEHAVIOUR policy, the one that generated each token (the backend's, recorded
    at generation; tokens of one row may come from several policy versions). ``old_logp`` is then
    the PROXIMAL policy, the policy before this update, and ρ and the clip are taken against it
    as above; each token's clipped term is multiplied by the behaviour importance weight
    w = exp(old_logp − behav_logp), a constant (no gradient). With ``behav_imp_weight_cap``,
    tokens with w > cap are dropped: their term is 0, yet they still count in the aggregation's
    denominators (the valid-token ``mask``). This follows ``ppo_actor_loss_fn`` in
    inclusionAI/AReaL ``areal/utils/functional.py``, whose denominator is
    ``loss_mask.count_nonzero()``, not the kept-token count. Extra stats, as AReaL logs them
    (``behave_imp_weight``, ``behave_approx_kl`` over the kept tokens): ``behav_imp_weight`` =
    mean w and ``behav_kl`` = mean (old_logp − behav_logp), both over kept valid tokens;
    ``behav_drop_frac`` = share of valid tokens dropped by the cap. Without ``behav_logp`` the
    function is the plain PPO-clip loss, unchanged.
    """
    m = mask.bool()  # [B, T]
    # Masked positions get log-ratio 0 (ρ = 1) so padding/observation garbage can never make inf·0 = nan.
    log_ratio = torch.where(m, logp - old_logp, torch.zeros_like(logp))  # [B, T]
    ratio = torch.exp(log_ratio)  # [B, T]
    unclipped = -adv * ratio  # [B, T]
    clipped = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)  # [B, T]
    per_token = torch.maximum(unclipped, clipped)  # [B, T]
    behav_stats: dict[str, float] = {}
    if behav_logp is not None:
        w, behav_stats = behaviour_weights(old_logp, behav_logp, m, behav_imp_weight_cap)  # [B, T]
        per_token = per_token * w  # [B, T]: dropped tokens give 0, and still count in ``mask``
    loss = aggregate(per_token, mask, agg, global_tokens, max_len)
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((clipped > unclipped) & m).sum() / n),
            "approx_kl": float((0.5 * log_ratio**2 * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
            **behav_stats,
        }
    return loss, stats


@torch.no_grad()
def behaviour_weights(
    old_logp: torch.Tensor, behav_logp: torch.Tensor, m: torch.Tensor, cap: float | None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO's behaviour importance weight w = exp(proximal − behaviour) per token, set to
    0 off the kept tokens (valid and, with ``cap``, w ≤ cap: AReaL keeps ``behav_imp_weight <= cap``),
    and the stats. No gradient: both log-probs are data. Zeroing w itself (not the weighted term
    afterwards) keeps an infinite weight of a dropped token out of the backward (0·inf = nan).
    [B, T] ×2, bool [B, T] → w [B, T]
    """
    behav_kl = torch.where(m, old_logp - behav_logp, torch.zeros_like(old_logp))  # [B, T], 0 off the mask
    w = torch.exp(behav_kl)  # [B, T]
    keep = m & (w <= cap) if cap is not None else m  # [B, T]
    n_keep = keep.sum().clamp(min=1)
    zero = torch.zeros_like(w)
    stats = {
        "behav_imp_weight": float(torch.where(keep, w, zero).sum() / n_keep),
        "behav_kl": float(torch.where(keep, behav_kl, zero).sum() / n_keep),
        "behav_drop_frac": float((m & ~keep).sum() / m.sum().clamp(min=1)),
    }
    return torch.where(keep, w, zero), stats


# ---- KL estimators -----------------------------------------------------------------------------
# Every estimator is ``fn(logp [B, T], ref_logp [B, T]) -> KL_t [B, T]``, an estimate of KL(π‖π_ref) per token.
KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """logp − ref (verl's ``kl``; the one PPO and OpenRLHF fold into the reward)."""
    return logp - ref_logp


@KL_ESTIMATORS.register("k2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """½ (logp − ref)² (verl's ``mse``)."""
    return 0.5 * (logp - ref_logp) ** 2


@KL_ESTIMATORS.register("k3")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """verl's ``low_var_kl``: d = clamp(ref − logp, ±20), then clamp(e^d − d − 1, ±10). The clamps keep
    one far-off token from dominating the loss (and e^d finite); inside them it is k3 exactly."""
    d = torch.clamp(ref_logp - logp, -20.0, 20.0)  # [B, T] log(π_ref/π)
    return torch.clamp(torch.exp(d) - d - 1, -10.0, 10.0)


@KL_ESTIMATORS.register("k3_unclamped")
def k3_unclamped(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """e^d − d − 1 with d = ref − logp, no clamp (TRL's GRPO and HARR's retriever loss write it so)."""
    d = ref_logp - logp  # [B, T]
    return torch.exp(d) - d - 1


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token KL(π‖π_ref) with the registered estimator ``kind``.  [B, T] → [B, T]"""
    return KL_ESTIMATORS.get(kind)(logp, ref_logp)


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


def kl_reward(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """The KL folded into the reward: −β·k1_t on every model token (verl's ``apply_kl_penalty``,
    OpenRLHF's ``compute_reward``; both use k1 there). Detached: the KL then acts through the
    advantages, not as a gradient path.  [B, T] → [B, T]"""
    return -beta * kl_penalty(logp, ref_logp, "k1").detach() * mask


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

    clipped policy loss + ``kl_coef`` · KL to the reference (unless the KL is folded into the
    rewards, PPO style) − ``entropy_coef`` · entropy, every term aggregated with ``agg`` (verl's
    actor aggregates the KL and the entropy with the policy loss's ``loss_agg_mode``). Under
    ``dapo`` the whole sum is rescaled by the gradient-accumulation steps, since DeepSpeed divides
    by them and ``dapo`` already normalises over the step. Returns the loss and its stats
    (``clip_frac``, ``kl``, ``entropy``, ...); ``kl`` and ``entropy`` are token means of the
    micro-batch whatever ``agg`` is, so they read the same under every aggregation.

    ``decoupled``: AReaL's decoupled PPO (see :func:`policy_loss`); every call must then bring the
    behaviour policy's log-probs ``behav_logp``, and ``old_logp`` is the proximal policy's.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: str = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    max_len: int | None = None
    decoupled: bool = False
    behav_imp_weight_cap: float | None = None

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
            algo.decoupled_loss,
            algo.behav_imp_weight_cap,
        )

    @property
    def needs_entropy(self) -> bool:
        """Whether the objective has an entropy term (else entropy is only a metric, computed when logged)."""
        return bool(self.entropy_coef)

    def __call__(
        self,
        logp: torch.Tensor,
        old_logp: torch.Tensor,
        adv: torch.Tensor,
        mask: torch.Tensor,
        entropy: torch.Tensor | None = None,
        ref_logp: torch.Tensor | None = None,
        global_tokens: float | None = None,
        grad_accum: int = 1,
        behav_logp: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``logp``, ``old_logp``, ``adv``, ``mask``, ``ref_logp``, ``entropy``, ``behav_logp``: [b, W].

        ``entropy`` (per token, e.g. from :func:`training.logprobs.window_token_stats`) is needed
        when ``entropy_coef`` ≠ 0; otherwise, when given, it is only logged. ``behav_logp`` (the
        behaviour policy's per-token log-probs) is required when ``decoupled`` and refused
        otherwise, so the objective is always the configured one."""
        if self.decoupled and behav_logp is None:
            raise ValueError(
                "RLLoss(decoupled=True) (algo.decoupled_loss) needs behav_logp, the behaviour policy's "
                "per-token log-probs recorded at generation; none were given"
            )
        if not self.decoupled and behav_logp is not None:
            raise ValueError("behav_logp given to RLLoss(decoupled=False); set algo.decoupled_loss=true to use it")
        # One denominator for every term: the step's tokens (dapo), the window W (dr_grpo's default).
        agg_kw = {
            "global_tokens": global_tokens,
            "max_len": self.max_len if self.max_len is not None else mask.shape[1],
        }
        loss, stats = policy_loss(
            logp,
            old_logp,
            adv,
            mask,
            self.clip_low,
            self.clip_high,
            self.agg,
            **agg_kw,
            behav_logp=behav_logp,
            behav_imp_weight_cap=self.behav_imp_weight_cap,
        )
        if ref_logp is not None and not self.kl_in_reward:
            kl_tok = kl_penalty(logp, ref_logp, self.kl_estimator)  # [b, W]
            loss = loss + self.kl_coef * aggregate(kl_tok, mask, self.agg, **agg_kw)
            stats["kl"] = float(aggregate(kl_tok.detach(), mask))
        if self.entropy_coef:
            if entropy is None:
                raise ValueError("RLLoss with entropy_coef != 0 needs the per-token entropy")
            loss = loss - self.entropy_coef * aggregate(entropy, mask, self.agg, **agg_kw)
        if entropy is not None:
            stats["entropy"] = float(aggregate(entropy.detach(), mask))
        if self.agg == "dapo":
            loss = loss * grad_accum
        return loss, stats
