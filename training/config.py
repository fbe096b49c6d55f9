"""Typed training configuration (``harness train -c configs/train/NAME.yaml key=value ...``).

The ``algo`` section lives in :mod:`training.algo_config` and the ``retriever_rl`` section in
:mod:`training.retriever_config`; :class:`AlgoConfig` and :class:`RolloutCorrectionConfig` are
importable from here too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from harness.config import require_at_least, require_between, require_registered
from harness.eval_config import BackendConfig, RetrieverConfig, check_run_name
from training.algo_config import AlgoConfig
from training.algo_config import RolloutCorrectionConfig as RolloutCorrectionConfig
from training.retriever_config import RetrieverTrainConfig

# Names that are registries' keys, checked when a recipe loads (see training.algo_config).
LR_SCHEDULE_NAMES = "training.engine:LR_SCHEDULES"
PRM_LOSS_NAMES = "training.prm.prm_loss:PRM_LOSSES"

_STOP_RULE = re.compile(r"^\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_stop_on(rules: dict[str, str | float]) -> dict[str, tuple[str, float]]:
    """``trainer.stop_on`` read: ``{"health/empty_retrieval": "> 0.5"}`` → ``{metric: (op, threshold)}``;
    a bare number means ``>``. Raises ``ValueError`` naming the rule that does not read."""
    if not isinstance(rules, dict):
        raise ValueError(f"trainer.stop_on must map a step metric to a rule such as '> 0.5', not {rules!r:.60}")
    out = {}
    for metric, rule in rules.items():
        if isinstance(rule, int | float) and not isinstance(rule, bool):
            out[str(metric)] = (">", float(rule))
            continue
        m = _STOP_RULE.match(str(rule))
        if not m:
            raise ValueError(
                f"trainer.stop_on.{metric}: {rule!r} is not a rule; write a comparison and a number, e.g. '> 0.5' "
                "(stop when the step's value is above 0.5) or '< 0.1'"
            )
        out[str(metric)] = (m.group(1), float(m.group(2)))
    return out


@dataclass(frozen=True)
class LoraConfig:
    """LoRA via ``peft`` (policy and critic bodies). The reference model is the base with the
    adapters disabled (no second copy); checkpoints hold the adapters; weight sync pushes merged
    full weights (or, for SGLang, ``rollout.backend`` may load the adapter: see training.lora)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # merged: push W + ΔW as full weights (any backend); adapter: the engine loads the adapter
    # (SGLang /load_lora_adapter, vLLM /v1/load_lora_adapter)
    sync: Literal["merged", "adapter"] = "merged"

    def __post_init__(self) -> None:
        require_at_least(self, 1, "r", "alpha")
        require_between(self, 0, 1, "dropout")


@dataclass(frozen=True)
class ModelConfig:
    path: str = "smollm2-135m-instruct"  # name, local dir or hub id
    dtype: Literal["float32", "bfloat16"] = "float32"
    # Build a tiny random Llama offline instead of loading weights (tests): e.g. {hidden_size: 64}.
    tiny: dict[str, Any] | None = None
    # Recompute each decoder layer's activations in the backward instead of keeping them (HF's
    # gradient_checkpointing_enable, non-reentrant), as verl's enable_gradient_checkpointing.
    gradient_checkpointing: bool = False
    # Log-probs and entropy over chunks of this many tokens from the final hidden states, fp32
    # only inside a chunk, so the [batch, tokens, vocab] logits never exist (training.logprobs).
    # 0: the full-logits path (one [b, w, V] tensor and its fp32 copies), kept as a reference.
    logits_chunk_tokens: int = 1024
    # RL's forwards run each group's prompt once, its samples' continuations over the prompt's
    # keys and values (training.logprobs.shared_prompt_hidden): the G samples of a prompt no
    # longer repeat its tokens. Same math, another float order. Needs the chunked path
    # (logits_chunk_tokens > 0) and sdpa or eager attention; the PPO critic's forward is not shared.
    share_prompt: bool = False
    # Attention kernel: sdpa (PyTorch's, any device), eager, or flash_attention_2 (needs the
    # flash-attn package and a CUDA GPU; refused with a clear error otherwise).
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # LoRA adapters (peft) instead of full fine-tuning: {r, alpha, dropout, target_modules}.
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.logits_chunk_tokens < 0:
            raise ValueError(f"model.logits_chunk_tokens must be >= 0 (0: full logits), got {self.logits_chunk_tokens}")
        if self.share_prompt and self.logits_chunk_tokens == 0:
            raise ValueError("model.share_prompt needs the chunked log-probs (model.logits_chunk_tokens > 0), got 0")
        if self.share_prompt and self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(
                "model.share_prompt needs attn_implementation sdpa or eager (an explicit mask), "
                f"got {self.attn_implementation}"
            )


