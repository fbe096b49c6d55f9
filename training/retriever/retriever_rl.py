"""HARR-style RL on the retriever: GRPO (or PPO) on the query tower, the generator frozen.

One step:

1. **Rollouts.** ``questions_per_step`` questions, each run ``group_size`` (G) times through the
   pipeline (THE search agent for agent dialects, FlashRAG's pipelines for baselines) with the
   :class:`~harness.retrieval.stochastic.StochasticDenseRetriever` sampling its documents. The
   generator is any harness backend and is never updated. Every retrieval call leaves a sampling
   record (state text, candidate ids, sampled positions, rollout-time log-prob).
2. **Reward and advantages.** The answer's F1 or EM (``benchmarks.metrics``); GRPO advantages per
   question group (``training.advantages.grpo``).
3. **Loss.** As HARR's ``_compute_loss``: each retrieval call's log-prob, recomputed from its
   record under the current tower, against the rollout-time one: PPO-clip per call (one "token"
   per call, ``training.losses.policy_loss``) plus β·k3 per call to the initial tower, summed over
   every call of the batch and divided by the number of calls (``rl.loss_agg: token_mean``, TRL
   0.18.1's default ``bnpo``, which HARR's scripts leave on). Trajectories without a retrieval
   carry no gradient.

``rl.algo: ppo`` instead treats each retrieval call as an action: a value head
(:class:`~training.engine.ValueHead` without a body, on detached features) on the
query embedding of the state gives V(s_t), the reward sits on the last call, GAE over the calls,
whitened advantages, PPO-clip per call plus the clipped value loss (HARR's PPO trainer does the
same with a separate critic model). ``rl.kl_in_reward`` folds −β·k1 of each call into its reward
before GAE, as HARR's PPO trainer does; otherwise the KL is a k3 loss term, as in the GRPO path.

The trained tower saves as a plain HF model dir (:meth:`QueryTower.save`, LoRA merged) that a
dense :class:`~harness.retrieval.encoders.Encoder` loads as the query encoder of the same index.
:func:`filter_examples` is HARR's data filter: keep questions where some sampled retrievals
succeed and some fail under the frozen generator. :class:`RetrieverTrainer` is ``algo.kind:
retriever`` in ``training.build.TRAINERS``. Evaluation is the eval path (``simple_evaluate``)
with the retriever set to ``greedy`` (top-k), as ``harness eval --retriever harr`` runs it; so is
the trainer's validation (``data.val_split``, ``trainer.eval_every``, ``trainer.best_metric``).
The rewards and losses (steps 2 and 3, and PPO's) are :mod:`training.retriever.retriever_loss`; the names
this module used to hold are importable from here too.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import torch

from benchmarks.datasets import corpus_path
from harness import safe_delete
from harness.backends import build_backend
from harness.backends.base import Backend
from harness.config import from_dict, to_dict
from harness.fsutil import atomic_dir
from harness.retrieval.factory import ensure_index
from harness.retrieval.index import load_index
from harness.retrieval.state import RetrievalState, state_for
from harness.retrieval.stochastic import QueryTower, StateFormat, StochasticDenseRetriever
from harness.types import Example, SearchRecord, Trajectory
from pipelines.baselines.flashrag_methods import BaselineConfig, FlashRAGBaseline
from pipelines.method import Method
from pipelines.methods import build_method, method_kind, validate_options
from training.advantages import grpo
from training.best_val import BestSelection, BestValidation
from training.checkpoint import write_safetensors
from training.config import TrainConfig, TrainerConfig
from training.divergence import NonFiniteGuard, check_finite, is_finite
from training.engine import ValueHead, lr_factor
from training.examples import first_dataset, train_examples
from training.logging_utils import MetricsLog, open_run_records
from training.retriever.retriever_loss import (
    answer_recall,
    ppo_advantages,
    ppo_loss,
    retrieval_loss,
    reward_of,
    step_layout,
)
from training.retriever.retriever_loss import per_call_loss as per_call_loss
from training.retriever_config import RetrieverRLConfig
from training.validation import build_validation

logger = logging.getLogger(__name__)


# ---- rollouts ----------------------------------------------------------------------------------
class Runner(Protocol):
    """Where retriever RL's rollouts come from: ``run(examples, n)`` → n trajectories per example,
    example-major (:class:`AgentRunner`, :class:`BaselineRunner`)."""

    def run(self, examples: Sequence[Example], n: int) -> list[Trajectory]: ...


class AgentRunner:
    """Rollouts through THE search agent: ``run(examples, n)`` → n trajectories per example, in order."""

    def __init__(self, agent: Method) -> None:
        self.agent = agent

    def run(self, examples: Sequence[Example], n: int) -> list[Trajectory]:
        return self.agent.run_examples(list(examples), n_samples=n)


class _RecordingRetriever:
    """Gives a FlashRAG baseline the stochastic retriever with history-aware state, and keeps every
    call's record for the item being run (baselines run one item at a time here)."""

    def __init__(self, inner: StochasticDenseRetriever) -> None:
        self.inner, self.index_id = inner, inner.index_id
        self.question, self.key = "", ""
        self.log: list[SearchRecord] = []

    def search(self, queries: list[str], k: int) -> list:
        state = [RetrievalState(self.question, _history(self.log), self.key)] * len(queries)
        res = self.inner.search(list(queries), k, state=state)
        for q, docs, sample in zip(queries, res, res.samples, strict=True):
            self.log.append(
                SearchRecord(len(self.log), q, [d.id for d in docs], [d.score for d in docs], 0.0, docs, sample=sample)
            )
        return res


