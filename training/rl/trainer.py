"""The RL training loop (``algo.kind: rl``). :meth:`RLTrainer.step` reads top to bottom:

sample prompts → rollouts (THE search agent) → rewards → collate (role-based loss mask, group
ids) → forward (reference log-probs, values, old log-probs once before any update) → advantages
→ ``ppo_epochs`` passes over ``ppo_mini_batch_size`` mini-batches, one DeepSpeed optimizer step
each (gradient accumulation over micro-batches) → weight sync into the rollout backend → log →
checkpoint → periodic validation (the eval path, ``benchmarks.evaluate``; see ``training.build``).
This module builds the trainer and runs the step around the update; the update itself (forwards,
advantages, mini-batches, losses) is :class:`training.rl.rl_update.RLUpdate`, a collaborator the
trainer builds from its models and holds as ``rl_update``.

Asynchronously (``trainer.async``; :mod:`training.rl.async_rollout`) the first two steps become a
take of finished groups from a producer that keeps generating during the update, at most
``max_staleness`` policy versions old; everything after is the same.

Data parallelism: every rank draws the same prompts for a step and rolls out its own contiguous
slice of them (whole groups per rank), so group advantages are exact; batch-wide statistics
(DAPO's token count) are per rank, but advantage whitening is over every rank's tokens
(all-reduced, as OpenRLHF and verl). DeepSpeed all-reduces the gradients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from harness.backends.base import SamplingParams
from harness.backends.vllm_sync import RL_ARGS as VLLM_RL_ARGS
from harness.memory import release_memory
from harness.types import Example, Trajectory
from training import losses
from training.advantages import ADVANTAGES
from training.batch import collate
from training.best_val import BestSelection, BestValidation, from_rank0, write_final
from training.checkpoint import divergence_advice, export_hf, restore_position, resume_checkpoint, save_and_prune
from training.config import TrainConfig, check_ranks, mini_batch_rows, updates_per_training_step
from training.divergence import NonFiniteGuard
from training.engine import (
    ValueHead,
    build_model,
    engine_device,
    frozen_copy,
    full_state_dict,
    initialize,
    rank_and_world,
)
from training.health import HealthGuard
from training.logging_utils import (
    MetricsLog,
    ProgressBar,
    memory_metrics,
    open_run_records,
    rollout_metrics,
)
from training.lora import apply_lora, base_model, lora_critic, merged_state_dict, save_adapter
from training.rewards import RewardOut, algo_step_scorer, build_reward
from training.rl.async_rollout import AsyncRollouts
from training.rl.dist_sync import DistributedWeightSync
from training.rl.rl_update import RLUpdate
from training.rl.rollout import PromptSampler, RolloutBatch, collect, sample_seed
from training.weight_sync import rank_safe_sync, sync_weights

if TYPE_CHECKING:
    from deepspeed import DeepSpeedEngine

    from harness.run_records import RunResults
    from pipelines.search_agent import SearchAgent

logger = logging.getLogger(__name__)


def behaviour_logprobs_caveat(cfg: TrainConfig) -> str | None:
    """What to warn of when the rollout correction may get behaviour log-probs of another temperature:
    a vLLM server harness did not launch may run with vLLM's default ``raw_logprobs`` (of the
    logits at temperature 1); harness's own launch asks for ``processed_logprobs``
    (``harness.backends.vllm_sync.RL_ARGS``). At temperature 1 (or greedy) both agree."""
    rb, temperature = cfg.rollout.backend, cfg.rollout.sampling.temperature
    if cfg.algo.rollout_correction.kind == "none" or rb.kind != "openai" or rb.launch or temperature in (0, 1):
        return None
    return (
        f"algo.rollout_correction at rollout.sampling.temperature={temperature} on a vLLM server harness "
        "did not launch: "
        f"start it with {' '.join(VLLM_RL_ARGS)}, or its behaviour log-probs are at temperature 1 "
        "(mismatch/abs_log_ratio in the step log shows the gap)"
    )


class RLTrainer:
    """``algo.kind: rl`` (a :class:`training.build.Trainer`): holds the collaborators (agent,
    engines, the update, reward, sampler, log); see the module docstring."""

    # Guards the sampler's position between the async producer and a checkpoint; a real lock only
    # once trainer.async's producer runs (:meth:`_start_async`).
    _sampler_lock: AbstractContextManager[object] = contextlib.nullcontext()
    # trainer.best_metric: the best validation so far (every rank knows its step; rank 0 its value)
    best: BestSelection | None = None

    def __init__(
        self,
        cfg: TrainConfig,
        agent: SearchAgent,
        examples: list[Example],
        out: Path,
        validate: Callable[[int], RunResults] | None = None,
    ) -> None:
        self.cfg, self.agent, self.out, self.validate = cfg, agent, Path(out), validate
        self.backend, self.tokenizer = agent.backend, agent.tokenizer
        self.rank, self.world = rank_and_world()
        check_ranks(cfg, self.world)  # the rest was checked when the recipe loaded
        loss_fn = losses.RLLoss.from_config(cfg.algo)
        check_rollout_support(cfg, agent, loss_fn)  # before any model is built
        advantage_fn, adv_info = ADVANTAGES.get(cfg.algo.advantage), ADVANTAGES.info(cfg.algo.advantage)
        seed_everything(cfg.trainer.seed)
        if cfg.optim.threads:
            torch.set_num_threads(cfg.optim.threads)
        a, o = cfg.algo, cfg.optim
        mini_rows = mini_batch_rows(cfg, self.world)  # rows per optimizer step on this rank
        mini_all_ranks = mini_rows * self.world  # DeepSpeed: gradient_accumulation = micro-batches per mini-batch
        # The LR warmup counts training steps, as verl's scheduler does: tell it how many optimizer steps one makes.
        self.updates_per_step = updates_per_training_step(cfg, self.world)
        model = build_model(cfg.model, vocab_size=len(self.tokenizer))
        lora = cfg.model.lora
        if lora is not None:
            model = apply_lora(model, lora)
        # The KL reference: a frozen copy taken before any update, or with LoRA the policy itself
        # with its adapters disabled (the base; no second copy).
        ref = frozen_copy(model) if a.kl_coef > 0 and lora is None else None
        steps = cfg.trainer.max_steps  # the LR schedule decays over the run
        self.policy = initialize(model, o, o.lr, mini_all_ranks, o.warmup_steps, self.updates_per_step, steps)
        self.dist_sync = None  # rollout.weight_sync: distributed (one SGLang server, by broadcast)
        if cfg.rollout.weight_sync == "distributed":
            if not hasattr(self.backend, "update_weights_from_distributed"):
                raise ValueError("rollout.weight_sync=distributed needs the sglang backend")
            self.dist_sync = DistributedWeightSync(self.backend)
        self.device = engine_device(self.policy)  # batches, reference, critic, rollout model live here
        if ref is not None:  # DeepSpeed moved the policy; the frozen copy is ours to place
            ref.to(self.device, dtype=torch.bfloat16 if o.bf16 else None)
        self._place_rollout_model()
        self.critic = None
        # Built before the critic, as always: a step scorer that builds a model draws from the RNG.
        step_scorer = algo_step_scorer(a, self.device) if adv_info.get("needs_step_scores") else None
        if caveat := behaviour_logprobs_caveat(cfg):
            logger.warning(caveat)
        if adv_info.get("needs_critic"):  # PPO: a critic on the same LM architecture
            self.critic = self._build_critic(mini_all_ranks)
        self.rl_update = RLUpdate(
            cfg,
            policy=self.policy,
            critic=self.critic,
            ref=ref,
            ref_is_base=a.kl_coef > 0 and lora is not None,
            loss_fn=loss_fn,
            advantage_fn=advantage_fn,
            step_scorer=step_scorer,
            device=self.device,
            mini_rows=mini_rows,
            updates_per_step=self.updates_per_step,
        )
        self.reward_fn = build_reward(a.reward)
        self.sampler = PromptSampler(examples, seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)
        s = cfg.rollout.sampling  # the agent was built with the same values (training.validation.rollout_agent_options)
        self.sampling = SamplingParams(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p)
        self.step_no = 0  # optimizer steps taken = the policy version the backend serves
        self.async_rollouts: AsyncRollouts | None = None  # trainer.async's producer, from the first step
        # This run's checkpoints carry its id: pruning never touches another run's.
        self.run_id = uuid.uuid4().hex
        self._saved_step, self._saved_at = -1, time.monotonic()  # the last checkpoint: step, clock
        self.guard = NonFiniteGuard(
            cfg.trainer.max_nonfinite_steps, partial(divergence_advice, self.out / "checkpoints")
        )
        self.health = HealthGuard(cfg.trainer.stop_on, cfg.trainer.stop_on_steps)  # trainer.stop_on
        # Nothing is written and nothing synced until the run starts (the first step, after any
        # resume): a build or a resume that fails leaves the run folder as it was.
        self.log: MetricsLog | None = None
        self._resumed: int | None = None  # the step a resume restored
        self._synced: int | None = None  # the policy version the backend serves
        metric = cfg.trainer.best_metric
        self.best = BestSelection(BestValidation(metric), self.out, self.rank) if metric else None

    def _build_critic(self, mini_all_ranks: int) -> DeepSpeedEngine:
        """PPO's value model: a :class:`training.engine.ValueHead` on a fresh LM of the policy's
        architecture (LoRA adapters in its body when the policy has them), in its own engine."""
        cfg, o = self.cfg, self.cfg.optim
        critic = ValueHead(build_model(cfg.model, vocab_size=len(self.tokenizer)))
        if cfg.model.lora is not None:
            critic = lora_critic(critic, cfg.model.lora)
        steps = cfg.trainer.max_steps
        return initialize(critic, o, o.critic_lr, mini_all_ranks, o.critic_warmup_steps, self.updates_per_step, steps)

    # ---- the loop --------------------------------------------------------------------------
    def train(self) -> Path:
        """Run to ``trainer.max_steps`` (from wherever a resume left off); returns the exported model."""
        c = self.cfg.trainer
        try:
            self._start()  # records and backend before the step-0 validation
            if self.validate is not None and c.eval_every and c.val_before_train and self.step_no == 0:
                self.run_validation()  # step 0: the policy training starts from
            with ProgressBar(c.max_steps, self.step_no, enabled=c.progress and self.rank == 0) as bar:
                while self.step_no < c.max_steps:
                    metrics = self.step()
                    bar.update(self.step_no, metrics)
        finally:
            self.close()
        if self._saved_step != self.step_no:
            self.save()  # the last step is always resumable
        final = write_final(self.best, lambda d: export_hf(self.policy, self.tokenizer, d), self.out)
        if self.log is not None:
            self.log.close()
        return final

    def step(self) -> dict[str, float]:
        """One iteration: rollouts → rewards → advantages → update → sync → log → checkpoint → eval."""
        self._start()
        c, t0 = self.cfg, time.perf_counter()
        stats: dict[str, float] = {}
        skipped = 0  # optimizer steps skipped as non-finite in this step
        if not c.trainer.async_.enabled:
            # 1–3. prompts, rollouts through THE agent, rewards, DAPO's group filter and its refill
            filled = self._rollouts_filled()
            rollout, scored, keep, reward_s = filled.rollout, filled.scored, filled.keep, filled.reward_s
            stats["filter/gen_batches"] = float(filled.batches)
        else:  # 1–2 asynchronously: finished groups from the producer, at most max_staleness versions old
            rollout = self._take_async(stats)
            t_scoring = time.perf_counter()
            scored = [self.reward_fn(t) for t in rollout.trajectories]
            reward_s = time.perf_counter() - t_scoring
            keep = informative_rows(rollout.group_ids, [r for r, _ in scored]) if c.algo.filter_groups else None
        rewards = [r for r, _ in scored]
        # 3. rewards are scored with each batch of rollouts (the refill reads them): their time apart
        t_reward = time.perf_counter()
        t_rollout = t_reward - reward_s
        keep = list(range(len(rewards))) if keep is None else keep
        if c.algo.shuffle_rows:  # OpenRLHF: mini-batches of random rows, reproducible per (seed, step)
            random.Random(c.trainer.seed * 1_000_003 + self.step_no).shuffle(keep)
        stats["groups/kept_frac"] = len(keep) / max(1, len(rewards))
        if keep:
            trajs = [rollout.trajectories[i] for i in keep]
            # 4. collate: token ids, loss mask from roles (0 on prompt/observation), group id = prompt index
            batch = collate(
                trajs, [rewards[i] for i in keep], [rollout.group_ids[i] for i in keep], self.pad_id, c.algo.max_len
            ).to(self.device)
            # 5. no-grad forwards: reference log-probs (KL), values (PPO), old log-probs if advantages need them
            fwd = self.rl_update.forward(batch)
            # 6. advantages (and returns for the critic)
            adv, returns = self.rl_update.advantages(batch, trajs, fwd)
            # 7. loss, backward, DeepSpeed steps: ppo_epochs × mini-batches optimizer steps (verl's schedule)
            stats.update(self.rl_update.update(batch, fwd, adv, returns, self.step_no))
            skipped = self.rl_update.skipped_updates
            trained_tokens, seen_tokens = float(batch.n_tokens), float(batch.attention_mask.sum())
        else:  # every group was uniform: no update this step (the policy is unchanged)
            logger.info("step %d: every group scored uniformly; no update", self.step_no + 1)
            stats["policy_updates"], trained_tokens, seen_tokens = 0.0, 0.0, 0.0
        self.step_no += 1
        t_update = time.perf_counter()
        # 8. weight sync: the backend serves the new policy, version = step_no (asynchronously:
        # with interrupt=finish the trajectories in flight end on the old weights first)
        if self.async_rollouts is not None and c.trainer.async_.interrupt == "finish":
            with self.async_rollouts.paused() as drained_s:
                self.sync()
            stats["async/drain_s"] = drained_s
        else:
            self.sync()
        if self.async_rollouts is not None:
            self.async_rollouts.set_version(self.step_no)
        t_sync = time.perf_counter()
        # 9. log
        metrics = {
            **rollout_metrics(rollout.trajectories, rewards, [p for _, p in scored], self.agent.dialect.name),
            **stats,
            **self.guard.record(self.step_no, skipped),
            "policy_version": float(rollout.policy_version),
            "time/rollout_s": t_rollout - t0,
            "time/reward_s": t_reward - t_rollout,
            "time/update_s": t_update - t_reward,
            "time/sync_s": t_sync - t_update,
            "time/step_s": t_sync - t0,
            "tokens/generated": float(sum(t.generated_tokens for t in rollout.trajectories)),
            "tokens/trained": trained_tokens,
        }
        release_memory()
        metrics.update(memory_metrics())
        metrics["rollout_tokens_per_s"] = metrics["tokens/generated"] / max(1e-9, t_rollout - t0)
        metrics["update_tokens_per_s"] = seen_tokens / max(1e-9, t_update - t_reward)
        metrics.update(self._device_metrics(seen_tokens, t_sync - t0))
        if self.log is not None:
            self.log.write(self.step_no, metrics)
            if c.trainer.save_rollouts:
                self.log.write_rollouts(self.step_no, rollout.trajectories, rewards, rollout.group_ids)
        self.guard.stop_if_diverged()
        self.health.record(self.step_no, metrics)
        self.health.stop_if_unhealthy()  # trainer.stop_on, after the step is logged, before its checkpoint
        # 10. checkpoint: every save_every steps, and once save_every_minutes have passed
        if self._save_due():
            self.save()
        # 11. periodic validation through the eval path, into this run's folder
        if self.validate is not None and c.trainer.eval_every and self.step_no % c.trainer.eval_every == 0:
            self.run_validation()
        return metrics

    # ---- asynchronous rollouts ---------------------------------------------------------------
    def _start_async(self) -> None:
        """The producer of ``trainer.async`` (started on the first step, after any resume)."""
        c = self.cfg
        if self.async_rollouts is not None or not c.trainer.async_.enabled:
            return
        lock = threading.Lock()  # the producer draws prompts; a checkpoint reads the position

        def next_prompt() -> Example:
            with lock:
                return self.sampler.next(1)[0]

        self._sampler_lock = lock
        self.async_rollouts = AsyncRollouts(
            self._run_group,
            next_prompt,
            groups_per_step=c.rollout.prompts_per_step,
            max_staleness=c.trainer.async_.max_staleness,
            max_running=c.trainer.async_.max_running_groups,
            version=self.step_no,
        ).start()

    async def _run_group(self, example: Example, seq: int, version: int) -> list[Trajectory]:
        """One prompt's ``n_samples`` rollouts through THE agent (as ``collect`` makes them), seeded
        by the group's submission order, tagged with the version it started on."""
        n, params = self.cfg.rollout.n_samples, self.sampling.with_(logprobs=True)
        seed = self.cfg.rollout_seed
        return list(
            await asyncio.gather(
                *(
                    self.agent.arun(
                        example,
                        sample_index=j,
                        sampling=params.with_(seed=sample_seed(seed, seq, j, n)),
                        policy_version=version,
                    )
                    for j in range(n)
                )
            )
        )

    def _rollouts_filled(self) -> FilledRollouts:
        """The step's rollouts, their scores, the rows to train (None: all) and how many batches of
        prompts were drawn. Each batch: this rank's slice of ``rollout.prompts_per_step`` prompts,
        ``n_samples`` rollouts each through THE agent, tagged with the serving policy version.
        With ``algo.filter_groups`` the groups whose rewards are all equal are left out (DAPO's
        filter), and with ``algo.filter_max_gen_batches`` != 1 further batches are drawn until
        ``prompts_per_step`` informative groups are kept, the first of them trained (DAPO's refill)."""
        c = self.cfg
        per_rank = c.rollout.prompts_per_step // self.world
        limit = c.algo.filter_max_gen_batches
        trajectories: list[Trajectory] = []
        group_ids: list[int] = []
        scored: list[RewardOut] = []
        batches, reward_s = 0, 0.0
        seed = c.rollout_seed + self.step_no  # the step's; each rollout's own seed adds its group and sample
        while True:
            prompts = self.sampler.next(c.rollout.prompts_per_step)[self.rank * per_rank : (self.rank + 1) * per_rank]
            # A refill batch's groups come after the batches before (distinct ids and sampling seeds).
            offset = batches * c.rollout.prompts_per_step + self.rank * per_rank
            batch = collect(self.agent, prompts, c.rollout.n_samples, self.sampling, self.step_no, seed, offset)
            batches += 1
            trajectories += batch.trajectories
            group_ids += batch.group_ids
            t_scoring = time.perf_counter()
            scored += [self.reward_fn(t) for t in batch.trajectories]
            reward_s += time.perf_counter() - t_scoring
            if not c.algo.filter_groups:
                everything = RolloutBatch(trajectories, group_ids, self.step_no)
                return FilledRollouts(everything, scored, None, batches, reward_s)
            keep = informative_rows(group_ids, [r for r, _ in scored])
            kept_groups = list(dict.fromkeys(group_ids[i] for i in keep))  # in rollout order
            if limit == 1 or len(kept_groups) >= per_rank or (limit and batches >= limit):
                break
            n_kept = len(kept_groups)
            logger.info("step %d: %d of %d informative groups; more prompts", self.step_no + 1, n_kept, per_rank)
        first = set(kept_groups[:per_rank])
        rows = [i for i in keep if group_ids[i] in first]
        return FilledRollouts(RolloutBatch(trajectories, group_ids, self.step_no), scored, rows, batches, reward_s)

    def _take_async(self, stats: dict[str, float]) -> RolloutBatch:
        """This step's groups from the producer, as a :class:`RolloutBatch` (group id = order taken)."""
        self._start_async()
        groups, took = self.async_rollouts.take(self.cfg.rollout.prompts_per_step, self.step_no)
        trajs = [t for g in groups for t in g.trajectories]
        gids = [k for k, g in enumerate(groups) for _ in g.trajectories]
        stats.update(took.metrics(self.async_rollouts.dropped))
        seg = [self.step_no - v for g in groups for v in g.segment_versions()]
        if seg:  # how far behind the trainer the tokens are (a segment may be newer than its head)
            stats["async/segment_staleness_mean"] = float(np.mean(seg))
            stats["async/segment_staleness_max"] = float(max(seg))
        return RolloutBatch(trajs, gids, min(g.head_version for g in groups))

    def close(self) -> None:
        """Stop the asynchronous producer, if any (its in-flight and buffered groups are dropped)."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
            self.async_rollouts = None

    # ---- batches and devices -------------------------------------------------------------------
    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _place_rollout_model(self) -> None:
        """An in-process rollout model (the hf backend) generates on the engine's device."""
        if getattr(self.backend, "name", None) == "hf" and hasattr(self.backend, "to"):
            self.backend.to(self.device)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def _device_metrics(self, tokens: float, step_s: float) -> dict[str, float]:
        """Tokens (prompt + response, all rows) per second of the whole step; on CUDA the step's
        peak allocated GPU memory (the counter is reset for the next step)."""
        out = {"tokens_per_s": tokens / max(1e-9, step_s)}
        if self.device.type == "cuda":
            out["mem/gpu_peak_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
            out["mem/gpu_reserved_gb"] = torch.cuda.memory_reserved(self.device) / 2**30
            torch.cuda.reset_peak_memory_stats(self.device)
        return out

    # ---- sync, checkpoints, validation ------------------------------------------------------
    def _start(self) -> None:
        """What the run's first step needs, once: the run records (rank 0) and the backend serving
        the policy's exact weights (after any resume)."""
        if self.rank == 0 and self.log is None:
            self.log = open_run_records(self.out, self.cfg, self._resumed)
        if self._synced != self.step_no:
            self.sync()

    def sync(self) -> None:
        """Push the policy's weights into the rollout backend, tagged with ``step_no``: merged
        full weights (LoRA: W + ΔW), or the adapter itself (``model.lora.sync: adapter``). With
        several ranks and a server, only rank 0 exports and posts, behind a barrier
        (:func:`training.weight_sync.rank_safe_sync`)."""
        lora = self.cfg.model.lora
        zero3 = getattr(self.policy, "zero_optimization_stage", lambda: 0)() == 3
        adapter = lora is not None and lora.sync == "adapter"
        # Asynchronous rollouts with interrupt=continue: completions in flight go on under the new weights.
        a = self.cfg.trainer.async_
        async_continue = a.enabled and a.interrupt == "continue"
        box: dict[str, dict[str, torch.Tensor]] = {}

        def export() -> None:
            box["w"] = merged_state_dict(self.policy) if lora is not None else full_state_dict(self.policy)

        def push() -> None:
            if adapter:  # SGLang loads the adapter itself
                path = save_adapter(self.policy, self.out / "sync" / f"adapter-v{self.step_no}")
                self.backend.update_lora_adapter(path, self.step_no)
                return
            if "w" not in box:
                export()
            if self.dist_sync is not None:  # broadcast, no disk round trip
                self.dist_sync.push(box.pop("w"), self.step_no, "pause" if async_continue else "drain")
                return
            sync_weights(
                self.backend,
                box.pop("w"),
                self.step_no,
                scratch=self.out / "sync",
                tokenizer=self.tokenizer,
                model_config=base_model(self.policy).config,
                in_flight="pause" if async_continue else "drain",
            )

        gather = export if zero3 and not adapter else None
        rank_safe_sync(self.backend, push, self.step_no, self.rank, self.world, gather, adapter)
        self._synced = self.step_no

    def _save_due(self) -> bool:
        """Whether this step ends with a checkpoint (rank 0's clock decides for every rank)."""
        t = self.cfg.trainer
        due = bool(t.save_every) and self.step_no % t.save_every == 0
        if t.save_every_minutes > 0 and time.monotonic() - self._saved_at >= 60 * t.save_every_minutes:
            due = True
        if due:  # the same on every rank: the gradients the guard counted were all-reduced
            due = self.guard.may_checkpoint()
        return bool(from_rank0(int(due)))  # saving is collective: every rank must agree

    def save(self) -> Path:
        """A checkpoint of this step (atomic); keeps this run's newest ``trainer.keep_checkpoints``
        (a time-based checkpoint between two ``save_every`` steps is interim: see
        :func:`training.checkpoint.save_and_prune`)."""
        # Asynchronously the sampler's position is the producer's: prompts of groups in flight or
        # buffered at this checkpoint are not drawn again by a resumed run.
        with self._sampler_lock:
            state = {
                "sampler": self.sampler.state(),
                "policy_version": self.step_no,
                "run_id": self.run_id,
                "nonfinite": self.guard.state(),
            }
        t = self.cfg.trainer
        # Between two save_every steps (and before the last step), the clock took it: interim.
        interim = self.step_no < t.max_steps and not (t.save_every and self.step_no % t.save_every == 0)
        path = save_and_prune(
            self.out / "checkpoints",
            self.step_no,
            self.policy,
            state,
            t.keep_checkpoints,
            self.critic,
            self.tokenizer,
            interim=interim,
        )
        self._saved_step, self._saved_at = self.step_no, time.monotonic()
        if self.best is not None:
            self.best.prune()  # a resume starts here or later: earlier bests are beaten
        return path

    def resume(self, run_dir: Path) -> None:
        """Continue from the newest checkpoint: weights, optimizer, scheduler, RNG, data position, step."""
        # The steps after the checkpoint run again: the log drops them when it opens, to log them once.
        ckpt, state = resume_checkpoint(run_dir, self.policy, self.critic)
        restore_position(self, state)
        self._saved_step, self._saved_at = self.step_no, time.monotonic()
        if self.best is not None:
            self.best.restore(self.step_no)
        self.sync()  # the backend serves the restored policy (the checkpoint loaded: the run has started)
        logger.info("resumed from %s at step %d", ckpt, self.step_no)

    def run_validation(self) -> dict:
        """Validation through the eval path (``training.validation.Validation``); metrics logged as ``val/...``."""
        val = self.validate(self.step_no).metrics if self.rank == 0 else {}
        if self.log is not None:
            self.log.write(self.step_no, {f"val/{k}": float(v) for k, v in val.items() if isinstance(v, int | float)})
        if self.best is not None:
            self.best.keep_if_best(val, self.step_no, lambda d: export_hf(self.policy, self.tokenizer, d), self.log)
        return val


def check_rollout_support(cfg: TrainConfig, agent: SearchAgent, loss_fn: losses.RLLoss) -> None:
    """What the recipe needs of the rollout side, checked before any model is built (``ValueError``
    naming the key): ``model.lora.sync: adapter`` a backend that loads LoRA adapters, and a
    rollout correction the backend's logprob of every model token, which a dialect that rewrites
    its turns (and re-encodes them) cannot give."""
    backend, lora = agent.backend, cfg.model.lora
    if lora is not None and lora.sync == "adapter" and not hasattr(backend, "update_lora_adapter"):
        raise ValueError(
            f"model.lora.sync=adapter needs a backend that loads LoRA adapters (sglang, openai on vLLM), "
            f"not {getattr(backend, 'name', type(backend).__name__)!r}; use sync: merged"
        )
    rewrite = getattr(getattr(agent, "dialect", None), "rewrite", None)
    if loss_fn.corrects and rewrite is not None:
        raise ValueError(
            f"algo.rollout_correction.kind={cfg.algo.rollout_correction.kind} needs the backend's logprob of every "
            f"model token, but the {agent.dialect.name} dialect rewrites turns (re-encoded text has no "
            "backend logprobs); set algo.rollout_correction.kind=none"
        )


@dataclass
class FilledRollouts:
    """A synchronous step's rollouts (every batch drawn), their (reward, parts) scores, the rows to
    train (None: all), how many batches of prompts were drawn and the seconds spent scoring."""

    rollout: RolloutBatch
    scored: list[RewardOut]
    keep: list[int] | None
    batches: int
    reward_s: float


def informative_rows(group_ids: list[int], rewards: list[float]) -> list[int]:
    """Indices of the rollouts whose group's rewards are not all equal (DAPO's dynamic-sampling
    criterion: such a group has a nonzero reward std, so a group-relative advantage exists)."""
    by_group: dict[int, set[float]] = {}
    for g, r in zip(group_ids, rewards, strict=True):
        by_group.setdefault(g, set()).add(float(r))
    return [i for i, g in enumerate(group_ids) if len(by_group[g]) > 1]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