@dataclass(frozen=True)
class DataConfig:
    # One dataset, or a list trained as one merged set (Search-R1: [nq, hotpotqa]); a merged set
    # needs a retriever over a shared corpus (http, or retriever.corpus/index), and validation
    # (val_split) runs on the FIRST dataset listed.
    dataset: str | list[str] = "hotpotqa"
    split: str = "train100"
    data_dir: str | None = None
    # A FlashRAG-format question file instead of the dataset's split (e.g. ``harness data
    # harr-filter`` output); the retriever still searches ``dataset``'s corpus.
    file: str | None = None
    limit: int | None = None
    shuffle: bool = True
    val_split: str | None = None  # periodic validation through the eval path
    val_limit: int | None = 16

    def __post_init__(self) -> None:
        require_at_least(self, 1, "limit", "val_limit")


# ``rollout.agent`` keys that ``rollout.sampling`` owns: setting one there is refused, naming the key to use.
_SAMPLING_KEYS = ("temperature", "top_p", "max_new_tokens", "seed")


@dataclass(frozen=True)
class SamplingConfig:
    """``rollout.sampling``: how every RL rollout samples, the one place the trainer reads it from.

    Rollouts sample at ``temperature`` and ``top_p`` and generate at most ``max_new_tokens`` a
    turn; the trainer scores tokens at the same temperature (:mod:`training.logprobs`). Each
    rollout gets its own seed from ``seed`` (None: ``trainer.seed``), the step, the prompt and the
    sample (:func:`training.rl.rollout.sample_seed`). Validation is greedy with the same ``max_new_tokens``.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256  # per turn (the agent loop's default)
    seed: int | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 0, "temperature")
        require_at_least(self, 1, "max_new_tokens")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class RolloutAgentConfig:
    """``rollout.agent``: the agent loop's options for RL rollouts and validation, as
    ``pipelines.search_agent.AgentConfig`` (see it for each key) less the sampling keys, which
    ``rollout.sampling`` owns (``MOVED_KEYS``: a recipe that sets one here is refused). ``mode``
    null: rollouts run the dialect's training code where it differs from its evaluation (RAG-R1),
    validation its default. A test keeps the keys and defaults equal to ``AgentConfig``'s."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {k: f"rollout.sampling.{k}" for k in _SAMPLING_KEYS}

    max_turns: int = 4
    max_total_tokens: int = 1024
    max_context: int | None = None
    min_room: int = 8
    topk: int = 3
    max_doc_tokens: int | None = 128
    max_query_doc_tokens: int | None = None
    max_obs_tokens: int | None = None
    chat: bool = True
    few_shot: bool = False
    response_prefix: str = ""
    final_turn: bool | None = None
    mode: str | None = None
    max_concurrency: int = 64
    variant: str = "exact"
    template: str | None = None
    chat_template: str | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 0, "max_turns")
        require_at_least(
            self, 1, "max_total_tokens", "min_room", "topk", "max_doc_tokens", "max_query_doc_tokens", "max_obs_tokens"
        )
        require_at_least(self, 1, "max_concurrency", "max_context")


