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

Rollout corrections (``ROLLOUT_CORRECTIONS``, ``algo.rollout_correction``): the backend that
sampled the tokens (the BEHAVIOUR policy, its log-probs recorded at generation) and the trainer's
policy before the update (the OLD log-probs, recomputed) disagree a little even on the same
weights (other kernels, dtypes; in an asynchronous run, older weights). Each model token gets the
importance ratio ρ = exp(old − behaviour), or each row one ratio exp Σ(old − behaviour) at
``level: sequence``, and the policy loss's term is multiplied by a weight made from it:
``none`` 1, ``tis`` min(ρ, cap), ``mask`` ρ inside [lo, hi] and 0 outside; the rejections weigh
1 or 0: ``geo_mask`` by the row's geometric mean ratio, ``token_mask`` by each token's,
``outlier_mask`` by the row's worst token. As in verl's ``rollout_corr_helper.py``, TRL's
``vllm_importance_sampling_correction``, SkyRL's ``off_policy_correction_utils.py`` and OpenRLHF's
``PolicyLoss``; AReaL's decoupled PPO is the token-level ``mask`` with its cap. A token weighted 0
counts in the denominators unless ``masked_in_denominator`` is false (verl's rejection sampling).
:func:`mismatch_stats` measures the gap.

:class:`RLLoss` composes them into the trainer's one configured objective; every term of it (policy,
KL, entropy) is aggregated the same way, as verl's actor does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from harness.registry import Registry
from training.algo_config import AlgoConfig, RolloutCorrectionConfig

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
    is_weight: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO-clip per token: −min(ρA, clip(ρ, 1−ε_low, 1+ε_high)·A), ρ = exp(logp − old_logp),
    aggregated with ``agg``. ``clip_high`` > ``clip_low`` is DAPO's clip-higher.

    ``is_weight`` [B, T] (from :func:`rollout_weights`): each token's clipped term is multiplied
    by it, a constant (no gradient); a token with weight 0 gives 0 yet still counts in the
    aggregation's denominators (the valid-token ``mask``; :class:`RLLoss` takes it out of ``mask``
    when ``masked_in_denominator`` is false), as in TRL's ``*_mask`` modes and in
    AReaL's ``ppo_actor_loss_fn`` (inclusionAI/AReaL ``areal/utils/functional.py``, whose
    denominator is ``loss_mask.count_nonzero()``, not the kept-token count).

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
    if is_weight is not None:
        per_token = per_token * is_weight  # [B, T]: weight 0 gives 0, and the token still counts in ``mask``
    loss = aggregate(per_token, mask, agg, global_tokens, max_len)
    with torch.no_grad():
        n = m.sum().clamp(min=1)
        stats = {
            "clip_frac": float(((clipped > unclipped) & m).sum() / n),
            "approx_kl": float((0.5 * log_ratio**2 * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, stats


# ---- rollout corrections -----------------------------------------------------------------------
# Every correction is ``fn(log_ratio [B, T], mask [B, T] bool, rc) -> (weight, corrected)``:
# ``log_ratio`` = old − behaviour on valid tokens (0 elsewhere), ``rc`` the
# ``algo.rollout_correction`` config (``level``, ``cap``, ``lo``, ``hi``); the weight and which
# units were corrected (bool: capped or masked) are per token [B, T] or per row [B, 1].
CorrectionFn = Callable[[torch.Tensor, torch.Tensor, RolloutCorrectionConfig], "tuple[torch.Tensor, torch.Tensor]"]
ROLLOUT_CORRECTIONS: Registry[CorrectionFn] = Registry("rollout correction")
# verl's SAFETY_BOUND: log-ratios are clamped to ±20 before exp, so a sequence's summed ratio stays
# finite (e^20 ≈ 4.9e8, past any cap); inside the bound the ratio is exact.
LOG_RATIO_BOUND = 20.0


def _exp(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp within verl's safety bound (SkyRL's ``safe_exp_delta(clip=20)``)."""
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


def level_ratio(log_ratio: torch.Tensor, level: str) -> torch.Tensor:
    """ρ per token [B, T], or per row [B, 1] at ``level: sequence``: exp Σ over the row
    (``log_ratio`` is 0 off the mask; TRL: ``per_token_logps_diff.sum(-1)``)."""
    if level == "sequence":
        return _exp(log_ratio.sum(1, keepdim=True))  # [B, 1]
    if level != "token":
        raise ValueError(f"rollout correction level must be token or sequence, got {level!r}")
    return _exp(log_ratio)  # [B, T]


def _outside(ratio: torch.Tensor, rc: RolloutCorrectionConfig) -> torch.Tensor:
    """Which ratios fall outside the band [``lo``, ``hi``] (``hi`` None: no upper bound)."""
    out = ratio < rc.lo
    return out | (ratio > rc.hi) if rc.hi is not None else out


@ROLLOUT_CORRECTIONS.register("none")
def no_correction(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight 1: the loss ignores the mismatch (which is still measured and logged)."""
    return torch.ones_like(log_ratio), torch.zeros_like(mask)


@ROLLOUT_CORRECTIONS.register("tis")
def truncated_is(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance sampling: min(ρ, ``cap``) at ``rc.level`` (TRL's ``*_truncate``, verl's
    ``rollout_is``, SkyRL's ``tis_ratio_type``); ``cap`` None: ρ itself (AReaL's decoupled loss
    without ``behav_imp_weight_cap``)."""
    ratio = level_ratio(log_ratio, rc.level)  # [B, T] or [B, 1]
    if rc.cap is None:
        return ratio, torch.zeros_like(ratio, dtype=torch.bool)
    return ratio.clamp(max=rc.cap), ratio > rc.cap


@ROLLOUT_CORRECTIONS.register("mask")
def masked_is(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked importance sampling: ρ inside [``lo``, ``hi``], 0 outside, at ``rc.level`` (TRL's
    ``*_mask``: ``masked_fill(ρ > cap, 0)``; AReaL keeps ``behav_imp_weight <= cap``; at token level
    IcePop's M(ρ; α, β), OpenRLHF's ``icepop``: ``vllm_is * ((vllm_is >= low) & (vllm_is <= high))``)."""
    ratio = level_ratio(log_ratio, rc.level)  # [B, T] or [B, 1]
    out = _outside(ratio, rc)
    return torch.where(out, torch.zeros_like(ratio), ratio), out


@ROLLOUT_CORRECTIONS.register("geo_mask")
def geometric_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reject a row whose geometric mean ratio exp(Σ log ρ / n), n its valid tokens, is outside
    [``lo``, ``hi``]; keep the others with weight 1 (SkyRL's ``compute_sequence_mask`` geometric,
    recommended band [0.99, 1.01]; verl's ``seq_mean_k1`` bounds the same mean of −log ρ).  [B, T] → [B, 1]"""
    n = mask.sum(1, keepdim=True).clamp(min=1)  # [B, 1]
    geo = _exp(log_ratio.sum(1, keepdim=True) / n)  # [B, 1]
    out = _outside(geo, rc)
    return (~out).to(log_ratio.dtype), out


@ROLLOUT_CORRECTIONS.register("token_mask")
def token_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reject each token whose ρ is outside [``lo``, ``hi``], weight 1 for the rest (SkyRL's
    ``compute_token_mask``, its IcePop; verl's ``token_k1`` rejection).  [B, T] → [B, T]"""
    out = _outside(_exp(log_ratio), rc) & mask
    return (~out).to(log_ratio.dtype), out


@ROLLOUT_CORRECTIONS.register("outlier_mask")
def outlier_mask(
    log_ratio: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reject a row in which any valid token's ρ is outside [``lo``, ``hi``], weight 1 for the rest
    (SkyRL's ``compute_outlier_token_mask``, suggested band [1e-4, 100]).  [B, T] → [B, 1]"""
    out = (_outside(_exp(log_ratio), rc) & mask).any(1, keepdim=True)  # [B, 1]
    return (~out).to(log_ratio.dtype), out


def _log_ratio(old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """old − behaviour on valid tokens, 0 elsewhere.  [B, T] ×3 → [B, T]"""
    return torch.where(mask.bool(), old_logp - behav_logp, torch.zeros_like(old_logp))


@torch.no_grad()
def correction_ratio(old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """ρ = π_old / π_behav per valid token (1 elsewhere), or per row at ``level: sequence``:
    exp Σ over the row's valid tokens.  [B, T] ×3 → [B, T] (token) or [B, 1] (sequence)"""
    return level_ratio(_log_ratio(old_logp, behav_logp, mask), level)


@torch.no_grad()
def _correct(old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig):
    """The registered correction ``rc.kind``: its weight and corrected units, [B, T] or [B, 1]."""
    return ROLLOUT_CORRECTIONS.get(rc.kind)(_log_ratio(old_logp, behav_logp, mask), mask.bool(), rc)


@torch.no_grad()
def rollout_weights(
    old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """The correction ``rc.kind`` as per-token weights for :func:`policy_loss`: the weight [B, T]
    (0 off the mask; a row's weight spread over its tokens) and which valid tokens were corrected
    [B, T] bool. No gradient: both log-probs are data."""
    m = mask.bool()  # [B, T]
    w, corrected = _correct(old_logp, behav_logp, mask, rc)  # [B, T] or [B, 1]
    w = torch.where(m, w.expand_as(old_logp), torch.zeros_like(old_logp))  # [B, T]
    return w, corrected.expand_as(m) & m


@torch.no_grad()
def mismatch_stats(
    old_logp: torch.Tensor, behav_logp: torch.Tensor, mask: torch.Tensor, rc: RolloutCorrectionConfig
) -> dict[str, float]:
    """How far the backend's log-probs are from the trainer's, and what ``rc`` did about it:

    - ``mismatch/abs_log_ratio``: mean |old − behaviour| over valid tokens;
    - ``mismatch/kl_k3``: mean k3 estimate of KL(π_behav ‖ π_old), ρ − log ρ − 1 per token
      (the registered ``k3``: verl's low_var_kl, clamped at 10 a token), in float64;
    - ``mismatch/ratio_p5``, ``_p50``, ``_p95``: quantiles of ρ at ``rc.level`` (over valid tokens,
      or over the rows that have any), linearly interpolated;
    - ``mismatch/corrected_frac``: the share of the kind's units (tokens, or rows that have valid
      tokens: ``level: sequence``, ``geo_mask``, ``outlier_mask``) capped or masked;
    - ``mismatch/weight_mean``: the mean weight of the valid tokens left in the loss (weight > 0).

    [B, T] ×3 → scalars; empty when no token is valid."""
    m = mask.bool()  # [B, T]
    if not m.any():
        return {}
    d = (old_logp - behav_logp)[m]  # [N] log ρ per valid token
    # float64: for the tiny gaps of a synced engine, e^d − d − 1 cancels to noise (even < 0) in float32
    kl = kl_penalty(behav_logp.double(), old_logp.double(), "k3")[m]  # [N]
    ratio = correction_ratio(old_logp, behav_logp, mask, rc.level)  # [B, T] or [B, 1]
    _, corrected = _correct(old_logp, behav_logp, mask, rc)  # [B, T] or [B, 1]: the kind's own units
    w, _ = rollout_weights(old_logp, behav_logp, mask, rc)  # [B, T]
    rows = m.any(1, keepdim=True)  # [B, 1]
    q_units = m if rc.level == "token" else rows
    q = torch.quantile(ratio[q_units].double(), torch.tensor([0.05, 0.5, 0.95], dtype=torch.float64, device=d.device))
    units = m if corrected.shape[1] == m.shape[1] else rows
    kept = m & (w > 0)  # [B, T]
    return {
        "mismatch/abs_log_ratio": float(d.abs().mean()),
        "mismatch/kl_k3": float(kl.mean()),
        "mismatch/ratio_p5": float(q[0]),
        "mismatch/ratio_p50": float(q[1]),
        "mismatch/ratio_p95": float(q[2]),
        "mismatch/corrected_frac": float(corrected[units].float().mean()),
        "mismatch/weight_mean": float(w[kept].mean()) if kept.any() else 0.0,
    }


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

    ``correction``: the ``algo.rollout_correction`` (:data:`ROLLOUT_CORRECTIONS`); unless its kind is
    ``none`` every call must bring the backend's log-probs ``behav_logp``, and each token's policy
    term is weighted by :func:`rollout_weights` of them and ``old_logp``. With it AReaL's decoupled
    PPO is this objective: ``old_logp`` is then the proximal policy's.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    agg: str = "token_mean"
    kl_coef: float = 0.0
    kl_estimator: str = "k3"
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    max_len: int | None = None
    correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)

    @classmethod
    def from_config(cls, algo: AlgoConfig) -> RLLoss:
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
            algo.rollout_correction,
        )

    @property
    def corrects(self) -> bool:
        """Whether the loss weighs tokens by the rollout correction (it then needs ``behav_logp``)."""
        return self.correction.kind != "none"

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
        backend's per-token log-probs, recorded at generation) is required when the loss
        :attr:`corrects` and refused otherwise, so the objective is always the configured one."""
        kind = self.correction.kind
        if self.corrects and behav_logp is None:
            raise ValueError(
                f"algo.rollout_correction.kind={kind} needs behav_logp, the backend's per-token log-probs "
                "recorded at generation; none were given"
            )
        if not self.corrects and behav_logp is not None:
            raise ValueError("behav_logp given with algo.rollout_correction.kind=none; set a kind to use it")
        w = rollout_weights(old_logp, behav_logp, mask, self.correction)[0] if self.corrects else None  # [b, W]
        if w is not None and not self.correction.masked_in_denominator:
            # verl's rejection sampling: a token weighted 0 leaves every term's mask, so its denominators too
            mask = mask * (w > 0).to(mask.dtype)  # [b, W]
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
            is_weight=w,
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
