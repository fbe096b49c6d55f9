"""A process reward model (ProRAG stage 2b): ``algo.kind: prm`` training.

The PRM is the policy's LM body with a scalar head (:class:`~training.engine.ValueHead`) read on
the LAST token of ``prefix + step + EOS``, where a step is one model turn plus its observation
(the MCTS records of :mod:`training.data.mcts`). As in ProRAG (``prorag/prm/train.py``: TRL's
``RewardTrainer`` on ``AutoModelForSequenceClassification(num_labels=1)``, input
``prompt + history + step + eos``), the loss is pairwise Bradley–Terry on contrastive sibling
steps, ``−log σ(r_chosen − r_rejected)``; ``prm.loss: pointwise`` instead fits ``σ(r)`` to each
step's MCTS value with binary cross-entropy (values must lie in [0, 1], as ``prorag_f1`` values do).
A held-out share of the pairs (``prm.val_fraction``, ProRAG: 2 %) gives the logged pair accuracy.

ProRAG's settings (scripts/prm.sh): lr 2e-5, 3 epochs, 32 pairs per optimizer step a GPU (4 × 8
accumulation; 128 on the 4 GPUs it runs on, configs/train/prorag_prm.yaml), full fine-tuning
from the SFT model. Sequences are token ids as the agent produced them, so the PRM shares the
policy's tokenizer (ProRAG's PRM starts from its SFT model too).

The trained PRM (saving, loading it back, scoring, the RL step scorer, one PRM per node) is
:mod:`training.prm.prm_scorer`; its public names are importable from here too.
"""

from __future__ import annotations

import logging
import time
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from training.best_val import BestSelection, BestValidation
from training.checkpoint import divergence_advice, restore_position, resume_checkpoint, save_position
from training.config import TrainConfig
from training.divergence import NonFiniteGuard, poisoned, update_applied
from training.engine import ValueHead, build_model, initialize, optimizer_step, rank_and_world, unwrap
from training.epochs import EpochSampler, split_held_out
from training.logging_utils import MetricsLog, ProgressBar, open_run_records
from training.lora import lora_critic
from training.prm.prm_loss import PRM_LOSSES as PRM_LOSSES
from training.prm.prm_loss import PairExample, fitting, load_pairs
from training.prm.prm_loss import PointExample as PointExample
from training.prm.prm_loss import load_points as load_points
from training.prm.prm_loss import pairwise_loss as pairwise_loss
from training.prm.prm_loss import pointwise_loss as pointwise_loss
from training.prm.prm_scorer import PRM as PRM
from training.prm.prm_scorer import PRMStepScorer as PRMStepScorer
from training.prm.prm_scorer import load_prm as load_prm
from training.prm.prm_scorer import prorag_step_format as prorag_step_format
from training.prm.prm_scorer import save_prm, scores_of
from training.prm.prm_scorer import step_sequences as step_sequences
from training.sft.sft import sft_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


def prm_tokenizer(cfg: TrainConfig) -> PreTrainedTokenizerBase:
    return sft_tokenizer(cfg)