@dataclass(frozen=True)
class RolloutConfig:
    # Sampling moved into ``rollout.sampling``: the old keys are refused with the new one's name.
    MOVED_KEYS: ClassVar[dict[str, str]] = {k: f"rollout.sampling.{k}" for k in ("temperature", "top_p")}

    method: str = "r1_searcher"  # the agent dialect
    n_samples: int = 4  # rollouts per prompt (one GRPO group)
    prompts_per_step: int = 2
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    # The backend rollouts come from, configured as ``harness eval``'s (``kind``, ``url``,
    # ``launch``, ``engine``, ``max_batch_size``, ...). It always serves the policy: its model and
    # dtype are ``model.path`` and ``model.dtype``. ``launch: true`` starts SGLang for the run.
    backend: BackendConfig = field(default_factory=lambda: BackendConfig(max_batch_size=16))
    agent: RolloutAgentConfig = field(default_factory=RolloutAgentConfig)
    # How weights reach a server: "disk" (a model directory + /update_weights_from_disk, tested
    # against real SGLang) or "distributed" (broadcast over NCCL/gloo, SGLang's
    # /update_weights_from_distributed; tested only against a stand-in, see training.rl.dist_sync).
    weight_sync: Literal["disk", "distributed"] = "disk"

    def __post_init__(self) -> None:
        require_at_least(self, 1, "n_samples", "prompts_per_step")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    critic_lr: float = 1e-5
    # AdamW's decoupled weight decay: 0 as OpenRLHF's --l2 and HF's Trainer; verl's actor and
    # critic use 1e-2 (fsdp_workers.py), so the recipes that follow verl set 0.01.
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's (verl, HF); OpenRLHF's --adam_betas is (0.9, 0.95)
    # The LR schedule (a training.engine.LR_SCHEDULES name), after a linear warmup from 0 over
    # ``warmup_steps``: constant; linear decay to ``min_lr_ratio`` × lr (HF's "linear": to 0);
    # cosine decay to ``min_lr_ratio`` × lr (verl's min_lr_ratio, HF's cosine_with_min_lr).
    schedule: str = "constant"
    min_lr_ratio: float = 0.0
    # What the warmup and the decay count: ``training_step`` (one rollout batch, however many
    # optimizer steps its mini-batches and epochs make: verl steps its scheduler once per
    # training step) or ``optimizer_step`` (HF's Trainer, TRL, OpenRLHF). SFT and PRM make one
    # optimizer step per training step, so both read the same there.
    schedule_unit: Literal["training_step", "optimizer_step"] = "training_step"
    # The steps (in ``schedule_unit``) the decay spans, warmup included, as HF's
    # num_training_steps; None: the run's (trainer.max_steps, × the optimizer steps per training
    # step when counting optimizer steps). Past it the LR stays at its floor.
    schedule_steps: int | None = None
    # Linear warmup over this many steps of ``schedule_unit``: step t (0-based) runs at
    # lr · t / warmup_steps (verl's lr_warmup_steps = int(lr_warmup_steps_ratio × total steps);
    # HF's warmup_steps). 0: no warmup.
    warmup_steps: int = 0
    critic_warmup_steps: int = 0  # the critic's own warmup (verl's critic.optim.lr_warmup_steps_ratio)
    grad_clip: float = 1.0
    micro_batch_size: int = 4
    zero_stage: int = 0
    bf16: bool = False
    threads: int | None = None  # torch.set_num_threads (one is often fastest on 2-core machines)
    # torch's fused AdamW kernel (training.engine.adamw_kernel): 13x faster an optimizer step on
    # the CPU than the per-parameter loop that was used before 2026-12-06, the same update up to
    # float rounding (tests/training/test_engine.py). False: the loop.
    fused: bool = True

    def __post_init__(self) -> None:
        require_registered(self, schedule=LR_SCHEDULE_NAMES)
        if len(self.betas) != 2:
            raise ValueError(f"optim.betas must be two numbers, got {list(self.betas)}")
        if self.warmup_steps < 0 or self.critic_warmup_steps < 0:
            raise ValueError("optim.warmup_steps and optim.critic_warmup_steps must be >= 0")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        require_at_least(self, 1, "schedule_steps", "micro_batch_size", "threads")
        require_at_least(self, 0, "lr", "critic_lr", "weight_decay", "grad_clip")
        require_between(self, 0, 3, "zero_stage")


