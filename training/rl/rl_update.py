"""The RL trainer's update: from a collated batch to optimizer steps.

no-grad forwards (reference log-probs for the KL, the critic's values, the pre-update policy's
log-probs once before any update) → advantages (the registered estimator) → ``ppo_epochs`` passes
over ``ppo_mini_batch_size`` mini-batches, one DeepSpeed optimizer step each (gradient
accumulation over micro-batches of ``optim.micro_batch_size``), the critic's value loss beside the
policy's. :class:`RLUpdate` is a collaborator that :class:`training.rl.trainer.RLTrainer` builds and
holds: the trainer builds the models and hands them over, and runs the step around the update
(rollouts, sync, records, checkpoints).

Shapes: ``B`` rows of the step's batch, ``T`` target positions, ``W`` = T − offset positions of the
response window (targets before ``offset`` carry no model token in any row).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from harness.types import Trajectory
from training import losses
from training.advantages import AdvantageFn, AdvantageInputs, step_score_tensor
from training.batch import Batch
from training.config import TrainConfig
from training.divergence import poisoned, update_applied
from training.engine import autocast, optimizer_step
from training.logprobs import window_token_stats
from training.lora import adapters_disabled
from training.rewards import StepScorer

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine


@dataclass
class Forward:
    """No-grad forward results over the batch's response window (target positions ``offset``..T−1)."""

    offset: int  # first target position with a model token in any row; earlier logits are never needed
    ref_logp: torch.Tensor | None  # [B, W] reference log-probs (KL), W = T − offset
    values: torch.Tensor | None  # [B, W] critic values (PPO)
    old_logp: torch.Tensor | None  # [B, W] pre-update policy log-probs, when advantages need them


