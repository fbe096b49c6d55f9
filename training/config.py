"""Typed training configuration (``harness train -c configs/train/NAME.yaml key=value ...``)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from harness.config import require_at_least, require_between
from harness.eval_config import BackendConfig, RetrieverConfig, check_run_name
from training.retriever_config import RetrieverTrainConfig

_STOP_RULE = re.compile(r"^\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_stop_on(rules: dict[str, Any]) -> dict[str, tuple[str, float]]:
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
    # Attention kernel: sdpa (PyTorch's, any device), eager, or flash_attention_2 (needs the
    # flash-attn package and a CUDA GPU; refused with a clear error otherwise).
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"
    # LoRA adapters (peft) instead of full fine-tuning: {r, alpha, dropout, target_modules}.
    lora: LoraConfig | None = None

    def __post_init__(self) -> None:
        if self.logits_chunk_tokens < 0:
            raise ValueError(f"model.logits_chunk_tokens must be >= 0 (0: full logits), got {self.logits_chunk_tokens}")


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
    sample (:func:`training.rollout.sample_seed`). Validation is greedy with the same ``max_new_tokens``.
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
    # /update_weights_from_distributed; tested only against a stand-in, see training.dist_sync).
    weight_sync: Literal["disk", "distributed"] = "disk"

    def __post_init__(self) -> None:
        require_at_least(self, 1, "n_samples", "prompts_per_step")


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """``algo.rollout_correction``: the importance ratio ρ = π_old / π_behav of every model token,
    from the trainer's pre-update log-probs and the backend's, and what the policy loss does with
    it (see :mod:`training.losses`; docs/training.md has the table of which kind each framework
    uses). ``none``: nothing (the mismatch is still logged); ``tis``: each token's loss term ×
    min(ρ, ``cap``) (``cap: null``: × ρ); ``mask``: × ρ inside [``lo``, ``hi``], 0 outside (``hi:
    null``: no upper bound; IcePop and OpenRLHF's ``icepop`` at ``level: token``). ``tis`` and
    ``mask`` take ρ per token (``level: token``) or per row (``level: sequence``: exp Σ over the
    row's model tokens). The rejections weigh a kept token 1 and a rejected one 0: ``geo_mask``
    rejects a row whose geometric mean exp(mean log ρ) is outside [``lo``, ``hi``] (SkyRL's
    ``sequence_mask_metric: geometric``, recommended [0.99, 1.01]); ``token_mask`` a token outside
    the band (SkyRL's ``token_mask_is_threshold_*``); ``outlier_mask`` a row with any token outside
    the band (SkyRL's ``outlier_token_is_threshold_*``). ``masked_in_denominator``: a token
    weighted 0 still counts in the loss's denominators (TRL, AReaL, SkyRL, OpenRLHF); false: it
    leaves them, as verl's rejection sampling rewrites ``response_mask``. TRL 0.26's
    ``vllm_importance_sampling_mode`` maps as token_truncate → {tis, token}, sequence_mask → {mask,
    sequence, hi: cap}, and so on."""

    kind: Literal["none", "tis", "mask", "geo_mask", "token_mask", "outlier_mask"] = "none"
    level: Literal["token", "sequence"] = "token"  # tis and mask; the rejections fix their own
    cap: float | None = 2.0  # tis (verl's rollout_is_threshold default 2.0; TRL's cap is 3.0)
    lo: float = 0.0  # mask and the rejections: the band [lo, hi] of kept ratios
    hi: float | None = 2.0
    masked_in_denominator: bool = True

    def __post_init__(self) -> None:
        if self.cap is not None and not self.cap > 0:
            raise ValueError(f"algo.rollout_correction.cap must be > 0 (or null), got {self.cap}")
        # The band keeps ratio 1 (engine and trainer agree) and is not empty.
        if not (0 <= self.lo <= 1 and (self.hi is None or (self.hi >= 1 and self.hi > self.lo))):
            raise ValueError(
                f"algo.rollout_correction band [lo, hi] = [{self.lo}, {self.hi}] must hold 1, with 0 <= lo < hi"
            )


@dataclass(frozen=True)
class AlgoConfig:
    # The trainer (training.build.TRAINERS): rl; sft: supervised fine-tuning on ``sft.sources``
    # (training.sft); prm: a process reward model on MCTS records ``prm.data`` (training.prm);
    # retriever: RL on the retriever's query tower, generator frozen (``retriever_rl``).
    kind: Literal["rl", "sft", "prm", "retriever"] = "rl"
    # The Literals below name registered functions (training.advantages.ADVANTAGES,
    # training.losses.AGGREGATIONS, KL_ESTIMATORS); tests keep them equal.
    advantage: Literal["grpo", "group_norm", "reinforce_pp", "gae", "dual_granularity"] = "grpo"
    reward: Any = "r1_searcher_stage1"  # a name, {name: ..., params}, or a list to compose
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "dapo", "dr_grpo"] = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    # the KL loss term's estimator: k3 is verl's low_var_kl (clamped to ±10), k3_unclamped TRL's
    kl_estimator: Literal["k1", "k2", "k3", "k3_unclamped"] = "k3"
    # Fold −kl_coef·k1 into every model token's reward instead of a KL loss term: PPO (verl), and
    # OpenRLHF's group_norm / reinforce_pp; grpo adds the summed penalty to the score it
    # group-normalises (verl). An estimator that cannot take it refuses the combination.
    kl_in_reward: bool = False
    entropy_coef: float = 0.0
    # verl's update schedule: the step's rollouts (``prompts_per_step × n_samples`` rows, all ranks)
    # are split into mini-batches of ``ppo_mini_batch_size`` ROWS (verl counts prompts: a verl
    # value × rollout.n), each one optimizer step with gradient accumulation over micro-batches of
    # ``optim.micro_batch_size``; ``ppo_epochs`` passes over the batch. None: one mini-batch.
    # More than one update per batch moves the ratio away from 1, so clipping can act.
    ppo_epochs: int = 1
    ppo_mini_batch_size: int | None = None
    whiten_advantages: bool = True  # GAE: whiten advantages over the batch (verl, Search-R1)
    # GAE's tokens: "model" runs GAE, its whitening and the critic's loss over model tokens only
    # (observations skipped, as verl's newer multi-turn GAE); "response" over every token after the
    # prompt, observations included (their KL reward 0), as Search-R1's and RAG-R1's verl do
    # (ray_trainer.py compute_advantage and dp_critic.py take the attention mask); the policy loss
    # stays on model tokens either way. With gamma = lam = 1 the model tokens' advantages are the
    # same; the whitening statistics and the critic's targets differ.
    gae_over: Literal["model", "response"] = "model"
    critic_warmup: int = 0  # PPO: the first N steps update only the critic (verl's trainer.critic_warmup)
    gamma: float = 1.0
    lam: float = 1.0
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    dual_beta: float = 0.3
    step_scorer: str = "rule"  # dual_granularity: a training.rewards.STEP_SCORERS name (rule, prm)
    step_scorer_path: str | None = None  # step_scorer prm: a trained PRM folder, scored in process
    step_scorer_url: str | None = None  # step_scorer prm: a `harness serve prm` server instead
    step_scorer_format: bool = False  # step_scorer prm: add ProRAG's step format term (training.prm)
    # step_scorer prm: what the PRM scores of each prefix + step (training.prm_window.ScoringWindow),
    # as ProRAG's RL scores it (prorag/rl/trainer.py get_prm_score: the tokenizer's truncation=True,
    # max_length=4096 keeps the FIRST 4096 tokens, and no EOS is appended, though the PRM was trained
    # with one, prorag/prm/train.py:32-33).
    step_scorer_append_eos: bool = False
    step_scorer_max_len: int | None = 4096
    step_scorer_keep: Literal["first", "last"] = "first"
    norm_by_std: bool = True
    # ε of the advantage's normalisation; null: the estimator's own, registered with it
    # (training.advantages.ADVANTAGES: grpo 1e-6 as verl, group_norm 1e-9 and reinforce_pp 1e-8 as
    # OpenRLHF, gae 1e-8 as verl's masked_whiten, dual_granularity 1e-4 as ProRAG).
    adv_eps: float | None = None
    # dual_granularity: the step scores' σ is sqrt(var + step_eps) (ProRAG, prorag/rl/trainer.py:187)
    step_eps: float = 1e-8
    # DAPO's dynamic-sampling filter without the refill: groups whose rollouts all got the same
    # reward (no group-relative signal) are left out of the step's update (logged groups/kept_frac).
    filter_groups: bool = False
    # Shuffle the step's rows before they are cut into mini-batches and micro-batches, as OpenRLHF's
    # replay-buffer DataLoader (shuffle=True; R1-Searcher); false: rollout order, as verl splits.
    shuffle_rows: bool = False
    max_len: int | None = None  # truncate collated sequences (Dr. GRPO's constant denominator too)
    # Rollout correction (training.losses.ROLLOUT_CORRECTIONS): weigh or drop tokens by how far the
    # backend's sampling log-probs (the BEHAVIOUR policy, recorded at generation) are from the
    # trainer's pre-update ones, in synchronous and asynchronous runs alike. AReaL's decoupled PPO
    # is {kind: mask, level: token, hi: CAP} (its behav_imp_weight_cap), or {kind: tis, cap: null}
    # without a cap: the trainer's old log-probs are always recomputed, so they are its proximal policy.
    rollout_correction: RolloutCorrectionConfig = field(default_factory=lambda: RolloutCorrectionConfig())

    def __post_init__(self) -> None:
        if self.ppo_epochs < 1:
            raise ValueError(f"algo.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        if self.ppo_mini_batch_size is not None and self.ppo_mini_batch_size < 1:
            raise ValueError(f"algo.ppo_mini_batch_size must be >= 1, got {self.ppo_mini_batch_size}")
        if self.critic_warmup < 0:
            raise ValueError(f"algo.critic_warmup must be >= 0, got {self.critic_warmup}")
        require_at_least(self, 0, "clip_low", "clip_high", "kl_coef", "entropy_coef", "vf_coef", "vf_clip", "dual_beta")
        require_between(self, 0, 1, "gamma", "lam")
        require_at_least(self, 1, "max_len")
        if self.gae_over == "response" and self.advantage != "gae":
            raise ValueError(f"algo.gae_over=response applies to algo.advantage=gae, not {self.advantage!r}")
        if self.loss_agg == "dapo" and not self.rollout_correction.masked_in_denominator:
            # dapo's denominator is the optimizer step's token count, taken before the micro-batches'
            # old log-probs (and so the rejections) are known.
            raise ValueError(
                "algo.rollout_correction.masked_in_denominator=false does not apply to algo.loss_agg=dapo "
                "(its step-wide token count is fixed before the rejections); use token_mean or seq_mean_token_mean"
            )


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-6
    critic_lr: float = 1e-5
    # AdamW's decoupled weight decay: 0 as OpenRLHF's --l2 and HF's Trainer; verl's actor and
    # critic use 1e-2 (fsdp_workers.py), so the recipes that follow verl set 0.01.
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW's (verl, HF); OpenRLHF's --adam_betas is (0.9, 0.95)
    # The LR schedule (training.engine.LR_SCHEDULES), after a linear warmup from 0 over
    # ``warmup_steps``: constant; linear decay to ``min_lr_ratio`` × lr (HF's "linear": to 0);
    # cosine decay to ``min_lr_ratio`` × lr (verl's min_lr_ratio, HF's cosine_with_min_lr).
    schedule: Literal["constant", "linear", "cosine"] = "constant"
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

    def __post_init__(self) -> None:
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
    """``trainer.async``: rollouts that never wait for the trainer (:mod:`training.async_rollout`).

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
    # Asynchronous rollouts (``trainer.async`` in YAML; see training.async_rollout).
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
    """``algo.kind: sft``: where the trajectories come from (see :mod:`training.sft`).

    Each source is ``{kind: run | chat | synth, path: ..., where: "em >= 1", limit: N}`` (``kind``: a
    ``training.sft_data.SFT_SOURCES`` name).
    """

    sources: list[dict[str, Any]] = field(default_factory=list)
    batch_size: int = 8  # trajectories per optimizer step
    shuffle: bool = True
    # Trajectories held out for the logged val/loss (every trainer.eval_every steps) and for
    # trainer.best_metric: loss (ProRAG: train_test_split(test_size=0.01), best by eval_loss).
    val_fraction: float = 0.0
    # Cross-entropy weight of each tag's tokens (training.sft_weights), others 1; the loss is then
    # Σ w·nll / Σ w, as ProRAG's SFT ({"<answer>": 5, "<subquery>": 3, "</step>": 2, ...}). {}: plain mean.
    tag_weights: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 1:
            raise ValueError(f"sft.val_fraction must be in [0, 1), got {self.val_fraction}")
        require_at_least(self, 1, "batch_size")


@dataclass(frozen=True)
class PRMConfig:
    """``algo.kind: prm``: the process reward model's data and loss (see :mod:`training.prm`)."""

    data: list[str] = field(default_factory=list)  # MCTS output folders (harness data mcts --out)
    loss: Literal["pairwise", "pointwise"] = "pairwise"  # ProRAG: pairwise (TRL RewardTrainer)
    batch_size: int = 32  # pairs (or step records) per optimizer step; ProRAG 4 x 8 accumulation
    val_fraction: float = 0.02  # pairs held out for the logged pair accuracy (ProRAG: 2 %)
    append_eos: bool = True  # ProRAG trains on prefix + step + EOS (prorag/prm/train.py:32-33)
    max_len: int | None = 4096  # ProRAG: --max_seq_length 4096 (scripts/prm.sh)
    # An item longer than max_len: "drop" it, as TRL's RewardTrainer filters its dataset by
    # max_length (ProRAG's TRL 0.26), or "left": keep its last max_len tokens (the head reads the end).
    too_long: Literal["drop", "left"] = "drop"

    def __post_init__(self) -> None:
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
    values are that recipe's, and every difference is one of this recipe's ``deviations``."""

    repository: str = ""
    file: str = ""
    commit: str = ""
    also: tuple[str, ...] = ()
    values: dict[str, Any] = field(default_factory=dict)
    shrinks: str = ""


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
    """``trainer.best_metric`` chooses among validations: RL's through the eval path (any metric it
    reports; data.val_split), SFT's held-out loss (sft.val_fraction), the PRM's held-out pair
    accuracy (prm.val_fraction); every one needs trainer.eval_every > 0."""
    t, kind, metric = cfg.trainer, cfg.algo.kind, cfg.trainer.best_metric
    if kind == "retriever":
        raise ValueError("trainer.best_metric applies to algo.kind rl, sft or prm, not retriever")
    if kind in BEST_METRICS and metric != BEST_METRICS[kind]:
        raise ValueError(f"trainer.best_metric for algo.kind={kind} is {BEST_METRICS[kind]!r}, not {metric!r}")
    held_out = {"rl": ("data.val_split", cfg.data.val_split), "sft": ("sft.val_fraction", cfg.sft.val_fraction),
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
    if a.critic_warmup and not adv_info.get("needs_critic"):
        raise ValueError(f"algo.critic_warmup={a.critic_warmup} needs a critic (algo.advantage: gae)")
    batch = cfg.rollout.prompts_per_step * cfg.rollout.n_samples  # rows per step, all ranks
    mini = a.ppo_mini_batch_size or batch
    if batch % mini:
        raise ValueError(
            f"algo.ppo_mini_batch_size={mini} must divide the step's batch "
            f"(rollout.prompts_per_step × n_samples = {batch})"
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
    """``algo.filter_groups`` makes the batch size vary per step, so a step must be one mini-batch
    of one micro-batch (DeepSpeed's gradient accumulation counts a fixed number of micro-steps),
    and the advantage must be group-relative."""
    rows = cfg.rollout.prompts_per_step * cfg.rollout.n_samples // world  # rows per step on this rank
    if mini_batch_rows(cfg, world) < rows or cfg.optim.micro_batch_size < rows:
        raise ValueError(
            f"algo.filter_groups=true needs one mini-batch of one micro-batch per step: set "
            f"algo.ppo_mini_batch_size=null and optim.micro_batch_size>={rows} (rows per step per rank)"
        )
    if cfg.algo.advantage == "gae":
        raise ValueError("algo.filter_groups=true applies to group-relative advantages, not gae")