@dataclass(frozen=True)
class AsyncConfig:
    """``trainer.async``: rollouts that never wait for the trainer (:mod:`training.rl.async_rollout`).

    A producer keeps rollout groups (a prompt's ``n_samples``) in flight through the same agent
    into a buffer; each step trains on ``prompts_per_step`` finished groups. AReaL's staleness
    control (``max_head_offpolicyness``): a group starts only while it can be consumed at most
    ``max_staleness`` policy versions after the version it started on; the trainer re-checks
    on taking it and drops (and counts) any older one. ``interrupt``: what a weight update does
    to trajectories in flight: ``continue`` (their next turns run on the new weights; each
    segment records the version that wrote it) or ``finish`` (the update waits until they end
    on the old weights; no new group starts meanwhile). A completion never mixes versions: the
    engines apply an update between completions."""

    enabled: bool = False
    max_staleness: int = 1
    interrupt: Literal["continue", "finish"] = "continue"
    # Groups generating at once (AReaL's max_concurrent_rollouts, in groups); None: prompts_per_step.
    max_running_groups: int | None = None

    def __post_init__(self) -> None:
        require_at_least(self, 0, "max_staleness")
        require_at_least(self, 1, "max_running_groups")


@dataclass(frozen=True)
class TrainerConfig:
    max_steps: int = 10
    save_every: int = 5  # checkpoint every N steps (0: only the final one)
    # Also checkpoint after a step that ends this many minutes after the last save (0: off), so a
    # kill loses at most this much work plus one step, however slow the steps are.
    save_every_minutes: float = 0.0
    eval_every: int = 0  # validation through the eval path every N steps (0: never)
    # With eval_every: validate the starting policy too, before step 1 (verl's
    # trainer.val_before_train, default true there): the curve's step 0. Not on a resume.
    val_before_train: bool = True
    # Model selection on validation (algo.kind rl): final/ holds the weights of the validation
    # step with the highest val/<best_metric> (e.g. em; the earliest on a tie, so step 0, the
    # starting policy, when nothing beats it), as HF Trainer's load_best_model_at_end with
    # metric_for_best_model. None: the last step's weights. See training.best_val.
    best_metric: str | None = None
    seed: int = 0
    out: str = "runs/train"
    # Newest complete checkpoints kept on disk (0: keep all). A time-based checkpoint between two
    # save_every steps is interim: only the newest is kept, and it does not count here.
    keep_checkpoints: int = 2
    # A step whose loss or gradient is not finite skips its update (counted: nonfinite/* in the
    # step log); this many such steps in a row stop the run with an error naming the step, before
    # any checkpoint of non-finite weights (0: never stop, only skip). See training.divergence.
    max_nonfinite_steps: int = 5
    tensorboard: bool = True
    wandb_project: str | None = None
    save_rollouts: bool = True  # every rollout trajectory with its reward → rollouts.jsonl
    progress: bool = True  # a rich progress bar
    # With algo.entropy_coef = 0 the policy entropy is only a metric: compute and log it every N
    # training steps (1: every step, 0: never). A nonzero coefficient computes it every step.
    entropy_every: int = 10
    # Asynchronous rollouts (``trainer.async`` in YAML; see training.rl.async_rollout).
    async_: AsyncConfig = field(default_factory=lambda: AsyncConfig(), metadata={"key": "async"})
    # RL: before the first step, check that the retriever returns text for a few training
    # questions and that a gold answer's reward is positive; stop with what failed otherwise.
    preflight: bool = True
    # RL: stop the run when a step metric crosses a rule ({"health/empty_retrieval": "> 0.5",
    # "format_valid": "< 0.05"}; a bare number means ">") for stop_on_steps steps in a row, as
    # max_nonfinite_steps stops a diverged run. See training.health.
    stop_on: dict[str, Any] = field(default_factory=dict)
    stop_on_steps: int = 1

    def __post_init__(self) -> None:
        require_at_least(self, 1, "max_steps", "stop_on_steps")
        require_at_least(self, 0, "max_nonfinite_steps", "save_every", "save_every_minutes", "eval_every")
        require_at_least(self, 0, "keep_checkpoints", "entropy_every")
        parse_stop_on(self.stop_on)