class PRMTrainer:
    """``algo.kind: prm``: trains a PRM on ``prm.data`` (MCTS output folders); see the module docstring."""

    def __init__(self, cfg: TrainConfig, out: Path) -> None:
        self.cfg, self.out, p = cfg, Path(out), cfg.prm
        self.rank, self.world = rank_and_world()
        torch.manual_seed(cfg.trainer.seed)
        if cfg.optim.threads:
            torch.set_num_threads(cfg.optim.threads)
        if not p.data:
            raise ValueError("algo.kind=prm needs prm.data: MCTS output folders (harness data mcts --out)")
        self.tokenizer = prm_tokenizer(cfg)
        eos = self.tokenizer.eos_token_id if p.append_eos else None
        pairs = load_pairs(list(p.data), eos)
        # ProRAG splits, then TRL's RewardTrainer filters each split by max_length (prm.too_long: drop).
        self.train_pairs, self.val_pairs = (
            fitting(x, p.max_len, p.too_long) for x in split_held_out(pairs, p.val_fraction, cfg.trainer.seed)
        )
        self.loss = PRM_LOSSES.get(p.loss)
        self.items = items = fitting(self.loss.items(self, eos), p.max_len, p.too_long)
        if not items:
            dropping = p.too_long == "drop" and p.max_len is not None and pairs
            why = f" within prm.max_len={p.max_len} (prm.too_long=drop leaves longer ones out)" if dropping else ""
            raise ValueError(f"prm.data {list(p.data)}: no {self.loss.what}{why}")
        if p.batch_size % self.world:
            raise ValueError(f"prm.batch_size={p.batch_size} must divide by {self.world} ranks")
        model = ValueHead(build_model(cfg.model, vocab_size=len(self.tokenizer)))
        if cfg.model.lora is not None:
            model = lora_critic(model, cfg.model.lora)
        self.engine = initialize(model, cfg.optim, cfg.optim.lr, p.batch_size, max_steps=cfg.trainer.max_steps)
        self.sampler = EpochSampler(len(items), cfg.trainer.seed, True)
        self.step_no = 0
        self.log: MetricsLog | None = None  # opened by the first step (open_run_records)
        self._resumed: int | None = None
        self.guard = NonFiniteGuard(
            cfg.trainer.max_nonfinite_steps, partial(divergence_advice, self.out / "checkpoints")
        )
        self.run_id = uuid.uuid4().hex  # this run's checkpoints carry it: pruning never touches another run's
        metric = cfg.trainer.best_metric  # pair_acc: ProRAG's load_best_model_at_end, metric accuracy
        self.best = BestSelection(BestValidation(metric), self.out, self.rank) if metric else None
        logger.info("PRM (%s) on %d %s; %d pairs held out", p.loss, len(items), self.loss.what, len(self.val_pairs))

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    def _scores(self, seqs: list[list[int]]) -> torch.Tensor:
        dev = next(unwrap(self.engine).parameters()).device
        return scores_of(self.engine, seqs, self.pad_id, self.cfg.prm.max_len, dev)  # [B]

    def train(self) -> Path:
        """Run to ``trainer.max_steps``; returns the saved PRM folder (``final/``)."""
        c = self.cfg.trainer
        with ProgressBar(c.max_steps, self.step_no, enabled=c.progress and self.rank == 0) as bar:
            while self.step_no < c.max_steps:
                bar.update(self.step_no + 1, self.step())
        final = self.out / "final"
        if self.best is not None and self.best.chosen:  # trainer.best_metric: the best val/pair_acc
            if self.log is not None:
                self.log.close()
            return self.best.finish(final)
        if self.rank == 0:
            metrics = {"prm/val_pair_acc": self.pair_accuracy(self.val_pairs)} if self.val_pairs else {}
            metrics["prm/train_pair_acc_all"] = self.pair_accuracy(self.train_pairs)
            if self.log is not None:
                self.log.write(self.step_no, metrics)
                self.log.close()
            save_prm(self.engine, self.tokenizer, final, self.cfg, metrics)
        return final

    def step(self) -> dict[str, float]:
        """One optimizer step over ``prm.batch_size`` pairs (or step records), micro-batched; skipped
        when its loss or gradient is not finite (:mod:`training.divergence`)."""
        if self.rank == 0 and self.log is None:
            self.log = open_run_records(self.out, self.cfg, self._resumed)
        t0, p = time.perf_counter(), self.cfg.prm
        idx = self.sampler.next(p.batch_size)
        per = p.batch_size // self.world
        idx = idx[self.rank * per : (self.rank + 1) * per]
        mb = self.cfg.optim.micro_batch_size
        gas = self.engine.gradient_accumulation_steps()
        slices = [idx[i : i + mb] for i in range(0, len(idx), mb)]
        if len(slices) != gas:
            raise RuntimeError(f"{len(slices)} micro-batches but DeepSpeed accumulates {gas}")
        loss_sum, correct, grad_norm = 0.0, None, None
        for part in slices:
            loss, hits = self.loss.batch(self, [self.items[i] for i in part])
            loss = loss * len(part) / len(idx)
            correct = None if hits is None else (correct or 0.0) + hits
            loss_sum += float(loss.detach())
            self.engine.backward(poisoned(loss * gas))  # DeepSpeed divides each backward by gas
            gn = optimizer_step(self.engine)
            grad_norm = gn if gn is not None else grad_norm
        self.step_no += 1
        metrics = {
            "loss": loss_sum,
            "time/step_s": time.perf_counter() - t0,
            "epoch": float(self.sampler.epoch),
            **self.guard.record(self.step_no, int(not update_applied(self.engine))),
        }
        if correct is not None:
            metrics["prm/train_pair_acc"] = correct / len(idx)
        if grad_norm is not None:
            metrics["grad_norm"] = grad_norm
        c = self.cfg.trainer
        validate = bool(self.val_pairs) and c.eval_every and self.step_no % c.eval_every == 0
        if validate:
            # every rank scores the held-out pairs (ZeRO-3's forward is collective); val/pair_acc is
            # what trainer.best_metric reads back on a resume
            metrics["prm/val_pair_acc"] = metrics["val/pair_acc"] = self.pair_accuracy(self.val_pairs)
        if self.log is not None:
            self.log.write(self.step_no, metrics)
        if validate and self.best is not None:
            acc = metrics["val/pair_acc"]
            self.best.keep_if_best({"pair_acc": acc}, self.step_no, lambda d: self._export(d, acc), self.log)
        self.guard.stop_if_diverged()
        if c.save_every and self.step_no % c.save_every == 0 and self.guard.may_checkpoint():
            self.save()
        return metrics

    def save(self) -> Path:
        """A checkpoint of this step; keeps this run's newest ``trainer.keep_checkpoints`` (as RL)."""
        path = save_position(self, self.engine, "prm")
        if self.best is not None:
            self.best.prune()  # a resume starts here or later: earlier bests are beaten
        return path

    def _export(self, folder: Path, val_pair_acc: float) -> None:
        """This step's PRM into ``folder`` (rank 0 writes; ZeRO-2 keeps every weight on each rank)."""
        if self.rank == 0:
            save_prm(self.engine, self.tokenizer, folder, self.cfg, {"prm/val_pair_acc": val_pair_acc})

    @torch.no_grad()
    def pair_accuracy(self, pairs: list[PairExample]) -> float:
        """The share of pairs whose chosen step scores higher than its rejected one."""
        if not pairs:
            return float("nan")
        mb, hits = max(1, self.cfg.optim.micro_batch_size), 0
        for i in range(0, len(pairs), mb):
            part = pairs[i : i + mb]
            s = self._scores([x.chosen for x in part] + [x.rejected for x in part])
            hits += int((s[: len(part)] > s[len(part) :]).sum())
        return hits / len(pairs)

    def resume(self, run_dir: Path) -> None:
        """Continue from the newest intact checkpoint; the log drops the steps that run again."""
        _, state = resume_checkpoint(run_dir, self.engine)
        restore_position(self, state)
        if self.best is not None:
            self.best.restore(self.step_no)

    def close(self) -> None:
        """Nothing runs in the background of this trainer: nothing to stop."""
