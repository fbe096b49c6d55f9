"""Typed configuration of HARR-style retriever RL: the ``retriever_rl`` section of a training
recipe with ``algo.kind: retriever`` (its questions come from the recipe's ``data`` section).

The generator is frozen (any harness backend); the policy is the dense retriever's query tower.
See :mod:`training.retriever.retriever_rl` for what each part does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness.config import require_at_least, require_between, require_positive, require_registered
from harness.eval_config import BackendConfig
from harness.retrieval.state import DEFAULT_STATE_TEMPLATE

# Names that are registries' keys, checked when a recipe loads (``require_registered`` imports the
# registry's module then): the registry is the one list of what each key accepts.
REGISTERED = {
    "schedule": "training.engine:LR_SCHEDULES",
    "reward": "benchmarks.metrics:METRICS",
    "loss_agg": "training.losses:AGGREGATIONS",
}


@dataclass(frozen=True)
class EncoderConfig:
    """The trainable query tower: any HF embedding model (None: the shipped all-MiniLM-L6-v2)."""

    name: str | None = None
    lora_r: int = 0  # > 0: train LoRA adapters (peft) instead of all weights
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=list)  # empty: BERT's query/key/value
    max_length: int = 256

    def __post_init__(self) -> None:
        require_at_least(self, 0, "lora_r")
        require_at_least(self, 1, "lora_alpha", "max_length")
        require_between(self, 0, 1, "lora_dropout")


@dataclass(frozen=True)
class SamplingConfig:
    """Stochastic retrieval and the history-aware state (see harness.retrieval.stochastic)."""

    n_candidates: int = 50
    tau: float = 0.05
    topk: int = 3
    stateful: bool = True
    template: str = DEFAULT_STATE_TEMPLATE
    max_history: int = 4
    max_titles: int = 5
    max_chars: int = 1024

    def __post_init__(self) -> None:
        require_at_least(self, 1, "n_candidates", "topk", "max_chars")
        require_at_least(self, 0, "max_history", "max_titles")
        require_positive(self, "tau")


@dataclass(frozen=True)
class RetrieverRLConfig:
    """The policy-gradient update of the query tower (see :mod:`training.retriever.retriever_rl`).

    ``algo: grpo``: one action per trajectory (the sum of its retrievals' log-probs), advantages
    normalised within each question's group of G samples. ``algo: ppo``: one action per retrieval
    call, a value head on the query embedding as the baseline, GAE(``gamma``, ``lam``) over the
    trajectory's retrieval calls (the answer's reward on the last one), advantages whitened over
    the batch, PPO's clipped value loss (``vf_coef``, ``vf_clip``); as HARR's PPO trainer does,
    with its separate critic model replaced by the head.
    """

    algo: Literal["grpo", "ppo"] = "grpo"
    group_size: int = 8  # G retrieval samples per question
    questions_per_step: int = 8
    steps: int = 20
    epochs: int = 1  # optimiser passes over each rollout batch (>1 makes the clipping matter)
    lr: float = 1e-5
    # The LR schedule (a training.engine.LR_SCHEDULES name, no warmup), set once per step over
    # ``schedule_steps`` (null: the run's ``steps``): HARR's GRPO scripts pass --lr_scheduler_type
    # constant; its PPO script leaves TrainingArguments' linear, stepped once per batch over
    # num_total_batches = ceil(total_episodes / batch) = 313 (trl_hacked/trainer/ppo_trainer.py:244,263,930).
    schedule: str = "constant"
    schedule_steps: int | None = None
    weight_decay: float = 0.0
    clip_eps: float = 0.2
    kl_coef: float = 0.01
    # ppo: fold −kl_coef·k1 of each call (rollout-time log-prob against the initial tower) into that
    # call's reward before GAE, as HARR's PPO trainer (TRL 0.18.1 PPOTrainer, kl_estimator k1);
    # false: a k3 KL loss term, as the GRPO path always has it.
    kl_in_reward: bool = False
    # The answer's metric (a benchmarks.metrics.METRICS name): HARR's f1_reward is SQuAD's F1
    # (f1_squad, no yes/no rule).
    reward: str = "f1_squad"
    norm_by_std: bool = True
    # A rollout that searched nothing is trained on a pseudo-call: the question, its greedy top-k
    # (HARR's generator.py: ``if not source_node`` retrieves the question itself).
    pseudo_call: bool = True
    adv_eps: float = 1e-4  # GRPO: (R − mean) / (std + adv_eps), HARR's trl_hacked/trainer/grpo_trainer.py:1163
    # How the per-call policy loss is averaged (a training.losses.AGGREGATIONS name): token_mean
    # is TRL 0.18.1's default ``bnpo`` (the sum over every call of the batch / the number of
    # calls), what HARR's GRPO scripts run; seq_mean_token_mean is its ``grpo`` (per trajectory).
    loss_agg: str = "token_mean"
    grad_clip: float | None = 1.0  # None: no clipping (TRL's PPOTrainer clips nothing)
    seed: int = 0
    # ppo only
    gamma: float = 1.0
    lam: float = 1.0
    whiten_advantages: bool = True
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    value_lr: float = 1e-3  # the value head's learning rate (it starts from scratch)
    value_hidden: int = 256
    # Sync: rollouts always sample in-process (the tower being trained is the retriever's, so there
    # is nothing to copy). ``sync_url``: also push the encoder every ``sync_every`` steps to a served
    # retriever (``harness serve retriever`` on loopback, POST /admin/reload_encoder), e.g. the one
    # an evaluation or a generator-side agent queries.
    sync_url: str | None = None
    sync_every: int = 1
    sync_timeout: float = 300.0

    def __post_init__(self) -> None:
        require_registered(self, **REGISTERED)
        require_at_least(self, 1, "group_size", "questions_per_step", "steps", "epochs", "sync_every", "value_hidden")
        require_at_least(self, 0, "lr", "weight_decay", "clip_eps", "kl_coef", "grad_clip", "vf_coef", "vf_clip")
        require_at_least(self, 0, "value_lr")
        require_between(self, 0, 1, "gamma", "lam")
        require_positive(self, "sync_timeout")


@dataclass(frozen=True)
class RetrieverTrainConfig:
    """The ``retriever_rl`` section: everything a retriever-RL run needs besides its questions.

    ``index`` is a built dense index (its document vectors stay fixed); without it one is built
    (and cached) over ``corpus`` or the dataset's own corpus with ``doc_encoder`` (default: the
    encoder's model). ``method`` is an agent dialect (``search_r1``, ``research``, ...) or a
    FlashRAG baseline (``standard``, ``iter_retgen``, ``ircot``, ...).
    """

    method: str = "search_r1"
    index: str | None = None
    corpus: str | None = None
    doc_encoder: str | None = None
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rl: RetrieverRLConfig = field(default_factory=RetrieverRLConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)  # the frozen generator
    agent: dict[str, Any] = field(default_factory=dict)  # pipelines.search_agent.AgentConfig options
    baseline: dict[str, Any] = field(default_factory=dict)  # FlashRAG baseline options