@dataclass(frozen=True)
class SFTConfig:
    """``algo.kind: sft``: where the trajectories come from (see :mod:`training.sft.sft`).

    Each source is ``{kind: run | chat | synth, path: ..., where: "em >= 1", limit: N}`` (``kind``: a
    ``training.sft.sft_data.SFT_SOURCES`` name).
    """

    sources: list[dict[str, Any]] = field(default_factory=list)
    batch_size: int = 8  # trajectories per optimizer step
    shuffle: bool = True
    # Trajectories held out for the logged val/loss (every trainer.eval_every steps) and for
    # trainer.best_metric: loss (ProRAG: train_test_split(test_size=0.01), best by eval_loss).
    val_fraction: float = 0.0
    # Cross-entropy weight of each tag's tokens (training.sft.sft_weights), others 1; the loss is then
    # Σ w·nll / Σ w, as ProRAG's SFT ({"<answer>": 5, "<subquery>": 3, "</step>": 2, ...}). {}: plain mean.
    tag_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"sft.val_fraction must be in [0, 1), got {self.val_fraction}")
        require_at_least(self, 1, "batch_size")


@dataclass(frozen=True)
class PRMConfig:
    """``algo.kind: prm``: the process reward model's data and loss (see :mod:`training.prm.prm`)."""

    data: list[str] = field(default_factory=list)  # MCTS output folders (harness data mcts --out)
    loss: str = "pairwise"  # a training.prm.prm_loss.PRM_LOSSES name; ProRAG: pairwise (TRL RewardTrainer)
    batch_size: int = 32  # pairs (or step records) per optimizer step; ProRAG 4 x 8 accumulation
    val_fraction: float = 0.02  # pairs held out for the logged pair accuracy (ProRAG: 2 %)
    append_eos: bool = True  # ProRAG trains on prefix + step + EOS (prorag/prm/train.py:32-33)
    max_len: int | None = 4096  # ProRAG: --max_seq_length 4096 (scripts/prm.sh)
    # An item longer than max_len: "drop" it, as TRL's RewardTrainer filters its dataset by
    # max_length (ProRAG's TRL 0.26), or "left": keep its last max_len tokens (the head reads the end).
    too_long: Literal["drop", "left"] = "drop"

    def __post_init__(self) -> None:
        require_registered(self, loss=PRM_LOSS_NAMES)
        if self.batch_size < 1:
            raise ValueError(f"prm.batch_size must be >= 1, got {self.batch_size}")
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"prm.val_fraction must be in [0, 1), got {self.val_fraction}")
        require_at_least(self, 1, "max_len")


@dataclass(frozen=True)
class RecipeSource:
    """Where a recipe's values come from (read by ``tests/training/test_recipe_sources.py``; training
    ignores it): the original run's ``repository``, ``file`` and ``commit`` (``also``: further files
    its values come from, such as the trainer's defaults), and ``values``: the original's value of
    each hyper-parameter, keyed by the recipe's dotted key (``optim.lr``). ``shrinks``: the shipped
    seed recipe (a path from the checkout) whose source this recipe shares, for a recipe that runs
    the same original at another scale (the demo's CPU recipes): its repository, file, commit and
    values are that recipe's, and every difference is one of this recipe's ``deviations``.
    ``adapts``: for a recipe of a system that follows no paper (``tool_call``), the shipped recipe
    it adapts (a path from the checkout): its values are that recipe's effective configuration,
    and every difference is one of this recipe's ``deviations``."""

    repository: str = ""
    file: str = ""
    commit: str = ""
    also: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    shrinks: str = ""
    adapts: str = ""


