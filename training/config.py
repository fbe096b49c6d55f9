"""Typed training configuration (``harness train -c configs/train/NAME.yaml key=value ...``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness.eval_config import BackendConfig, RetrieverConfig


@dataclass(frozen=True)
class ModelConfig:
    path: str = "smollm2-135m-instruct"  # name, local dir or hub id
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Build a tiny random Llama offline instead of loading weights (tests): e.g. {hidden_size: 64}.
    tiny: dict[str, Any] | None = None
    gradient_checkpointing: bool = False


@dataclass(frozen=True)
class DataConfig:
    dataset: str = "hotpotqa"
    split: str = "train100"
    data_dir: str | None = None
    limit: int | None = None
    shuffle: bool = True
    val_split: str | None = None  # periodic validation through the eval path
    val_limit: int | None = 16


@dataclass(frozen=True)
class RolloutConfig:
    method: str = "r1_searcher"  # the agent dialect
    n_samples: int = 4  # rollouts per prompt (one GRPO group)
    prompts_per_step: int = 2
    temperature: float = 1.0
    top_p: float = 1.0
    # The backend rollouts come from, configured as ``harness eval``'s (``kind``, ``url``,
    # ``launch``, ``engine``, ``max_batch_size``, ...). It always serves the policy: its model and
    # dtype are ``model.path`` and ``model.dtype``. ``launch: true`` starts SGLang for the run.
    backend: BackendConfig = field(default_factory=lambda: BackendConfig(max_batch_size=16))
    agent: dict[str, Any] = field(default_factory=dict)  # AgentConfig overrides


@dataclass(frozen=True)
class AlgoConfig:
    kind: Literal["rl", "sft"] = "rl"  # sft: supervised fine-tuning on ``sft.sources`` (training.sft)
    advantage: Literal["grpo", "reinforce_pp", "gae", "dual_granularity"] = "grpo"
    reward: Any = "r1_searcher_stage1"  # a name, {name: ..., params}, or a list to compose
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "dapo", "dr_grpo"] = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    kl_in_reward: bool = False  # PPO style: fold k1 KL into the token rewards instead of the loss
    entropy_coef: float = 0.0
    update_epochs: int = 1
    gamma: float = 1.0
    lam: float = 1.0
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    dual_beta: float = 0.3
    step_scorer: str = "rule"  # dual_granularity: a training.rewards.STEP_SCORERS name
    norm_by_std: bool = True
    max_len: int | None = None  # truncate collated sequences (Dr. GRPO's constant denominator too)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    critic_lr: float = 1e-5
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_size: int = 4
    zero_stage: int = 0
    bf16: bool = False
    threads: int | None = None  # torch.set_num_threads (one is often fastest on 2-core machines)


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 10
    save_every: int = 5  # checkpoint every N steps (0: only the final one)
    eval_every: int = 0  # validation through the eval path every N steps (0: never)
    seed: int = 0
    out: str = "runs/train"
    keep_checkpoints: int = 2  # newest complete checkpoints kept on disk (0: keep all)
    tensorboard: bool = True
    wandb_project: str | None = None
    save_rollouts: bool = True  # every rollout trajectory with its reward → rollouts.jsonl
    progress: bool = True  # a rich progress bar


@dataclass(frozen=True)
class SFTConfig:
    """``algo.kind: sft``: where the trajectories come from (see :mod:`training.sft`).

    Each source is ``{kind: run | chat | synth, path: ..., where: "em >= 1", limit: N}``.
    """

    sources: list[dict[str, Any]] = field(default_factory=list)
    batch_size: int = 8  # trajectories per optimizer step
    shuffle: bool = True


@dataclass(frozen=True)
class TrainConfig:
    name: str = "train"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    retriever: RetrieverConfig = field(default_factory=RetrieverConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    papers: str = ""  # which published settings the recipe follows