def _history(log: list[SearchRecord]) -> tuple:
    return state_for("", log).history


class BaselineRunner:
    """Rollouts through a FlashRAG baseline; the searches on each trajectory are the recorded calls."""

    def __init__(
        self, name: str, backend: Backend, retriever: StochasticDenseRetriever, options: dict[str, Any]
    ) -> None:
        self.recorder = _RecordingRetriever(retriever)
        opts = from_dict(BaselineConfig, {**options, "max_concurrency": 1}, where="baseline")
        self.baseline = FlashRAGBaseline(name, backend, self.recorder, opts)  # type: ignore[arg-type]

    def run(self, examples: Sequence[Example], n: int) -> list[Trajectory]:
        out: list[Trajectory] = []
        for j in range(n):
            for ex in examples:  # one at a time: every logged call then belongs to this item
                self.recorder.question, self.recorder.key, self.recorder.log = ex.question, f"{ex.id}#{j}", []
                traj = self.baseline.run_examples([ex])[0]
                traj.searches, traj.sample_index = list(self.recorder.log), j
                out.append(traj)
        # Same order as the agent: example-major, sample-minor.
        return [out[j * len(examples) + i] for i in range(len(examples)) for j in range(n)]


# ---- the trainer -------------------------------------------------------------------------------
@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]


