"""Supervised fine-tuning (``algo.kind: sft``) on the RL trainer's pieces.

Same ``collate`` (loss mask from segment roles: model tokens only, never prompts or
observations), same DeepSpeed engine (``engine.initialize``), same checkpoints
(``checkpoint.save_checkpoint`` / ``export_hf``) and the same metrics log. The data are
trajectories from :mod:`training.sft.sft_data` (run directories filtered by score, chat-messages
JSONL, synthesized trajectories). One step = ``sft.batch_size`` trajectories, one optimizer
step; the loss is the token mean of the negative log-likelihood over the step's model tokens.
"""

from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from harness.models import load_tokenizer
from harness.tokenization import byte_tokenizer
from harness.types import Trajectory
from training.batch import Batch, collate
from training.best_val import BestSelection, BestValidation, write_final
from training.checkpoint import divergence_advice, export_hf, restore_position, resume_checkpoint, save_position
from training.config import TrainConfig
from training.divergence import NonFiniteGuard, poisoned, update_applied
from training.engine import build_model, initialize, optimizer_step, rank_and_world
from training.epochs import EpochSampler, split_held_out
from training.logging_utils import MetricsLog, ProgressBar, open_run_records
from training.logprobs import window_token_stats
from training.sft.sft_data import load_sources
from training.sft.sft_weights import tag_id_weights, token_weights, weighted_token_mean

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def sft_tokenizer(cfg: TrainConfig) -> PreTrainedTokenizerBase:
    """The policy's tokenizer: the byte tokenizer for ``model.tiny``, else the model's own."""
    if cfg.model.tiny is not None:
        return byte_tokenizer()

    return load_tokenizer(cfg.model.path)