@dataclass(frozen=True)
class Deviation:
    """A recipe key whose value differs from its source's (or has no counterpart there), and why."""

    key: str
    reason: str

    def __post_init__(self) -> None:
        if not self.reason.strip():
            raise ValueError(f"deviations: {self.key!r} needs a reason")


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
    prm: PRMConfig = field(default_factory=PRMConfig)
    retriever_rl: RetrieverTrainConfig = field(default_factory=RetrieverTrainConfig)  # algo.kind: retriever
    papers: str = ""  # which published settings the recipe follows
    source: RecipeSource = field(default_factory=RecipeSource)  # the original run's values (checked by a test)
    deviations: tuple[Deviation, ...] = ()  # where this recipe differs from ``source``, each with its reason

    def __post_init__(self) -> None:
        check_run_name(self.name, "name")  # the run folder is trainer.out/NAME: never outside it
        if self.algo.kind == "rl":
            check_rl_recipe(self)
        if self.trainer.best_metric is not None:
            check_best_metric(self)

    @property
    def rollout_seed(self) -> int:
        """The seed RL rollouts derive theirs from: ``rollout.sampling.seed``, else ``trainer.seed``."""
        s = self.rollout.sampling.seed
        return self.trainer.seed if s is None else s


# trainer.best_metric per trainer: the validation metric it can choose by, and what it needs.
BEST_METRICS = {"sft": "loss", "prm": "pair_acc"}


def check_best_metric(cfg: TrainConfig) -> None:
    """``trainer.best_metric`` chooses among validations: RL's and retriever RL's through the eval
    path (any metric it reports; data.val_split), SFT's held-out loss (sft.val_fraction), the PRM's held-out pair
    accuracy (prm.val_fraction); every one needs trainer.eval_every > 0."""
    t, kind, metric = cfg.trainer, cfg.algo.kind, cfg.trainer.best_metric
    if kind in BEST_METRICS and metric != BEST_METRICS[kind]:
        raise ValueError(f"trainer.best_metric for algo.kind={kind} is {BEST_METRICS[kind]!r}, not {metric!r}")
    held_out = {"rl": ("data.val_split", cfg.data.val_split), "retriever": ("data.val_split", cfg.data.val_split),
                "sft": ("sft.val_fraction", cfg.sft.val_fraction),
                "prm": ("prm.val_fraction", cfg.prm.val_fraction)}[kind]  # fmt: skip
    if not (t.eval_every and held_out[1]):
        raise ValueError(
            f"trainer.best_metric={metric!r} chooses among validations: it needs {held_out[0]} "
            "and trainer.eval_every > 0"
        )


# ---- the RL recipe's checks across sections ------------------------------------------------------
# Every rank count: when the recipe loads (TrainConfig.__post_init__). A given rank count: when the
# trainer is built for it, and before ``rollout.backend.launch`` starts an engine (``training.build``).


def check_rl_recipe(cfg: TrainConfig) -> None:
    """The RL recipe's checks that hold whatever the rank count (``ValueError`` naming the key):
    an ``algo`` option its advantage estimator would drop, and an update schedule that cannot
    split the step's batch."""
    # Deferred: the estimators' registry imports torch, kept off the CLI's start-up.
    from training.advantages import ADVANTAGES

    a = cfg.algo
    adv_info = ADVANTAGES.info(a.advantage)  # an unknown estimator: the registry's error
    if a.kl_in_reward and not adv_info.get("kl_in_reward"):
        raise ValueError(
            f"algo.kl_in_reward=true does not apply to algo.advantage={a.advantage} (it would be "
            "dropped silently); set algo.kl_in_reward=false and use a KL loss term (algo.kl_coef > 0)"
        )
    if a.critic_warmup > 1 and not adv_info.get("needs_critic"):  # 0 and 1: no critic-only step
        raise ValueError(f"algo.critic_warmup={a.critic_warmup} needs a critic (algo.advantage: gae)")
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n_samples  # rows per step, all ranks
    mini = a.ppo_mini_batch_size or batch
    if batch % mini:
        raise ValueError(
            f"algo.ppo_mini_batch_size={mini} must divide the step's batch "
            f"(rollout.prompts_per_step × n_samples = {batch})"
        )
    if a.filter_max_gen_batches < 0:
        raise ValueError(f"algo.filter_max_gen_batches must be >= 0 (0: no limit), not {a.filter_max_gen_batches}")
    if a.filter_max_gen_batches != 1 and not a.filter_groups:
        raise ValueError(
            f"algo.filter_max_gen_batches={a.filter_max_gen_batches} refills the groups algo.filter_groups "
            "leaves out: set algo.filter_groups=true"
        )
    if a.filter_groups:
        if mini < batch:
            raise ValueError(
                "algo.filter_groups=true needs one mini-batch of one micro-batch per step: set "
                "algo.ppo_mini_batch_size=null"
            )
        if a.advantage == "gae":
            raise ValueError("algo.filter_groups=true applies to group-relative advantages, not gae")


