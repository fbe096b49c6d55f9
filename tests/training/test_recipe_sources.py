"""Every seed recipe carries its original run's values (``source:``), and its EFFECTIVE
configuration (defaults included, resolved as the trainer resolves it: ``train_config`` and the
agent options the trainer builds the agent with) equals them on every result-relevant key, unless
a ``deviations:`` entry says why it differs. A default left different from the original fails."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

from harness.config import ConfigError, compose, to_dict
from pipelines.methods import validate_options
from programs.demo.systems import SYSTEMS as DEMO_SYSTEMS
from training.advantages import ADVANTAGES, adv_eps
from training.build import train_config
from training.config import AlgoConfig, TrainConfig
from training.retriever.retriever_rl import rollout_options
from training.validation import rollout_agent_options

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [
    "configs/train/search_r1_ppo_qwen2.5_3b.yaml",
    "configs/train/research_grpo_qwen2.5_7b.yaml",
    "configs/train/r1_searcher_reinforce_pp_stage1.yaml",
    "configs/train/r1_searcher_reinforce_pp_stage2.yaml",
    "configs/train/rag_r1_sft.yaml",
    "configs/train/rag_r1_ppo.yaml",
    "configs/train/prorag_dual_granularity.yaml",
    "configs/train/prorag/rl.yaml",
    "configs/train/prorag_prm.yaml",
    "configs/train/prorag/sft.yaml",
    "configs/train/prorag/rft_sft.yaml",
    "configs/train/harr/minilm_search_r1.yaml",
    "configs/train/harr/minilm_search_r1_ppo.yaml",
]

# The result-relevant keys (issue 33): optimizer and schedule, KL, entropy, clipping, batch
# shape, sampling, retrieval, turn and token caps, advantage, aggregation, critic, reward, length
# of the run, data, LoRA, gradient checkpointing; per trainer kind.
COMMON = [
    "optim.lr", "optim.warmup_steps", "optim.weight_decay", "optim.betas", "optim.grad_clip",
    "optim.micro_batch_size", "trainer.max_steps", "model.gradient_checkpointing", "model.lora", "optim.schedule",
    "model.dtype", "model.attn_implementation", "optim.bf16", "trainer.seed", "trainer.best_metric",
]  # fmt: skip
# The rollout correction's parameters that act, per kind (algo.rollout_correction).
# A kind that weighs a token 0 (masks and rejections) also makes masked_in_denominator act.
BAND = ["lo", "hi", "masked_in_denominator"]
CORRECTION = {
    "none": [], "tis": ["level", "cap"], "mask": ["level", *BAND],
    "geo_mask": BAND, "token_mask": BAND, "outlier_mask": BAND,
}  # fmt: skip
AGENT = [
    "max_turns", "max_total_tokens", "max_context", "topk", "max_doc_tokens",
    "max_query_doc_tokens", "max_obs_tokens", "chat", "few_shot", "response_prefix", "final_turn", "mode", "variant",
    "template", "chat_template",
]  # fmt: skip
RL = [
    "data.dataset", "data.split", "data.file", "rollout.prompts_per_step", "rollout.n_samples",
    "rollout.sampling.temperature", "rollout.sampling.top_p", "rollout.sampling.max_new_tokens",
    "retriever.topk", "algo.advantage", "algo.reward", "algo.loss_agg",
    "algo.clip_low", "algo.clip_high", "algo.kl_coef", "algo.kl_in_reward", "algo.entropy_coef", "algo.ppo_epochs",
    "algo.ppo_mini_batch_size", "algo.filter_groups", "algo.filter_max_gen_batches", "algo.shuffle_rows",
    "algo.max_len",
    "data.shuffle", "data.limit", "retriever.api", "algo.adv_eps", "rollout.agent.min_room", "rollout.method",
    "rollout.sampling.seed", "trainer.async.enabled",
    *(f"rollout.agent.{k}" for k in AGENT),
]  # fmt: skip
CRITIC = [
    "algo.gamma", "algo.lam", "algo.whiten_advantages", "algo.gae_over", "algo.vf_coef", "algo.vf_clip",
    "algo.critic_warmup",
    "optim.critic_lr", "optim.critic_warmup_steps",
]  # fmt: skip
SFT = ["sft.sources", "sft.batch_size", "sft.shuffle", "sft.tag_weights", "algo.max_len", "sft.val_fraction"]
PRM = ["prm.data", "prm.loss", "prm.batch_size", "prm.val_fraction", "prm.append_eos", "prm.max_len", "prm.too_long"]
# algo.step_scorer prm: what the PRM scores of each step at RL time
STEP_PRM = ["algo.step_scorer_append_eos", "algo.step_scorer_max_len", "algo.step_scorer_keep"]
RETRIEVER = [
    "data.dataset", "data.split", "data.file", "data.limit", "retriever_rl.method", "retriever_rl.backend.model",
    "retriever_rl.encoder.name", "retriever_rl.encoder.lora_r", "retriever_rl.encoder.max_length",
    *(f"retriever_rl.sampling.{k}" for k in
      ("n_candidates", "tau", "topk", "stateful", "template", "max_history", "max_titles", "max_chars")),
    *(f"retriever_rl.rl.{k}" for k in
      ("algo", "group_size", "questions_per_step", "steps", "epochs", "lr", "weight_decay", "clip_eps", "kl_coef",
       "kl_in_reward", "reward", "loss_agg", "grad_clip", "schedule", "seed", "pseudo_call")),
    *(f"retriever_rl.agent.{k}" for k in (*AGENT, "max_new_tokens", "temperature", "top_p", "min_room", "seed")),
]  # fmt: skip
PPO_KEYS = ("gamma", "lam", "whiten_advantages", "vf_coef", "vf_clip", "value_lr", "value_hidden")
RETRIEVER_PPO = [f"retriever_rl.rl.{k}" for k in PPO_KEYS]
RETRIEVER_GRPO = ["retriever_rl.rl.norm_by_std", "retriever_rl.rl.adv_eps"]
LORA = [f"retriever_rl.encoder.{k}" for k in ("lora_alpha", "lora_dropout", "lora_targets")]


ASYNC = ["max_staleness", "interrupt", "max_running_groups"]

# Config keys that are not result-relevant, or are so only through another key, and why: the
# classification test holds every key of the configuration in a list above or here, so a new
# key must be placed (and a seed recipe then gives its original's value, or a deviation).
NOT_RELEVANT = {
    "name": "a label", "papers": "a label", "source": "this block", "deviations": "this block",
    "algo.kind": "picks the trainer, and so which of the lists above apply",
    "model.path": "which weights: the recipe's header and papers name them; stage recipes start from the previous "
                  "stage's output folder, a local path no original shares",
    "model.tiny": "a random test model, never a seed recipe's",
    "trainer.preflight": "a check before the first step (retriever text, a gold answer's reward): it stops a broken "
                         "run, it changes nothing a run trains",
    "trainer.stop_on": "stops a run whose health metrics cross a threshold, after the step is logged: what was "
                       "trained is unchanged",
    "trainer.stop_on_steps": "how many steps in a row trainer.stop_on waits for: a stop rule, as trainer.stop_on",
    "model.logits_chunk_tokens": "memory: the vocabulary projection in chunks, the same numbers",
    "model.share_prompt": "each group's prompt in one forward: the same log-probs up to float rounding "
                          "(test_logprobs.py)",
    "optim.zero_stage": "memory: how DeepSpeed shards the same update",
    "optim.threads": "CPU threads",
    "optim.fused": "AdamW's kernel, fused or a loop: the same update up to float rounding (test_engine.py)",
    "data.data_dir": "where the data lie",
    "data.val_split": "validation only (relevant with trainer.best_metric, listed then)",
    "data.val_limit": "validation only (relevant with trainer.best_metric, listed then)",
    "trainer.eval_every": "validation only (relevant with trainer.best_metric, listed then)",
    "trainer.val_before_train": "validation only (relevant with trainer.best_metric, listed then)",
    "trainer.async": "relevant when trainer.async.enabled (listed then)",
    "trainer.out": "bookkeeping", "trainer.save_every": "bookkeeping", "trainer.save_every_minutes": "bookkeeping",
    "trainer.keep_checkpoints": "bookkeeping", "trainer.tensorboard": "bookkeeping",
    "trainer.wandb_project": "bookkeeping", "trainer.save_rollouts": "bookkeeping", "trainer.progress": "bookkeeping",
    "trainer.entropy_every": "logging: the entropy metric's period (algo.entropy_coef is the loss term)",
    "trainer.max_nonfinite_steps": "a guard: stops a diverged run",
    "rollout.backend": "which engine serves the policy; what it samples is rollout.sampling's and model.*'s",
    "rollout.weight_sync": "how weights reach the engine, the same weights",
    "rollout.agent.max_concurrency": "scheduling",
    "rollout.agent.max_new_tokens": "set from rollout.sampling.max_new_tokens for rollouts",
    "rollout.agent.temperature": "set from rollout.sampling for rollouts",
    "rollout.agent.top_p": "set from rollout.sampling for rollouts",
    "rollout.agent.seed": "set from rollout.sampling.seed for rollouts",
    "retriever": "where the retriever runs (kind, url, index, model, timeouts); the index it serves is named in "
                 "the recipe's header (retriever.topk and retriever.api are listed)",
    "algo.step_scorer_path": "where the PRM lies", "algo.step_scorer_url": "where the PRM is served",
    "algo.rollout_correction": "its keys act per kind (CORRECTION)",
    "retriever_rl.backend": "which engine serves the frozen generator (retriever_rl.backend.model is listed)",
    "retriever_rl.agent.max_concurrency": "scheduling",
    "retriever_rl.baseline": "an evaluation baseline, not training",
    "retriever_rl.corpus": "where the corpus lies", "retriever_rl.index": "where the index lies",
    "retriever_rl.doc_encoder": "the frozen document tower that built the index",
    "retriever_rl.encoder": "its keys are listed (lora_* when lora_r > 0)",
    "retriever_rl.rl.sync_url": "pushes the tower to a served retriever", "retriever_rl.rl.sync_every": "see sync_url",
    "retriever_rl.rl.sync_timeout": "see sync_url",
}  # fmt: skip


def unclassified(keys: list[str], relevant_keys: set[str]) -> list[str]:
    """The keys neither relevant (``relevant_keys``, a section covering its leaves) nor in ``NOT_RELEVANT``."""

    def covered(k: str, names: Any) -> bool:
        parts = k.split(".")
        # a key under a named section, or a section (empty by default) whose keys are named
        return any(".".join(parts[:i]) in names for i in range(1, len(parts) + 1)) or any(
            n.startswith(k + ".") for n in names
        )

    return sorted(k for k in keys if not covered(k, relevant_keys) and not covered(k, NOT_RELEVANT))


def leaves(d: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping's leaves (lists are leaves)."""
    if not isinstance(d, dict) or not d:
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= leaves(v, f"{prefix}.{k}" if prefix else str(k))
    return out


