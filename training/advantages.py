"""Advantage estimators: small pure torch functions with a shape comment on every tensor (REFERENCE §2).

Shapes: ``B`` rollouts, ``T`` per-token positions (targets, already shifted by the collator);
``mask`` [B, T] is 1 on model-generated tokens only, so prompt and observation tokens never get
an advantage. Groups are rollouts of the same prompt and ``group_ids`` [B] is the PROMPT's index
in the batch: a fresh id per sample makes every group a singleton and silently zeroes GRPO.

Conventions chosen here (and why):

- Group std is the unbiased one (``torch.std``), as verl's ``compute_grpo_outcome_advantage``.
  A singleton group has no baseline, so its advantage is 0 (verl instead uses mean 0, std 1).
- Batch whitening (Reinforce++) uses the population std over all valid tokens of the batch.
- GAE runs over model-token positions only: an observation token in the middle of a multi-turn
  rollout is skipped, i.e. the "next state" of a model token is the next MODEL token. This is
  verl's ``compute_gae_advantage_return`` ("skip values and TD-error on observation tokens").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from harness.registry import Registry


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample mean and unbiased std of its group's rewards; std 0 for singleton groups."""
    mean = torch.zeros_like(rewards)  # [B]
    std = torch.zeros_like(rewards)  # [B]
    for g in torch.unique(group_ids):
        sel = group_ids == g  # [B] bool
        r = rewards[sel]  # [n_g]
        mean[sel] = r.mean()
        std[sel] = r.std(unbiased=True) if r.numel() > 1 else torch.zeros(())
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


def reinforce_pp(
    rewards: torch.Tensor, group_ids: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, eps: float = 1e-8
) -> torch.Tensor:
    """Reinforce++ with a group-mean baseline (R1-Searcher; OpenRLHF ``reinforce_baseline``):
    subtract the group mean (no std), put the result on the last valid token, take the
    return-to-go, whiten over every valid token of the batch.  rewards [B] → [B, T]"""
    mean, _ = _group_stats(rewards.float(), group_ids)  # [B]
    centred = rewards.float() - mean  # [B]
    token_r = outcome_to_tokens(centred, mask)  # [B, T]
    returns = returns_to_go(token_r, mask, gamma)  # [B, T]
    return masked_whiten(returns, mask, eps) * mask


def gae(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
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
        adv = masked_whiten(adv, mask) * mask
    return adv, returns


# ---- ProRAG dual-granularity -------------------------------------------------------------------
Step = tuple[int, int, float]  # (token_start, token_end) in the trajectory's token axis, score


class StepScorer(Protocol):
    """Scores the reasoning steps of a rollout (ProRAG). A step is a half-open span of token
    positions in ``trajectory.token_ids``. A learned PRM plugs in by implementing this."""

    def score_steps(self, trajectory: Any) -> list[Step]: ...


class RuleStepScorer:
    """The shipped rule-based step scorer: one step per model turn (model segment).

    - a turn that issued a search scores ``hit`` (1.0) when a retrieved document contains a
      normalised gold answer, else 0.0;
    - the turn that ends the rollout with an answer scores ``format_score`` (0.5), the format
      term of ProRAG's step reward; any other turn scores 0.

    A search belongs to the model turn whose text contains its query; without text, search
    turn k is matched to the k-th model turn.
    """

    def __init__(self, hit: float = 1.0, format_score: float = 0.5) -> None:
        self.hit, self.format_score = hit, format_score

    def score_steps(self, trajectory: Any, positions: list[tuple[int, int]] | None = None) -> list[Any]:
        """Returns [(token_start, token_end, score)] per model turn. Legacy form: given target
        ``positions`` (one span per model turn, as ``Batch.step_spans``), returns the scores only."""
        from benchmarks.metrics import normalize_answer

        golds = [g for g in (normalize_answer(a) for a in trajectory.answers) if g]
        spans, texts, pos = [], [], 0
        for seg in trajectory.segments:
            if seg.role == "model":
                spans.append((pos, pos + len(seg.token_ids)))
                texts.append(seg.text)
            pos += len(seg.token_ids)
        scores = [0.0] * len(spans)
        for s in trajectory.searches:
            k = next((i for i, t in enumerate(texts) if t and s.query and s.query in t), s.turn)
            if 0 <= k < len(scores):
                hit = any(g in normalize_answer(d.contents) for d in s.docs for g in golds)
                scores[k] = max(scores[k], self.hit if hit else 0.0)
        if scores and trajectory.finish_reason == "answer":
            scores[-1] = max(scores[-1], self.format_score)
        if positions is not None:
            return scores[: len(positions)]
        return [(a, b, sc) for (a, b), sc in zip(spans, scores, strict=True)]


def step_score_tensor(trajs: list[Any], scorer: StepScorer, T: int) -> torch.Tensor:
    """Paint each step's score on its tokens, in the TARGET axis (token i is target i − 1).  → [B, T]"""
    out = torch.zeros(len(trajs), T)  # [B, T]
    for i, traj in enumerate(trajs):
        for start, end, score in scorer.score_steps(traj):
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
    eps: float = 1e-6,
) -> torch.Tensor:
    """ProRAG: A_{i,t} = A^out_i + β · A^step_{i,t}.

    ``outcome`` [B] is group-normalised as in GRPO; ``step_scores`` [B, T] holds each step's
    score on that step's generated tokens and is normalised (mean, population std) over all
    valid tokens of the group.  → [B, T]
    """
    a_out = grpo(outcome, group_ids, mask, eps)  # [B, T]
    a_step = torch.zeros(step_scores.shape, dtype=torch.float32)  # [B, T]
    for g in torch.unique(group_ids):
        sel = group_ids == g  # [B] bool
        vals = step_scores[sel][mask[sel].bool()].float()  # [N_valid in group]
        if vals.numel():
            std = vals.std(unbiased=False) if vals.numel() > 1 else torch.tensor(0.0)
            a_step[sel] = (step_scores[sel].float() - vals.mean()) / (std + eps)
    return (a_out + beta * a_step) * mask


ADVANTAGES: Registry[Callable] = Registry("advantage")
ADVANTAGES.register("grpo", grpo)
ADVANTAGES.register("reinforce_pp", reinforce_pp)
ADVANTAGES.register("gae", gae)
ADVANTAGES.register("dual_granularity", dual_granularity)