def check_ranks(cfg: TrainConfig, world: int) -> None:
    """The RL recipe's checks for ``world`` ranks (``ValueError`` naming the key): each rank rolls
    out whole groups and trains whole micro-batches."""
    if cfg.rollout.prompts_per_step % world:
        raise ValueError(f"rollout.prompts_per_step={cfg.rollout.prompts_per_step} must divide by {world} ranks")
    mini_batch_rows(cfg, world)
    if cfg.algo.filter_groups:
        check_filter_groups(cfg, world)
    if cfg.algo.filter_max_gen_batches != 1 and world > 1:
        raise NotImplementedError(
            "algo.filter_max_gen_batches (DAPO's refill) with several ranks is not implemented (every rank "
            "would have to draw as many batches as the one that needs most); run it on one rank"
        )
    if cfg.trainer.async_.enabled and cfg.algo.filter_max_gen_batches != 1:
        raise NotImplementedError(
            "algo.filter_max_gen_batches (DAPO's refill) with trainer.async is not implemented: the "
            "producer's groups come as they finish; set algo.filter_max_gen_batches=1"
        )
    if cfg.trainer.async_.enabled and world > 1:
        raise NotImplementedError(
            "trainer.async with several ranks is not implemented (each rank would need its own "
            "producer and the same number of groups per step); run it on one rank"
        )


def mini_batch_rows(cfg: TrainConfig, world: int) -> int:
    """Rows per optimizer step on one rank (``algo.ppo_mini_batch_size / world``), checked to split
    the step's batch into equal mini-batches of whole micro-batches (so DeepSpeed's accumulation
    boundary falls exactly at each mini-batch's end)."""
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n_samples  # rows per step, all ranks
    mini = cfg.algo.ppo_mini_batch_size or batch
    mb = cfg.optim.micro_batch_size
    if batch % mini or mini % world:
        raise ValueError(
            f"algo.ppo_mini_batch_size={mini} must divide the step's batch "
            f"(rollout.prompts_per_step × n_samples = {batch}) and be divisible by {world} ranks"
        )
    per_rank = mini // world
    if per_rank > mb and per_rank % mb:
        raise ValueError(
            f"algo.ppo_mini_batch_size / ranks = {per_rank} rows must be a multiple of optim.micro_batch_size={mb}"
        )
    return per_rank


def updates_per_training_step(cfg: TrainConfig, world: int) -> int:
    """Optimizer steps one training step (one rollout batch) makes: ``ppo_epochs`` × mini-batches."""
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n_samples  # rows per step, all ranks
    return cfg.algo.ppo_epochs * (batch // (mini_batch_rows(cfg, world) * world))


def check_filter_groups(cfg: TrainConfig, world: int) -> None:
    """``algo.filter_groups`` makes the batch size vary per step, so a rank's step must be one
    micro-batch (DeepSpeed's gradient accumulation counts a fixed number of micro-steps). The rules
    that hold for any rank count (one mini-batch, a group-relative advantage) are
    :func:`check_rl_recipe`'s, checked when the recipe loads."""
    rows = cfg.rollout.prompts_per_step * cfg.rollout.n_samples // world  # rows per step on this rank
    if cfg.optim.micro_batch_size < rows:
        raise ValueError(
            f"algo.filter_groups=true needs one mini-batch of one micro-batch per step: set "
            f"algo.ppo_mini_batch_size=null and optim.micro_batch_size>={rows} (rows per step per rank)"
        )