class SFTTrainer:
    """Trains ``cfg.model`` on ``trajectories`` (or ``cfg.sft.sources`` when none are given)."""

    def __init__(self, cfg: TrainConfig, out: Path, trajectories: list[Trajectory] | None = None) -> None:
        self.cfg, self.out = cfg, Path(out)
        self.rank, self.world = rank_and_world()
        torch.manual_seed(cfg.trainer.seed)
        if cfg.optim.threads:
            torch.set_num_threads(cfg.optim.threads)
        self.tokenizer = sft_tokenizer(cfg)
        chat = cfg.rollout.agent.chat
        data = trajectories if trajectories is not None else load_sources(cfg.sft.sources, self.tokenizer, chat)
        # sft.val_fraction held out (ProRAG's 1 %): val/loss every trainer.eval_every steps
        self.data, self.val = split_held_out(data, cfg.sft.val_fraction, cfg.trainer.seed)
        metric = cfg.trainer.best_metric
        self.best = BestSelection(BestValidation(metric), self.out, self.rank) if metric else None
        bs = cfg.sft.batch_size
        if bs % self.world:
            raise ValueError(f"sft.batch_size={bs} must divide by {self.world} ranks")
        model = build_model(cfg.model, vocab_size=len(self.tokenizer))
        self.policy = initialize(model, cfg.optim, cfg.optim.lr, bs, max_steps=cfg.trainer.max_steps)
        self.sampler = EpochSampler(len(self.data), cfg.trainer.seed, cfg.sft.shuffle)
        self.tags = tag_id_weights(self.tokenizer, cfg.sft.tag_weights)  # [] unless sft.tag_weights
        self.step_no = 0
        self.run_id = uuid.uuid4().hex  # this run's checkpoints carry it: pruning never touches another run's
        self.guard = NonFiniteGuard(
            cfg.trainer.max_nonfinite_steps, partial(divergence_advice, self.out / "checkpoints")
        )
        self.log: MetricsLog | None = None  # opened by the first step (open_run_records)
        self._resumed: int | None = None
        n_tok = sum(t.generated_tokens for t in self.data)
        logger.info("SFT on %d trajectories (%d trained tokens)", len(self.data), n_tok)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def train(self) -> Path:
        """Run to ``trainer.max_steps``; returns the exported model folder."""
        c = self.cfg.trainer
        with ProgressBar(c.max_steps, self.step_no, enabled=c.progress and self.rank == 0) as bar:
            while self.step_no < c.max_steps:
                bar.update(self.step_no + 1, self.step())
        if not c.save_every or self.step_no % c.save_every:
            self.save()
        final = write_final(self.best, lambda d: export_hf(self.policy, self.tokenizer, d), self.out)
        if self.log is not None:
            self.log.close()
        return final

    def step(self) -> dict[str, float]:
        """One optimizer step over ``sft.batch_size`` trajectories (this rank's share); skipped when
        its loss or gradient is not finite (:mod:`training.divergence`)."""
        if self.rank == 0 and self.log is None:
            self.log = open_run_records(self.out, self.cfg, self._resumed)
        t0 = time.perf_counter()
        bs = self.cfg.sft.batch_size
        idx = self.sampler.next(bs)
        per = bs // self.world
        trajs = [self.data[i] for i in idx[self.rank * per : (self.rank + 1) * per]]
        batch = collate(trajs, pad_id=self.pad_id, max_len=self.cfg.algo.max_len)
        stats = self.update(batch)
        self.step_no += 1
        metrics = {
            **stats,
            **self.guard.record(self.step_no, int(not update_applied(self.policy))),
            "epoch": float(self.sampler.epoch),
            "tokens/trained": float(batch.n_tokens),
            "time/step_s": time.perf_counter() - t0,
            "lr": float(self.policy.get_lr()[0]),
        }
        c = self.cfg.trainer
        validate = bool(self.val) and c.eval_every and self.step_no % c.eval_every == 0
        if validate:
            metrics["val/loss"] = self.evaluate_loss(self.val)
        if self.log is not None:
            self.log.write(self.step_no, metrics)
        if validate and self.best is not None:
            export = lambda d: export_hf(self.policy, self.tokenizer, d)  # noqa: E731
            self.best.keep_if_best({"loss": metrics["val/loss"]}, self.step_no, export, self.log)
        self.guard.stop_if_diverged()
        if c.save_every and self.step_no % c.save_every == 0 and self.guard.may_checkpoint():
            self.save()
        return metrics

    def nll(self, batch: Batch, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-token negative log-likelihood and mask of a micro-batch.  → [b, T'], [b, T']"""
        Lm = max(2, int(batch.attention_mask[rows].sum(1).max()))  # this micro-batch's own length
        mask = batch.mask[rows, : Lm - 1]  # [b, Lm−1]
        st = window_token_stats(  # chunked over the vocabulary projection: no [b, Lm, V] logits
            self.policy,
            batch.input_ids[rows, :Lm],
            batch.attention_mask[rows, :Lm],
            batch.targets[rows, : Lm - 1],
            mask,
            self.cfg.model.logits_chunk_tokens,
        )
        return -st.logp, mask

    def update(self, batch: Batch) -> dict[str, float]:
        """Micro-batches, one DeepSpeed optimizer step. The loss is the step's token mean: each
        micro-batch contributes sum(nll·mask) / (the step's model tokens), times the
        accumulation steps because DeepSpeed divides each backward by them."""
        B, mb = batch.input_ids.shape[0], self.cfg.optim.micro_batch_size
        weights = token_weights(batch.targets, self.tags)  # [B, T] 1 everywhere without sft.tag_weights
        total_tokens = max(1.0, float((batch.mask * weights).sum()))  # weighted: ProRAG's Σ w
        gas = self.policy.gradient_accumulation_steps()
        slices = [slice(i, min(i + mb, B)) for i in range(0, B, mb)]
        # ds_config sized the accumulation for exactly these slices: the last one steps the optimizer.
        if len(slices) != gas:
            raise RuntimeError(f"{len(slices)} micro-batches but DeepSpeed accumulates {gas}")
        loss_sum, grad_norm = 0.0, None
        for s in slices:
            nll, m = self.nll(batch, s)
            part = weighted_token_mean(nll, m, weights[s, : m.shape[1]], total_tokens)
            loss_sum += float(part.detach())
            self.policy.backward(poisoned(part * gas))
            gn = optimizer_step(self.policy)
            grad_norm = gn if gn is not None else grad_norm
        out = {"loss": loss_sum, "ppl": float(torch.exp(torch.tensor(loss_sum)))}
        if grad_norm is not None:
            out["grad_norm"] = grad_norm
        return out

    @torch.no_grad()
    def evaluate_loss(self, trajs: list[Trajectory] | None = None) -> float:
        """The training loss of ``trajs`` (default: all the training data) under the current
        weights: the token mean of the NLL, weighted by ``sft.tag_weights`` as the training loss
        is (ProRAG's eval_loss comes from the same weighted compute_loss, prorag/sft/trainer.py)."""
        trajs = trajs or self.data
        tot, n = 0.0, 0.0
        for i in range(0, len(trajs), self.cfg.optim.micro_batch_size):
            batch = collate(
                trajs[i : i + self.cfg.optim.micro_batch_size], pad_id=self.pad_id, max_len=self.cfg.algo.max_len
            )
            nll, m = self.nll(batch, slice(0, batch.input_ids.shape[0]))
            w = token_weights(batch.targets, self.tags)[:, : m.shape[1]] * m  # [b, T'] 1 without tag weights
            tot += float((nll * w).sum())
            n += float(w.sum())
        return tot / max(1.0, n)

    def save(self) -> Path:
        """A checkpoint of this step; keeps this run's newest ``trainer.keep_checkpoints`` (as RL)."""
        path = save_position(self, self.policy, "sft", tokenizer=self.tokenizer)
        if self.best is not None:
            self.best.prune()  # a resume starts here or later: earlier bests are beaten
        return path

    def resume(self, run_dir: Path) -> None:
        """Continue from the newest intact checkpoint; the log drops the steps that run again."""
        ckpt, state = resume_checkpoint(run_dir, self.policy)
        restore_position(self, state)
        if self.best is not None:
            self.best.restore(self.step_no)
        logger.info("resumed SFT from %s at step %d", ckpt, self.step_no)

    def close(self) -> None:
        """Nothing runs in the background of this trainer: nothing to stop."""
