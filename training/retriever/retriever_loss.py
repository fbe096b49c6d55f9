"""What retriever RL trains the query tower on (see :mod:`training.retriever.retriever_rl`, which runs
it): the answer's reward, the per-call policy loss of GRPO (every retrieval call is one "token",
as HARR's ``_compute_loss``), and PPO's layout of a batch's calls, its advantages and its loss
with a value head on the query embedding.

Shapes: ``B`` trajectories, ``T`` the most retrieval calls in one of them, ``S`` the calls of
the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.metrics import normalize_answer, score_prediction
from harness.retrieval.stochastic import StochasticDenseRetriever
from harness.types import Trajectory
from training.advantages import gae, outcome_to_tokens
from training.engine import ValueHead
from training.losses import aggregate, kl_loss, kl_penalty, policy_loss, value_loss
from training.retriever_config import RetrieverRLConfig


# ---- rewards and metrics -----------------------------------------------------------------------
def reward_of(traj: Trajectory, metric: str) -> float:
    """The answer's ``metric`` (em / f1) against the gold answers; errors score 0."""
    if traj.finish_reason == "error":
        return 0.0
    return float(score_prediction(traj.prediction, traj.answers, [metric])[metric])


def answer_recall(traj: Trajectory) -> float:
    """1 if any retrieved document (any call) contains a gold answer (normalised), else 0."""
    golds = [normalize_answer(a) for a in traj.answers if normalize_answer(a)]
    for s in traj.searches:
        for d in s.docs:
            text = normalize_answer(f"{d.title} {d.text}")
            if any(f" {g} " in f" {text} " for g in golds):
                return 1.0
    return 0.0


# ---- the loss ----------------------------------------------------------------------------------
def per_call_loss(
    new: torch.Tensor,
    old: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    ref: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    kl_coef: float = 0.0,
    agg: str = "token_mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """HARR's ``RetrieverGRPOTrainer._compute_loss``: every retrieval call is one "token".

    ρ = exp(logπ − logπ_old) and PPO-clip per call with its trajectory's advantage, plus β·k3 per
    call (unclamped, as HARR writes it) to the initial tower, aggregated by ``agg`` (a
    ``training.losses.AGGREGATIONS`` name): ``token_mean`` is TRL 0.18.1's default ``bnpo``, the
    sum over every call / the number of calls (``grpo_trainer.py`` 1281-1283), which HARR runs;
    ``seq_mean_token_mean`` is its ``loss_type: grpo`` (per trajectory, then the mean). Clipping
    each call's ratio is not clipping the ratio of the summed log-probs, which is the product of
    the calls' ratios.

    new/old/ref/mask [B, T] (T: the most calls in a trajectory), adv [B] → scalar, stats.
    """
    per_call_adv = adv[:, None] * mask  # [B, T]
    loss, stats = policy_loss(new, old, per_call_adv, mask, clip_eps, clip_eps, agg)
    out = {k: float(v) for k, v in stats.items()}
    if kl_coef > 0 and ref is not None:
        kl = kl_penalty(new, ref, "k3_unclamped")  # [B, T]
        loss = loss + kl_coef * aggregate(kl, mask, agg)
        out["kl"] = float(aggregate(kl.detach(), mask))  # mean over calls, as HARR logs it
    return loss, out


def retrieval_loss(
    retriever: StochasticDenseRetriever, trajs: Sequence[Trajectory], adv: torch.Tensor, cfg: RetrieverRLConfig
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO on the retrieval calls of ``trajs`` (:func:`per_call_loss`), log-probs recomputed from
    the calls' records under the current tower. adv [B] → scalar. A trajectory without a
    retrieval call carries no gradient."""
    layout = step_layout(trajs)
    new = layout.grid(retriever.recompute_logprobs(layout.samples))  # [B, T]
    ref = None
    if cfg.kl_coef > 0:
        ref = layout.grid(retriever.recompute_logprobs(layout.samples, reference=True)).detach()  # [B, T]
    return per_call_loss(new, layout.old_logp, adv, layout.mask.float(), ref, cfg.clip_eps, cfg.kl_coef, cfg.loss_agg)


# ---- PPO: one action per retrieval call, a value head on the query embedding -------------------
@dataclass
class StepLayout:
    """A batch's retrieval calls as a [B, T] grid (T: the most calls in a trajectory)."""

    samples: list[dict[str, Any]]  # [S] in trajectory order, calls in order
    rows: torch.Tensor  # [S] trajectory of each sample
    cols: torch.Tensor  # [S] its call number in that trajectory
    mask: torch.Tensor  # [B, T] valid calls
    old_logp: torch.Tensor  # [B, T] rollout-time log-probs (0 where masked)

    def grid(self, per_sample: torch.Tensor) -> torch.Tensor:
        """[S] → [B, T] (0 where masked), differentiable."""
        out = per_sample.new_zeros(self.mask.shape)
        return out.index_put((self.rows, self.cols), per_sample)


def step_layout(trajs: Sequence[Trajectory]) -> StepLayout:
    samples, rows, cols = [], [], []
    for i, t in enumerate(trajs):
        for j, sample in enumerate(s.sample for s in t.searches if s.sample is not None):
            rows.append(i)
            cols.append(j)
            samples.append(sample)
    T = max(cols, default=-1) + 1
    r, c = torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)
    mask = torch.zeros(len(trajs), max(T, 1), dtype=torch.bool)  # [B, T]
    mask[r, c] = True
    layout = StepLayout(samples, r, c, mask, torch.zeros(mask.shape))
    layout.old_logp = layout.grid(torch.tensor([s["logprob"] for s in samples], dtype=torch.float32))
    return layout


def ppo_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool,
    call_rewards: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The answer's reward on each trajectory's last retrieval call (plus ``call_rewards`` [B, T]
    on every call: HARR's −β·k1), then GAE over the calls.

    rewards [B], values/mask [B, T] → (advantages, returns) [B, T]; whitened over the batch's
    calls when ``whiten`` (returns, the value targets, are not).
    """
    token_rewards = outcome_to_tokens(rewards, mask)  # [B, T]
    if call_rewards is not None:
        token_rewards = token_rewards + call_rewards * mask
    return gae(token_rewards, values, mask.float(), gamma, lam, whiten)


def ppo_loss(
    retriever: StochasticDenseRetriever,
    head: ValueHead,
    layout: StepLayout,
    adv: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    cfg: RetrieverRLConfig,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip per retrieval call + vf_coef · clipped value loss + β·KL (k3) to the initial tower."""
    lp, q = retriever.recompute(layout.samples)  # [S], [S, H]
    new = layout.grid(lp)  # [B, T]
    m = layout.mask.float()  # [B, T]
    loss, stats = policy_loss(new, layout.old_logp, adv, m, cfg.clip_eps, cfg.clip_eps, cfg.loss_agg)
    # the value loss is averaged as the policy loss (HARR's PPO: both masked_mean over one trajectory's calls)
    vloss, vstats = value_loss(layout.grid(head(q)), old_values, returns, m, cfg.vf_clip, cfg.loss_agg)
    out = {**{k: float(v) for k, v in stats.items()}, **vstats, "value_loss": float(vloss.detach())}
    loss = loss + cfg.vf_coef * vloss
    if cfg.kl_coef > 0 and not cfg.kl_in_reward:
        ref = layout.grid(retriever.recompute(layout.samples, reference=True)[0])  # [B, T]
        kl = kl_loss(new, ref, m, "k3_unclamped")
        loss = loss + cfg.kl_coef * kl
        out["kl"] = float(kl.detach())
    return loss, out
