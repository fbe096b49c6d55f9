"""The ``algo`` section of a training recipe (:class:`AlgoConfig`, with its
``rollout_correction``): which trainer runs, and the RL objective (advantage estimator, loss
aggregation, clipping, KL, PPO's update schedule, step scores, rollout correction).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from harness.config import require_at_least, require_between, require_registered

# Names that are registries' keys: the registry is the one list of what exists, checked when a
# recipe loads (``require_registered`` imports the registry's module then, not this one).
ADVANTAGE_NAMES = "training.advantages:ADVANTAGES"
AGGREGATION_NAMES = "training.losses:AGGREGATIONS"
KL_ESTIMATOR_NAMES = "training.losses:KL_ESTIMATORS"
ROLLOUT_CORRECTION_NAMES = "training.losses:ROLLOUT_CORRECTIONS"


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

    kind: str = "none"  # a training.losses.ROLLOUT_CORRECTIONS name
    level: Literal["token", "sequence"] = "token"  # tis and mask; the rejections fix their own
    cap: float | None = 2.0  # tis (verl's rollout_is_threshold default 2.0; TRL's cap is 3.0)
    lo: float = 0.0  # mask and the rejections: the band [lo, hi] of kept ratios
    hi: float | None = 2.0
    masked_in_denominator: bool = True

    def __post_init__(self) -> None:
        require_registered(self, kind=ROLLOUT_CORRECTION_NAMES)
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
    # (training.sft.sft); prm: a process reward model on MCTS records ``prm.data`` (training.prm.prm);
    # retriever: RL on the retriever's query tower, generator frozen (``retriever_rl``).
    kind: Literal["rl", "sft", "prm", "retriever"] = "rl"
    # advantage, loss_agg and kl_estimator name registered functions (training.advantages.ADVANTAGES,
    # training.losses.AGGREGATIONS, KL_ESTIMATORS), checked against those registries when the recipe loads.
    advantage: str = "grpo"
    reward: Any = "r1_searcher_stage1"  # a name, {name: ..., params}, or a list to compose
    loss_agg: str = "token_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    kl_coef: float = 0.0  # > 0 loads a frozen reference model
    # the KL loss term's estimator: k3 is verl's low_var_kl (clamped to ±10), k3_unclamped TRL's
    kl_estimator: str = "k3"
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
    # PPO: the actor first learns at step N, the steps before it update only the critic (verl's
    # trainer.critic_warmup, compared with its global step counted from 1: N - 1 critic-only steps)
    critic_warmup: int = 0
    gamma: float = 1.0
    lam: float = 1.0
    vf_coef: float = 0.5
    vf_clip: float = 0.2
    dual_beta: float = 0.3
    step_scorer: str = "rule"  # dual_granularity: a training.rewards.STEP_SCORERS name (rule, prm)
    step_scorer_path: str | None = None  # step_scorer prm: a trained PRM folder, scored in process
    step_scorer_url: str | None = None  # step_scorer prm: a `harness serve prm` server instead
    step_scorer_format: bool = False  # step_scorer prm: add ProRAG's step format term (training.prm.prm)
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
    # DAPO's dynamic-sampling filter: groups whose rollouts all got the same reward (no
    # group-relative signal) are left out of the step's update (logged groups/kept_frac).
    filter_groups: bool = False
    # DAPO's refill (its algorithm.filter_groups.max_num_gen_batches): with filter_groups, a step
    # draws further batches of rollout.prompts_per_step prompts until that many informative groups
    # are kept (the first ones, as DAPO trims to its train batch), at most this many batches a
    # step; 0: no limit (DAPO's default). At the limit DAPO stops the run; here the step trains on
    # the groups it kept (logged filter/gen_batches). 1: no refill, the filter alone.
    filter_max_gen_batches: int = 1
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
        require_registered(self, advantage=ADVANTAGE_NAMES, loss_agg=AGGREGATION_NAMES, kl_estimator=KL_ESTIMATOR_NAMES)
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