def lookup(d: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(d, dict) or part not in d:
            raise KeyError(key)
        d = d[part]
    return d


def same(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) | isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def effective(cfg: TrainConfig) -> dict[str, Any]:
    """The configuration as the trainer sees it: every default filled in, and the agent the
    trainer builds (its AgentConfig, from the same options) in place of the recipe's overrides."""
    eff = to_dict(cfg)
    if cfg.algo.kind == "rl":
        eff["rollout"]["agent"] = to_dict(validate_options(cfg.rollout.method, rollout_agent_options(cfg)))
        eff["algo"]["adv_eps"] = adv_eps(cfg.algo, cfg.algo.advantage)  # null: the estimator's own ε
    if cfg.algo.kind == "retriever":
        eff["retriever_rl"]["agent"] = to_dict(validate_options(cfg.retriever_rl.method, rollout_options(cfg)))
    return eff


def relevant(cfg: TrainConfig, eff: dict[str, Any]) -> list[str]:
    """The result-relevant keys of this recipe's trainer (sections expand to their leaves)."""
    a, kind = cfg.algo, cfg.algo.kind
    keys = list(COMMON)
    # A decay's floor, unit and span matter only with a decay (the unit: or with a warmup).
    decays = eff["optim"]["schedule"] != "constant"
    keys += ["optim.min_lr_ratio", "optim.schedule_steps"] if decays else []
    keys += ["optim.schedule_unit"] if decays or eff["optim"]["warmup_steps"] else []
    if eff["trainer"]["best_metric"] is not None:  # validation chooses the final weights
        keys += ["trainer.eval_every"]
        keys += ["trainer.val_before_train", "data.val_split", "data.val_limit"] if kind == "rl" else []
    if kind == "rl":
        keys += RL
        keys += [f"trainer.async.{k}" for k in ASYNC] if eff["trainer"]["async"]["enabled"] else []
        info = ADVANTAGES.info(a.advantage)
        keys += CRITIC if info.get("needs_critic") else []
        keys += ["algo.gamma"] if a.advantage in ("group_norm", "reinforce_pp") else []
        keys += ["algo.norm_by_std"] if a.advantage == "grpo" else []
        if info.get("needs_step_scores"):
            keys += ["algo.dual_beta", "algo.step_scorer", "algo.step_scorer_format", "algo.step_eps"]
            keys += STEP_PRM if a.step_scorer == "prm" else []
        keys += ["algo.kl_estimator"] if a.kl_coef > 0 and not a.kl_in_reward else []
        kind_rc = eff["algo"]["rollout_correction"]["kind"]  # its level, cap or band matter only when it acts
        keys += [f"algo.rollout_correction.{k}" for k in ("kind", *CORRECTION[kind_rc])]
    elif kind == "sft":
        keys += SFT
    elif kind == "prm":
        keys += PRM
    elif kind == "retriever":
        r = cfg.retriever_rl
        keys = [k for k in keys if not k.startswith(("optim.", "model."))]  # the tower's own optimizer
        keys.remove("trainer.max_steps")  # retriever_rl.rl.steps
        keys.remove("trainer.seed")  # retriever_rl.rl.seed
        keys.remove("trainer.best_metric")  # the retriever trainer keeps its last tower
        keys += RETRIEVER + (RETRIEVER_PPO if r.rl.algo == "ppo" else RETRIEVER_GRPO)
        keys += ["retriever_rl.rl.schedule_steps"] if r.rl.schedule != "constant" else []
        keys += LORA if r.encoder.lora_r > 0 else []
    return keys  # a section (model.lora, sft.tag_weights) is one key, compared as a whole


def _has(eff: dict[str, Any], key: str) -> bool:
    try:
        lookup(eff, key)
    except KeyError:
        return False
    return True


def source_of(cfg: TrainConfig) -> Any:
    """The source a recipe is checked against: its own, or (``source.shrinks``) the seed recipe's
    it runs at another scale."""
    if cfg.source.shrinks:
        return train_config([str(ROOT / cfg.source.shrinks)], []).source
    return cfg.source


def inherited_deviations(cfg: TrainConfig, eff: dict[str, Any]) -> dict[str, str]:
    """A recipe that shrinks a seed recipe keeps that recipe's explained deviations where it has
    the seed recipe's very value (the reason still holds); a key it changes again needs its own."""
    if not cfg.source.shrinks:
        return {}
    seed = train_config([str(ROOT / cfg.source.shrinks)], [])
    seed_eff = effective(seed)
    return {
        d.key: d.reason
        for d in seed.deviations
        if _has(eff, d.key) and _has(seed_eff, d.key) and same(lookup(eff, d.key), lookup(seed_eff, d.key))
    }


def adapted_values(cfg: TrainConfig) -> dict[str, Any]:
    """The values a recipe that adapts another (``source.adapts``: a system that follows no paper)
    is checked against: the adapted recipe's effective value of every key relevant to either."""
    base = train_config([str(ROOT / cfg.source.adapts)], [])
    base_eff, eff = effective(base), effective(cfg)
    keys = dict.fromkeys([*relevant(base, base_eff), *relevant(cfg, eff)])
    return {k: lookup(base_eff, k) for k in keys if _has(base_eff, k)}


def check(path: str, cfg: TrainConfig) -> list[str]:
    """Every problem of the recipe at ``path`` against its source block (empty: it matches)."""
    problems: list[str] = []
    src = source_of(cfg)
    if cfg.source.adapts:  # its original is a shipped recipe, every key of it
        src = dataclasses.replace(src, values=adapted_values(cfg))
    elif not (src.repository and src.file and len(src.commit) == 40):
        problems.append("source needs repository, file, commit")
    eff = effective(cfg)
    deviations = {d.key: d.reason for d in cfg.deviations}
    if len(deviations) != len(cfg.deviations):
        problems.append("a key is listed twice under deviations")
    deviations = {**inherited_deviations(cfg, eff), **deviations}
    for key in deviations:
        if not _has(eff, key):
            problems.append(f"deviation {key!r} names no config key")
    for key, want in src.values.items():
        if not _has(eff, key):
            problems.append(f"source names {key!r}, which is no config key")
            continue
        got = lookup(eff, key)
        if key in deviations:
            if same(got, want):
                problems.append(f"{key} is listed as a deviation but equals the original's {want!r}")
        elif not same(got, want):
            problems.append(f"{key} = {got!r}, the original's is {want!r} (no deviation listed)")
    covered = set(src.values) | set(deviations)
    missing = [k for k in relevant(cfg, eff) if k not in covered]
    if missing:
        problems.append(f"result-relevant keys without the original's value or a deviation: {missing}")
    return problems


@pytest.mark.parametrize("path", SEEDS)
def test_the_effective_recipe_equals_its_source_except_the_listed_deviations(path):
    cfg = train_config([str(ROOT / path)], [])
    assert check(path, cfg) == []


def demo_stage(system: str, stage: int) -> tuple[str, TrainConfig]:
    """A training stage of ``harness demo --system SYSTEM`` as the demo composes it: its shipped
    recipe with the demo's evaluation agent and retriever copied in (programs.demo.program)."""
    from programs.demo.program import _eval_data, retriever_stage_config, rl_stage_config
    from programs.demo.systems import METHODS_CONFIG, get_system, shipped

    s = get_system(system)
    data = _eval_data(shipped(METHODS_CONFIG), ROOT / "runs" / "x", 1, s)
    build = retriever_stage_config if s.chain == "harr" else rl_stage_config
    start, run = ROOT / "runs" / "x" / "start", ROOT / "runs" / "x" / s.stage_names[stage]
    return s.rl[stage], build(shipped(s.rl[stage]), s.method, data, start, run, [])


DEMO_STAGES = [(name, i) for name, s in DEMO_SYSTEMS.items() for i in range(len(s.rl))]
# ProRAG's demo stages between its SFT and RL models (the demo sets their data and model paths).
DEMO_SIDE = sorted(DEMO_SYSTEMS["prorag"].extra[k] for k in ("prm", "rft"))


# The demo recipes that shrink a seed recipe: what a recipe of a system without a paper may adapt.
SEED_DEMO = sorted({r for s in DEMO_SYSTEMS.values() for r in s.rl if train_config([str(ROOT / r)], []).source.shrinks})


@pytest.mark.parametrize("system,stage", DEMO_STAGES)
def test_each_demo_recipe_is_its_original_at_cpu_scale(system, stage):
    """The demo's CPU recipes, as the demo runs them, name the seed recipe they shrink and list
    every change of scale: algorithm, estimator, reward, KL and clipping stay the original's. A
    system that follows no paper (tool_call) names the seed system's demo recipe it adapts
    instead, and lists every difference from it."""
    path, cfg = demo_stage(system, stage)
    if cfg.source.adapts:
        assert not cfg.source.shrinks and cfg.source.adapts in SEED_DEMO, f"{path}: adapts names no seed demo recipe"
    else:
        assert cfg.source.shrinks in SEEDS, f"{path}: source.shrinks must name a seed recipe"
    assert check(path, cfg) == []


@pytest.mark.parametrize("path", DEMO_SIDE)
def test_each_demo_side_recipe_is_its_original_at_cpu_scale(path):
    cfg = train_config([str(ROOT / path)], [])
    assert cfg.source.shrinks in SEEDS, f"{path}: source.shrinks must name a seed recipe"
    assert check(path, cfg) == []


def plant_default(monkeypatch, cls: type, name: str, value: Any) -> None:
    """Change the default of dataclass ``cls``'s field ``name`` in its generated ``__init__``."""
    names = [f.name for f in dataclasses.fields(cls)]
    defaults = list(cls.__init__.__defaults__)
    defaults[names.index(name) - (len(names) - len(defaults))] = value
    monkeypatch.setattr(cls.__init__, "__defaults__", tuple(defaults))


def test_every_rollout_correction_kind_names_the_keys_that_act_for_it():
    from training.losses import ROLLOUT_CORRECTIONS

    assert set(CORRECTION) == set(ROLLOUT_CORRECTIONS.names())
    fields = {f.name for f in dataclasses.fields(AlgoConfig().rollout_correction)} - {"kind"}
    assert set().union(*CORRECTION.values()) == fields  # every field of the config acts for some kind


def test_a_default_that_differs_from_the_original_fails(monkeypatch):
    """Plant a default no recipe file writes: the check must now fail, though no recipe changed."""
    from training.config import RolloutAgentConfig

    path = "configs/train/search_r1_ppo_qwen2.5_3b.yaml"
    assert check(path, train_config([str(ROOT / path)], [])) == []
    plant_default(monkeypatch, RolloutAgentConfig, "few_shot", True)  # the recipe leaves it to the default
    assert "rollout.agent.few_shot = True, the original's is False (no deviation listed)" in check(
        path, train_config([str(ROOT / path)], [])
    )
    plant_default(monkeypatch, AlgoConfig, "shuffle_rows", True)  # a training default too
    assert any(p.startswith("algo.shuffle_rows = True") for p in check(path, train_config([str(ROOT / path)], [])))


def test_an_unlisted_relevant_default_fails(tmp_path):
    """A recipe whose source omits a result-relevant key (here the agent's per-document cap,
    left at its default) fails, even though the recipe never wrote the key."""
    raw = (ROOT / SEEDS[0]).read_text(encoding="utf-8").replace("    rollout.agent.max_doc_tokens: null", "")
    p = tmp_path / "r.yaml"
    p.write_text(raw)
    problems = check(str(p), train_config([str(p)], []))
    assert problems and "rollout.agent.max_doc_tokens" in problems[-1]


def test_the_blocks_are_accepted_and_a_deviation_needs_a_reason(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text(
        "source: {repository: a/b, file: f, commit: c, values: {optim.lr: 1}}\n"
        "deviations: [{key: optim.lr, reason: ' '}]\n"
    )
    with pytest.raises(ConfigError, match="needs a reason"):
        compose(TrainConfig, [bad])
    bad.write_text("deviations: [{key: optim.lr}]\n")
    with pytest.raises(ConfigError, match="reason"):
        compose(TrainConfig, [bad])


def all_keys_and_relevant() -> tuple[list[str], set[str]]:
    """Every key of the configuration (the defaults and every seed recipe's effective one) and
    every key some seed recipe treats as result-relevant."""
    keys = set(leaves(to_dict(TrainConfig())))
    rel: set[str] = set()
    for path in SEEDS:
        cfg = train_config([str(ROOT / path)], [])
        eff = effective(cfg)
        keys |= set(leaves(eff))
        rel |= set(relevant(cfg, eff))
    # every list, whatever recipe uses it (an async or a best_metric recipe, a LoRA tower)
    rel |= {*COMMON, *RL, *CRITIC, *SFT, *PRM, *STEP_PRM, *RETRIEVER, *RETRIEVER_PPO, *RETRIEVER_GRPO, *LORA}
    rel |= {f"trainer.async.{k}" for k in ASYNC} | {"optim.min_lr_ratio", "optim.schedule_steps", "optim.schedule_unit"}
    rel |= {"retriever_rl.rl.schedule_steps", "algo.kl_estimator", "algo.dual_beta", "algo.step_scorer"}
    rel |= {"algo.step_scorer_format", "algo.step_eps", "algo.norm_by_std", "algo.gamma"}
    return sorted(keys), rel


def test_every_config_key_is_relevant_or_says_why_not():
    """A key outside every list (a new knob, or a constant turned key and left out) fails here
    until it is placed: in a list (then each seed recipe gives its original's value or a
    deviation) or in NOT_RELEVANT with the reason."""
    keys, rel = all_keys_and_relevant()
    assert unclassified(keys, rel) == []


def test_each_kind_of_planted_change_fails_the_recipe_check(monkeypatch):
    """(1) a default flipped, (2) a code constant turned key, its default changed, (3) a key outside
    today's lists: each is caught, though no recipe file changed."""
    from training.config import DataConfig, PRMConfig
    from training.retriever_config import RetrieverRLConfig

    def problems(path: str) -> list[str]:
        return check(path, train_config([str(ROOT / path)], []))

    sr1, research, prm = SEEDS[0], SEEDS[1], "configs/train/prorag_prm.yaml"
    prorag, harr = "configs/train/prorag/rl.yaml", "configs/train/harr/minilm_search_r1.yaml"
    for path in (sr1, research, prm, prorag, harr):
        assert problems(path) == []
    # (1) DataConfig.shuffle's default (the example that once passed)
    with monkeypatch.context() as m:
        plant_default(m, DataConfig, "shuffle", False)
        assert "data.shuffle = False, the original's is True (no deviation listed)" in problems(sr1)
    # (2) constants that were code: the GRPO epsilon (its registered default, and the key's),
    # ProRAG's step sigma and PRM window, HARR's epsilon and LR schedule, TRL's long-pair filter
    with monkeypatch.context() as m:
        m.setitem(ADVANTAGES._info["grpo"], "eps", 1e-4)
        assert any(p.startswith("algo.adv_eps = 0.0001") for p in problems(research))
    with monkeypatch.context() as m:
        plant_default(m, AlgoConfig, "adv_eps", 1e-4)
        assert any(p.startswith("algo.adv_eps = 0.0001") for p in problems(research))
    for cls, name, value, path in (
        (AlgoConfig, "step_eps", 1e-6, prorag),
        (AlgoConfig, "step_scorer_keep", "last", prorag),
        (AlgoConfig, "step_scorer_append_eos", True, prorag),
        (PRMConfig, "too_long", "left", prm),
        (RetrieverRLConfig, "adv_eps", 1e-6, harr),
        (RetrieverRLConfig, "schedule", "linear", harr),
    ):
        with monkeypatch.context() as m:
            plant_default(m, cls, name, value)
            assert any(f".{name} = " in p for p in problems(path)), (cls.__name__, name)
    # (3) a key no list names and NOT_RELEVANT does not explain
    keys, rel = all_keys_and_relevant()
    assert unclassified([*keys, "algo.new_knob", "rollout.agent.new_cap"], rel) == [
        "algo.new_knob",
        "rollout.agent.new_cap",
    ]