class RetrieverRL:
    """GRPO on the query tower of ``retriever`` from ``runner`` rollouts; see the module docstring."""

    def __init__(
        self,
        retriever: StochasticDenseRetriever,
        runner: Runner,
        cfg: RetrieverRLConfig,
        out: Path,
        max_nonfinite_steps: int = TrainerConfig.max_nonfinite_steps,
        topk: int = 3,
    ) -> None:
        self.retriever, self.runner, self.cfg, self.out = retriever, runner, cfg, Path(out)
        self.topk = topk  # documents a call retrieves (retriever_rl.sampling.topk): the pseudo-call's too
        self.guard = NonFiniteGuard(max_nonfinite_steps)  # see training.divergence
        self.tower = retriever.tower
        self.tower.freeze_reference()  # the KL anchor: the weights before any update
        params = [p for p in self.tower.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": params, "lr": cfg.lr}]
        self.value_head: ValueHead | None = None
        if cfg.algo == "ppo":
            with torch.random.fork_rng():  # the head's initial weights from cfg.seed, global RNG untouched
                torch.manual_seed(cfg.seed)
                self.value_head = ValueHead(dim=self.tower.dim, hidden=cfg.value_hidden)
            groups.append({"params": list(self.value_head.parameters()), "lr": cfg.value_lr})
        self.opt = torch.optim.AdamW(groups, lr=cfg.lr, weight_decay=cfg.weight_decay)
        for group in self.opt.param_groups:
            group["initial_lr"] = group["lr"]  # the schedule's base (rl.schedule)
        self._params = params
        self.rng = random.Random(cfg.seed)
        self.step_no = 0
        self._synced: Path | None = None
        self._order: list[Example] = []  # questions left of the current shuffled pass

    def step(self, examples: Sequence[Example]) -> StepResult:
        """One rollout batch (G samples per question) and ``epochs`` optimiser passes over it."""
        c = self.cfg
        t0 = time.perf_counter()
        self.retriever.greedy = False
        self.retriever.salt = self.step_no  # fresh samples each step, reproducible whatever the concurrency
        trajs = self.runner.run(examples, c.group_size)  # [len(examples) * G], example-major
        if c.pseudo_call:
            self._add_pseudo_calls(trajs)
        rewards = torch.tensor([reward_of(t, c.reward) for t in trajs])  # [B]
        rollout_s = time.perf_counter() - t0
        loss_fn = (
            self._ppo_loss_fn(trajs, rewards) if self.value_head is not None else self._grpo_loss_fn(trajs, rewards)
        )
        stats: dict[str, float] = {}
        skipped = 0
        # rl.schedule: this step's LR, on every group (the value head's too, as HF's scheduler does)
        factor = lr_factor(c.schedule, self.step_no, 0, c.schedule_steps or c.steps)
        for group in self.opt.param_groups:
            group["lr"] = group["initial_lr"] * factor
        for _ in range(c.epochs):
            self.opt.zero_grad(set_to_none=True)
            loss, stats = loss_fn()
            if not loss.requires_grad:  # no retrieval call in the batch: nothing to learn from
                gnorm = torch.zeros(())
                continue
            loss.backward()
            clip = float("inf") if c.grad_clip is None else c.grad_clip  # inf: measure the norm, clip nothing
            gnorm = torch.nn.utils.clip_grad_norm_(self._params, clip)
            vnorm = 0.0
            if self.value_head is not None:
                vnorm = torch.nn.utils.clip_grad_norm_(self.value_head.parameters(), clip)
            if not (is_finite(loss) and is_finite(gnorm) and is_finite(vnorm)):
                self.opt.zero_grad(set_to_none=True)  # a non-finite update never reaches the tower
                skipped += 1
                continue
            self.opt.step()
        # A finite update can still overflow the weights (a huge LR), and this loss does not always
        # turn NaN weights into a NaN loss (the sampled log-probs of NaN scores): check them here.
        check_finite({n: p for n, p in self.tower.named_parameters() if p.requires_grad}, f"step {self.step_no + 1}")
        self.step_no += 1
        if c.sync_url and self.step_no % c.sync_every == 0:
            self.sync_served()
        spread = rewards.view(len(examples), c.group_size)
        metrics = {
            "reward": float(rewards.mean()),
            "answer_recall": sum(answer_recall(t) for t in trajs) / len(trajs),
            "groups_with_signal": float(((spread.max(1).values - spread.min(1).values) > 0).float().mean()),
            "retrievals_per_traj": sum(len(t.searches) for t in trajs) / len(trajs),
            "loss": float(loss.detach()),
            "grad_norm": float(gnorm.detach()),
            "rollout_s": rollout_s,
            "step_s": time.perf_counter() - t0,
            "lr": self.opt.param_groups[0]["lr"],
            **{f"loss/{k}": v for k, v in stats.items()},
            **self.guard.record(self.step_no, skipped),
        }
        return StepResult(self.step_no, metrics)

    def _add_pseudo_calls(self, trajs: list[Trajectory]) -> None:
        """HARR's generator (generator.py, after its loop): a rollout that searched nothing still
        gets one call, the question itself in the empty-history state, its greedy top-k recorded
        (not sampled: ``_sample`` is not applied), so the rollout's reward trains the tower on it.
        Recorded as a search of turn -1 (the agent never saw its documents)."""
        need = [t for t in trajs if t.finish_reason != "error" and not any(s.sample for s in t.searches)]
        if not need:
            return
        greedy, self.retriever.greedy = self.retriever.greedy, True
        try:
            states = [state_for(t.question, [], f"{t.example_id}#{t.sample_index}", []) for t in need]
            res = self.retriever.search([t.question for t in need], self.topk, state=states)
        finally:
            self.retriever.greedy = greedy
        for t, docs, sample in zip(need, res, res.samples, strict=True):
            t.searches.append(SearchRecord.from_docs(-1, t.question, docs, 0.0, sample))

    def _grpo_loss_fn(self, trajs: list[Trajectory], rewards: torch.Tensor) -> Callable[[], tuple]:
        """GRPO: group-normalised advantages per question (example-major batches of G)."""
        groups = torch.arange(len(trajs) // self.cfg.group_size).repeat_interleave(self.cfg.group_size)  # [B]
        adv = grpo(rewards, groups, eps=self.cfg.adv_eps, norm_by_std=self.cfg.norm_by_std)  # [B]
        return lambda: retrieval_loss(self.retriever, trajs, adv, self.cfg)

    def _ppo_loss_fn(self, trajs: list[Trajectory], rewards: torch.Tensor) -> Callable[[], tuple]:
        """PPO: values of the rollout states (before the update) → GAE advantages and returns."""
        assert self.value_head is not None
        c, layout = self.cfg, step_layout(trajs)
        with torch.no_grad():
            _, q = self.retriever.recompute(layout.samples)  # [S, H]
            old_values = layout.grid(self.value_head(q))  # [B, T]
            call_rewards = None
            if c.kl_in_reward and c.kl_coef > 0:  # HARR: −β·k1 of the rollout-time log-prob per call
                ref = layout.grid(self.retriever.recompute(layout.samples, reference=True)[0])  # [B, T]
                call_rewards = -c.kl_coef * (layout.old_logp - ref)  # [B, T]
        adv, returns = ppo_advantages(
            rewards, old_values, layout.mask, c.gamma, c.lam, c.whiten_advantages, call_rewards
        )
        return lambda: ppo_loss(self.retriever, self.value_head, layout, adv, returns, old_values, c)

    def sync_served(self) -> dict[str, Any]:
        """Save the tower to ``out/sync/step-N`` and have the served retriever at ``cfg.sync_url``
        reload it (the previous sync dir is removed once the server has moved on)."""
        check_finite(self.tower.state_dict(), f"not syncing the encoder of step {self.step_no}")
        path = self.retriever.save_tower(self.out / "sync" / f"step-{self.step_no}")
        safe_delete.mark(path, "encoder", entries=[p.name for p in path.iterdir()])  # ours: removable later
        answer = reload_served_encoder(self.cfg.sync_url or "", str(path.resolve()), self.cfg.sync_timeout)
        if self._synced is not None and self._synced != path:
            safe_delete.remove(self._synced, kind="encoder", why="pruning the previous synced encoder")
        self._synced = path
        logger.info("served retriever %s now on encoder version %s", self.cfg.sync_url, answer.get("version"))
        return answer

    def train(self, examples: Sequence[Example], on_step: Callable[[StepResult], None] | None = None) -> Path:
        """``cfg.steps`` steps over shuffled ``examples``; writes metrics.jsonl and ``encoder/``."""
        if not examples:
            raise ValueError("no training questions")
        log = MetricsLog(self.out, tensorboard=False)
        for _ in range(self.cfg.steps):
            res = self.logged_step(examples, log)
            if on_step is not None:
                on_step(res)
        return self.finish()

    def logged_step(self, examples: Sequence[Example], log: MetricsLog) -> StepResult:
        """The next ``questions_per_step`` questions of shuffled passes over ``examples``, one
        :meth:`step` on them, its metrics written to ``log``; stops a diverged run."""
        if not examples:
            raise ValueError("no training questions")
        if len(self._order) < self.cfg.questions_per_step:
            more = list(examples)
            self.rng.shuffle(more)
            self._order.extend(more)
        n = self.cfg.questions_per_step
        batch, self._order = self._order[:n], self._order[n:]
        res = self.step(batch)
        log.write(res.step, res.metrics)
        logger.info("step %d: %s", res.step, {k: round(v, 4) for k, v in res.metrics.items()})
        self.guard.stop_if_diverged()
        return res

    def finish(self) -> Path:
        """Write the trained encoder (and the value head) into the run folder; returns ``encoder/``."""
        check_finite(self.tower.state_dict(), f"not writing the encoder {self.out / 'encoder'}")
        if self.value_head is not None:  # for resuming / inspection; evaluation needs only the encoder
            check_finite(self.value_head.state_dict(), "not writing the value head")
            write_safetensors(self.value_head.state_dict(), self.out / "value_head.safetensors")
        with atomic_dir(self.out / "encoder", kind="encoder") as tmp:  # marked: a run's cleanup proves it ours
            self.retriever.save_tower(tmp)
        return self.out / "encoder"


def reload_served_encoder(url: str, path: str, timeout: float = 300.0) -> dict[str, Any]:
    """``POST {url}/admin/reload_encoder {"path": path}`` (the server must be on this host: it
    accepts the call from loopback clients only). Raises ``RuntimeError`` naming the server's reason."""
    endpoint = url.rstrip("/") + "/admin/reload_encoder"
    try:
        r = httpx.post(endpoint, json={"path": path}, timeout=timeout)
    except httpx.HTTPError as e:
        raise RuntimeError(f"encoder sync: {endpoint} unreachable: {e}") from e
    if r.status_code != 200:
        raise RuntimeError(f"encoder sync: {endpoint} answered {r.status_code}: {r.text[:300]}")
    return r.json()


# ---- data filtering ----------------------------------------------------------------------------
def filter_examples(
    runner: Runner, examples: Sequence[Example], n: int, metric: str = "em", threshold: float = 1.0
) -> tuple[list[Example], list[dict[str, Any]]]:
    """HARR's filter: keep questions where some of ``n`` sampled retrievals succeed (reward ≥
    ``threshold``) and some fail. Returns (kept examples, one stats row per question)."""
    trajs = runner.run(list(examples), n)
    kept, rows = [], []
    for i, ex in enumerate(examples):
        group = trajs[i * n : (i + 1) * n]
        wins = sum(reward_of(t, metric) >= threshold for t in group)
        rows.append({"id": ex.id, "successes": wins, "samples": n, "kept": 0 < wins < n})
        if 0 < wins < n:
            kept.append(ex)
    return kept, rows


# ---- wiring from a config ----------------------------------------------------------------------
def rollout_options(cfg: TrainConfig) -> dict[str, Any]:
    """The options the frozen generator's pipeline is built with: ``retriever_rl.agent`` (or
    ``baseline``) over the sampled top-k (the recipe test resolves the effective agent from it)."""
    r = cfg.retriever_rl
    return {"topk": r.sampling.topk, **(r.agent if method_kind(r.method) == "agent" else r.baseline)}


def validated_run(cfg: TrainConfig) -> dict[str, Any]:
    """What a retriever-RL validation evaluates, as an eval config's blocks: the frozen generator's
    agent at temperature 0 (``rollout_options``) searching with the tower greedily, as
    ``harness eval --retriever harr --encoder RUN/encoder`` searches (the trainer hands its own
    retriever over; the ``retriever`` block records what it is). An agent method only: a FlashRAG
    baseline generator is not validated (not implemented)."""
    r = cfg.retriever_rl
    if method_kind(r.method) != "agent":
        raise ValueError(
            f"data.val_split with retriever_rl.method={r.method!r}: validating a baseline generator's "
            "retriever is not implemented (an agent method only)"
        )
    corpus = None if r.index else str(_corpus(cfg))
    return {
        "method": r.method,
        "retriever": {"kind": "harr", "topk": r.sampling.topk, "index": r.index, "corpus": corpus},
        "backend": {"kind": r.backend.kind, "model": r.backend.model},
        "agent": {**rollout_options(cfg), "temperature": 0.0},
    }


def build_from_config(cfg: TrainConfig, backend: Backend | None = None) -> tuple[StochasticDenseRetriever, Runner]:
    """The stochastic retriever (tower + fixed index) and the rollout runner of an
    ``algo.kind: retriever`` recipe (its ``retriever_rl`` section; the corpus of ``data``)."""
    r = cfg.retriever_rl
    agent = method_kind(r.method) == "agent"
    options = rollout_options(cfg)
    # before anything slow is built: errors name the recipe key
    validate_options(r.method, options, where=f"retriever_rl.{'agent' if agent else 'baseline'}")
    retriever = build_retriever(cfg)
    backend = backend or build_backend(r.backend)
    if agent:
        return retriever, AgentRunner(build_method(r.method, backend, retriever, options))
    return retriever, BaselineRunner(r.method, backend, retriever, options)


def build_retriever(cfg: TrainConfig) -> StochasticDenseRetriever:
    """The recipe's stochastic retriever before any step: its query tower as loaded (untrained)
    over the fixed document index, sampling and rendering the state as ``retriever_rl.sampling`` says."""
    r = cfg.retriever_rl
    e, s = r.encoder, r.sampling
    tower = QueryTower(
        e.name,
        lora_r=e.lora_r,
        lora_alpha=e.lora_alpha,
        lora_dropout=e.lora_dropout,
        lora_targets=list(e.lora_targets) or None,
        max_length=e.max_length,
    )
    if r.index:
        index = load_index(r.index, encoder=tower)
    else:  # built once with the document encoder, in the cache eval's retrievers use
        index = ensure_index(str(_corpus(cfg)), "dense", r.doc_encoder or e.name, encoder=tower)
    fmt = StateFormat(
        stateful=s.stateful,
        template=s.template,
        max_history=s.max_history,
        max_titles=s.max_titles,
        max_chars=s.max_chars,
    )
    return StochasticDenseRetriever(index, tower, s.n_candidates, s.tau, state_format=fmt, seed=r.rl.seed)


START_RECORD = "start.json"  # in a start encoder's folder: what it was built from (start_record)


def start_record(cfg: TrainConfig) -> dict[str, Any]:
    """What decides a recipe's untrained tower and how it searches: the encoder, the sampling and
    state format, and the document side (index, corpus, document encoder, the data it is read from)."""
    r = cfg.retriever_rl
    record = {
        "encoder": to_dict(r.encoder),
        "sampling": to_dict(r.sampling),
        "index": r.index,
        "corpus": r.corpus,
        "doc_encoder": r.doc_encoder,
        "data": {"dataset": cfg.data.dataset, "split": cfg.data.split, "data_dir": cfg.data.data_dir},
    }
    return json.loads(json.dumps(record, default=str))  # as it reads back from START_RECORD (lists, not tuples)


def save_start_encoder(cfg: TrainConfig, out: str | Path) -> bool:
    """Write the recipe's query tower as it is before training into ``out`` (marked as harness's,
    with the sidecar of its state format and tau, as a trained ``encoder/``, and
    :data:`START_RECORD`): ``--retriever harr --encoder OUT`` then searches exactly as the
    training's step 0 does (greedily), so a trained tower can be paired against its own start.
    Nothing is written when ``out`` already holds this recipe's start; returns whether it was
    written now (a replaced start makes what was evaluated with it stale). No generator is loaded."""
    out = Path(out)
    record = start_record(cfg)
    if (out / START_RECORD).is_file() and json.loads((out / START_RECORD).read_text(encoding="utf-8")) == record:
        return False
    retriever = build_retriever(cfg)
    with atomic_dir(out, kind="encoder") as tmp:  # replaces only an encoder harness wrote
        retriever.save_tower(tmp)
        (tmp / START_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return True


def _corpus(cfg: TrainConfig) -> Path:
    d = cfg.data
    corpus = cfg.retriever_rl.corpus or corpus_path(first_dataset(cfg), d.split, data_dir=d.data_dir)
    if corpus is None:
        raise ValueError(
            f"no corpus for {first_dataset(cfg)}/{d.split}: set retriever_rl.index=DIR or retriever_rl.corpus=FILE"
        )
    return Path(corpus)


class RetrieverTrainer:
    """``algo.kind: retriever``: GRPO (or PPO) on the query tower, generator frozen; the trained
    encoder lands in ``RUN/encoder`` (what :meth:`train` returns).

    With ``data.val_split`` and ``trainer.eval_every``, the tower is validated through the eval
    path every N steps (and at step 0 with ``trainer.val_before_train``): the frozen generator,
    greedy, searching with the tower greedily on the split's first ``data.val_limit`` questions,
    into ``RUN/validation/step-N/``, logged as ``val/<metric>``. ``trainer.best_metric`` then makes
    ``encoder/`` the validated step's tower that scored highest (the earliest on a tie, so the
    untrained tower at step 0 if nothing beat it), as the RL trainer's ``final/``."""

    def __init__(self, cfg: TrainConfig, out: Path, backend: Backend | None = None) -> None:
        self.cfg, self.out = cfg, Path(out)
        # Built here, before the run folder is claimed: a recipe that fails to build leaves none.
        r = cfg.retriever_rl
        backend = backend or build_backend(r.backend)  # the frozen generator: rollouts and validation
        self.retriever, self.runner = build_from_config(cfg, backend)
        self.examples = train_examples(cfg)
        t = cfg.trainer
        self.rl = RetrieverRL(self.retriever, self.runner, r.rl, self.out, t.max_nonfinite_steps, r.sampling.topk)
        validating = bool(t.eval_every and cfg.data.val_split)
        self.validate = (
            build_validation(cfg, backend, self.out, validated_run(cfg), self.retriever) if validating else None
        )
        metric = t.best_metric
        self.best = BestSelection(BestValidation(metric, kind="encoder"), self.out) if metric else None
        self._log: MetricsLog | None = None  # config.json and metrics.jsonl, opened by the first step

    @property
    def step_no(self) -> int:
        return self.rl.step_no

    def resume(self, run_dir: Path) -> None:
        raise ValueError("algo.kind: retriever does not resume from checkpoints (not implemented); start a new run")

    def save(self) -> Path:
        raise NotImplementedError(
            "algo.kind: retriever writes no resumable checkpoint (not implemented): its output is encoder/ at the end"
        )

    def _start(self) -> None:
        """The run's records, once: ``config.json`` and the metrics log (as every trainer's:
        ``metrics.jsonl``, with TensorBoard and W&B as ``trainer`` says)."""
        if self._log is None:
            self._log = open_run_records(self.out, self.cfg)

    def step(self) -> dict[str, float]:
        """One step of :class:`RetrieverRL` on the next questions (then a validation when one is
        due); its metrics."""
        self._start()
        metrics = self.rl.logged_step(self.examples, self._log).metrics
        if self.validate is not None and self.step_no % self.cfg.trainer.eval_every == 0:
            self.run_validation()
        return metrics

    def run_validation(self) -> dict[str, Any]:
        """Validate the tower as it is now (greedy search; the next step samples again), log its
        metrics as ``val/<metric>``, and keep it when ``trainer.best_metric`` says it is the best."""
        assert self.validate is not None and self._log is not None
        greedy, self.retriever.greedy = self.retriever.greedy, True
        try:
            val = self.validate(self.step_no).metrics
        finally:
            self.retriever.greedy = greedy
        self._log.write(self.step_no, {f"val/{k}": float(v) for k, v in val.items() if isinstance(v, int | float)})
        if self.best is not None:
            self.best.keep_if_best(val, self.step_no, self._export, self._log)
        return val

    def _export(self, folder: Path) -> Path:
        """The tower as it is now into ``folder`` (an encoder folder, marked as harness's)."""
        check_finite(self.retriever.tower.state_dict(), f"not writing the encoder {folder}")
        with atomic_dir(folder, kind="encoder") as tmp:
            self.retriever.save_tower(tmp)
        return folder

    def train(self) -> Path:
        """Run ``retriever_rl.rl.steps`` steps; returns the trained encoder's folder: the last
        step's, or with ``trainer.best_metric`` the best validated step's."""
        if not self.examples:
            raise ValueError("no training questions")
        self._start()
        t = self.cfg.trainer
        try:
            if self.validate is not None and t.val_before_train and self.step_no == 0:
                self.run_validation()  # step 0: the untrained tower
            while self.step_no < self.cfg.retriever_rl.rl.steps:
                self.step()
        finally:
            self.close()
        encoder = self.rl.finish()
        if self.best is not None and self.best.chosen:
            return self.best.finish(encoder)  # encoder/ replaced by the best validated tower
        return encoder

    def close(self) -> None:
        """Close the run's metrics log (its dashboards; ``metrics.jsonl`` is flushed per record)."""
        if self._log is not None:
            self._log.close()
            self._log = None


def harr_filter(
    cfg: TrainConfig, out: str | Path, samples: int = 8, metric: str = "em", threshold: float = 1.0
) -> tuple[Path, Path, int, int]:
    """``harness data harr-filter``: run :func:`filter_examples` over the recipe's training
    questions and write the kept ones to ``out`` (FlashRAG JSONL, a ``data.file`` for training)
    and one count row per question to ``out``'s ``.stats.jsonl``. Returns (out, stats, kept, of)."""
    if cfg.algo.kind != "retriever":
        raise ValueError(
            f"harr-filter reads a retriever-RL recipe (algo.kind: retriever), not algo.kind {cfg.algo.kind}"
        )
    if metric not in ("em", "f1"):
        raise ValueError(f"--metric must be em or f1, got {metric!r}")
    _, runner = build_from_config(cfg)
    examples = train_examples(cfg)
    kept, rows = filter_examples(runner, examples, samples, metric, threshold)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for ex in kept:
            f.write(json.dumps(ex.to_dict(), ensure_ascii=False) + "\n")
    stats = path.with_suffix(".stats.jsonl")
    stats.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path, stats, len(kept), len(examples)