@dataclass(eq=False)
class RLUpdate:
    """Forwards, advantages and the update schedule of one RL step (see the module docstring).

    Everything it works with is handed to it by the trainer that builds it; the training step
    it updates for is an argument. Its one piece of state, ``skipped_updates``, counts the
    optimizer steps of the last :meth:`update` that were skipped as non-finite.
    """

    cfg: TrainConfig
    policy: DeepSpeedEngine  # the policy's DeepSpeed engine
    critic: DeepSpeedEngine | None  # PPO's value engine (over a training.engine.ValueHead), or None
    ref: torch.nn.Module | None  # a frozen reference model for the KL, or None
    ref_is_base: bool  # LoRA's KL reference: the policy with its adapters disabled
    loss_fn: losses.RLLoss
    advantage_fn: AdvantageFn
    step_scorer: StepScorer | None  # per-step scores for dual-granularity advantages, or None
    device: torch.device
    mini_rows: int  # rows per optimizer step on this rank
    updates_per_step: int  # optimizer steps one training step makes
    skipped_updates: int = 0  # optimizer steps skipped as non-finite in the last update

    def _logprobs(
        self, model: torch.nn.Module, batch: Batch, rows: slice, offset: int, entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs of the targets in the window, and the entropy if asked.  → [b, W], [b, W] | None

        Three savings, all exact: the micro-batch is cut to its own longest row (the batch is
        padded to the longest row of the whole step); only the window from ``offset`` on is
        scored (prompt positions never carry loss), and only at model tokens; and the vocabulary
        projection runs over chunks of ``model.logits_chunk_tokens`` tokens from the hidden
        states, so the [b, w, V] logits never exist (:mod:`training.logprobs`). Results are
        zero-padded back to W (those positions are padding, mask 0). They are of the policy that
        sampled: softmax(logits / ``rollout.sampling.temperature``), as verl scores them (greedy rollouts,
        temperature 0, are scored at temperature 1). With ``model.share_prompt`` each group's prompt
        runs once in the micro-batch (float order only: :func:`training.logprobs.shared_prompt_hidden`).
        """
        L, W = batch.input_ids.shape[1], batch.targets.shape[1] - offset
        Lm = min(L, max(int(batch.attention_mask[rows].sum(1).max()), offset + 2))  # this micro-batch's length
        st = window_token_stats(
            model,
            batch.input_ids[rows, :Lm],
            batch.attention_mask[rows, :Lm],
            batch.targets[rows, offset : Lm - 1],  # [b, w], w = Lm − 1 − offset
            batch.mask[rows, offset : Lm - 1],
            self.cfg.model.logits_chunk_tokens,
            entropy,
            self.cfg.rollout.sampling.temperature or 1.0,
            (batch.response_start[rows], batch.group_ids[rows]) if self.cfg.model.share_prompt else None,
        )

        def pad(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(x, (0, W - x.shape[1]))  # [b, W]

        return pad(st.logp), pad(st.entropy) if st.entropy is not None else None

    def _slices(self, batch: Batch) -> list[slice]:
        B, mb = batch.input_ids.shape[0], self.cfg.optim.micro_batch_size
        return [slice(i, min(i + mb, B)) for i in range(0, B, mb)]

    @torch.no_grad()
    def forward(self, batch: Batch) -> Forward:
        """Everything the advantages and losses need from models other than the training forward."""
        a = self.cfg.algo
        if self.loss_fn.corrects and not batch.has_rollout_logprobs:
            raise ValueError(
                f"algo.rollout_correction.kind={a.rollout_correction.kind} needs the backend's logprob of every "
                "model token, but this batch has model tokens without backend logprobs (a backend that returns "
                "none, or a dialect that rewrites a turn and re-encodes it); set algo.rollout_correction.kind=none"
            )
        offset = max(0, int(batch.response_start.min()) - 1)
        slices = self._slices(batch)

        def cat(fn: Callable[[slice], torch.Tensor]) -> torch.Tensor:
            return torch.cat([fn(s) for s in slices])

        ref = None
        if self.ref is not None:  # not a DeepSpeed engine: bf16 autocast on CUDA when the run is bf16
            with autocast(self.device, self.cfg.optim.bf16 or self.cfg.model.dtype == "bfloat16"):
                ref = cat(lambda s: self._logprobs(self.ref, batch, s, offset)[0].float())
        elif self.ref_is_base:
            with adapters_disabled(self.policy):
                ref = cat(lambda s: self._logprobs(self.policy, batch, s, offset)[0].float())
        values = None
        if self.critic is not None:
            values = cat(lambda s: self.critic(batch.input_ids[s], batch.attention_mask[s])[:, offset:-1])
        # Old log-probs are computed ONCE, before any update. With one epoch and one mini-batch the
        # training forward runs before the only optimizer step, so it yields them for free; with
        # several updates per batch (or advantages that read them) a separate pass is needed.
        # Either way they are the policy before this step's update: what the rollout correction
        # compares the backend's log-probs with (AReaL's proximal policy), so it needs no pass of its own.
        old = None
        if self.updates_per_step > 1 or (ref is not None and a.kl_in_reward):
            old = cat(lambda s: self._logprobs(self.policy, batch, s, offset)[0])
        return Forward(offset, ref, values, old)

    def _mini_batches(self, batch: Batch) -> list[list[slice]]:
        """The batch's mini-batches (``mini_rows`` rows each), each a list of micro-batch slices.

        Every mini-batch has the same number of micro-batches, equal to DeepSpeed's
        ``gradient_accumulation_steps``, so the optimizer steps exactly at each mini-batch's end."""
        B, mb = batch.input_ids.shape[0], self.cfg.optim.micro_batch_size
        rows = min(self.mini_rows, B)
        out = []
        for start in range(0, B, rows):
            end = min(start + rows, B)
            out.append([slice(i, min(i + mb, end)) for i in range(start, end, mb)])
        return out

    def advantages(
        self, batch: Batch, trajs: list[Trajectory], fwd: Forward
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token advantages [B, W] (and returns [B, W] for PPO's critic), from the registered estimator."""
        a, m = self.cfg.algo, batch.mask[:, fwd.offset :]  # [B, W]
        over = batch.response_mask[:, fwd.offset :] if a.gae_over == "response" else m  # [B, W] GAE's tokens
        x = AdvantageInputs(batch.rewards, batch.group_ids, over, values=fwd.values)
        if fwd.ref_logp is not None and a.kl_in_reward:  # −β·k1_t of the pre-update policy, per model token
            x.kl_reward = losses.kl_reward(fwd.old_logp, fwd.ref_logp, m, a.kl_coef)
        if self.step_scorer is not None:
            scores = step_score_tensor(trajs, self.step_scorer, batch.mask.shape[1])[:, fwd.offset :]  # [B, W]
            x.step_scores = scores.to(self.device)
        return self.advantage_fn(x, a)

    def update(
        self, batch: Batch, fwd: Forward, adv: torch.Tensor, returns: torch.Tensor | None, step_no: int
    ) -> dict[str, float]:
        """verl's schedule: ``ppo_epochs`` passes over the batch's mini-batches, one optimizer step per
        mini-batch (DeepSpeed accumulates its micro-batches). ``step_no`` is the training steps
        taken (the step being trained is ``step_no + 1``): before step ``critic_warmup`` only the
        critic learns (verl's ``trainer.critic_warmup``: its actor learns once ``critic_warmup <=
        global_steps``, counted from 1, so N gives N − 1 critic-only steps and 0 or 1 none). Stats
        are means over micro-batches; ``clip_frac/epoch_k`` per epoch."""
        a, o = self.cfg.algo, fwd.offset
        self.skipped_updates = 0
        mask = batch.mask[:, o:]  # [B, W]
        old = fwd.old_logp.clone() if fwd.old_logp is not None else torch.zeros_like(mask)  # [B, W]
        have_old = fwd.old_logp is not None
        value_mask = batch.response_mask[:, o:] if a.gae_over == "response" else mask  # [B, W] the critic's tokens
        train_policy = step_no + 1 >= a.critic_warmup
        entropy = self._wants_entropy(step_no)
        gas = self.policy.gradient_accumulation_steps()
        # The LRs this training step runs at (the schedule moves once per training step), logged as verl does.
        lrs = {"lr": float(self.policy.get_lr()[0])}
        if self.critic is not None:
            lrs["critic_lr"] = float(self.critic.get_lr()[0])
        acc: dict[str, list[float]] = {}
        policy_steps = 0
        for epoch in range(a.ppo_epochs):
            for mini in self._mini_batches(batch):
                rows = slice(mini[0].start, mini[-1].stop)
                mini_tokens = float(mask[rows].sum())  # DAPO's denominator: the optimizer step's tokens
                for s in mini:
                    st: dict[str, float] = {}
                    if train_policy:
                        st = self._policy_micro_step(batch, s, fwd, adv, old, have_old, mask, mini_tokens, gas, entropy)
                        policy_steps += int("grad_norm" in st)
                        if a.ppo_epochs > 1:
                            st[f"clip_frac/epoch_{epoch + 1}"] = st["clip_frac"]
                    if self.critic is not None:
                        st.update(self._critic_step(batch, s, fwd, returns, value_mask))
                    for k, v in st.items():
                        acc.setdefault(k, []).append(v)
            have_old = True
        if train_policy and policy_steps != self.updates_per_step:  # the LR schedule assumes this count
            raise RuntimeError(
                f"{policy_steps} policy optimizer steps this training step, expected {self.updates_per_step}"
            )
        out = {k: float(np.mean(v)) for k, v in acc.items()}
        out["policy_updates"] = float(policy_steps)  # optimizer steps this batch (0 in critic warm-up)
        if batch.has_rollout_logprobs and (train_policy or fwd.old_logp is not None):
            # The backend's log-probs vs the pre-update policy's over the whole batch: sync health,
            # and what the rollout correction acted on (algo.rollout_correction).
            out.update(losses.mismatch_stats(old, batch.rollout_logprobs[:, o:], mask, self.loss_fn.correction))
        return {**out, **lrs}

    def _policy_micro_step(
        self,
        batch: Batch,
        s: slice,
        fwd: Forward,
        adv: torch.Tensor,
        old: torch.Tensor,
        have_old: bool,
        mask: torch.Tensor,
        mini_tokens: float,
        gas: int,
        entropy: bool,
    ) -> dict[str, float]:
        """Forward, loss and backward of one micro-batch; DeepSpeed steps on the mini-batch's last."""
        o = fwd.offset
        logp, ent = self._logprobs(self.policy, batch, s, o, entropy)  # [b, W], [b, W] | None
        if not have_old:
            old[s] = logp.detach()  # one update per batch: this forward precedes the only optimizer step
        ref = fwd.ref_logp[s] if fwd.ref_logp is not None else None
        # Rollout correction: the backend's log-probs are the behaviour policy's (per token), old the proximal.
        behav = batch.rollout_logprobs[s, o:] if self.loss_fn.corrects else None  # [b, W]
        loss, st = self.loss_fn(logp, old[s], adv[s], mask[s], ent, ref, mini_tokens, gas, behav)
        self.policy.backward(poisoned(loss))
        gn = self._optimizer_step(self.policy)
        if gn is not None:
            st["grad_norm"] = gn
        st["loss"] = float(loss.detach())
        return st

    def _wants_entropy(self, step_no: int) -> bool:
        """Entropy is computed when the loss has a term for it, else on logging steps only
        (``trainer.entropy_every``; the step being trained is ``step_no + 1``)."""
        every = self.cfg.trainer.entropy_every
        return self.loss_fn.needs_entropy or (every > 0 and (step_no + 1) % every == 0)

    def _critic_step(
        self, batch: Batch, s: slice, fwd: Forward, returns: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, float]:
        """One micro-batch of PPO's clipped value loss."""
        v = self.critic(batch.input_ids[s], batch.attention_mask[s])[:, fwd.offset : -1]  # [b, W]
        vloss, st = losses.value_loss(v, fwd.values[s], returns[s], mask[s], self.cfg.algo.vf_clip)
        self.critic.backward(poisoned(self.cfg.algo.vf_coef * vloss))
        self._optimizer_step(self.critic)
        return {**st, "value_loss": float(vloss.detach())}

    def _optimizer_step(self, engine: DeepSpeedEngine) -> float | None:
        """:func:`training.engine.optimizer_step`, counting a step skipped as non-finite."""
        gn = optimizer_step(engine)
        if gn is not None and not update_applied(engine):
            self.skipped_updates += 1
        return gn
