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
from training.advantages import ADVANTAGES
from training.build import rollout_agent_options, train_config
from training.config import AlgoConfig, TrainConfig
from training.retriever_rl import rollout_options

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
    "max_query_doc_tokens", "chat", "few_shot", "response_prefix", "final_turn", "mode", "variant", "template",
]  # fmt: skip
RL = [
    "data.dataset", "data.split", "data.file", "rollout.prompts_per_step", "rollout.n_samples",
    "rollout.sampling.temperature", "rollout.sampling.top_p", "rollout.sampling.max_new_tokens",
    "retriever.topk", "algo.advantage", "algo.reward", "algo.loss_agg",
    "algo.clip_low", "algo.clip_high", "algo.kl_coef", "algo.kl_in_reward", "algo.entropy_coef", "algo.ppo_epochs",
    "algo.ppo_mini_batch_size", "algo.filter_groups", "algo.shuffle_rows", "algo.max_len",
    *(f"rollout.agent.{k}" for k in AGENT),
]  # fmt: skip
CRITIC = [
    "algo.gamma", "algo.lam", "algo.whiten_advantages", "algo.gae_over", "algo.vf_coef", "algo.vf_clip",
    "algo.critic_warmup",
    "optim.critic_lr", "optim.critic_warmup_steps",
]  # fmt: skip
SFT = ["sft.sources", "sft.batch_size", "sft.shuffle", "sft.tag_weights", "algo.max_len"]
PRM = ["prm.data", "prm.loss", "prm.batch_size", "prm.val_fraction", "prm.append_eos", "prm.max_len"]
RETRIEVER = [
    "data.dataset", "data.split", "data.file", "retriever_rl.method", "retriever_rl.backend.model",
    "retriever_rl.encoder.name", "retriever_rl.encoder.lora_r", "retriever_rl.encoder.max_length",
    *(f"retriever_rl.sampling.{k}" for k in
      ("n_candidates", "tau", "topk", "stateful", "template", "max_history", "max_titles", "max_chars")),
    *(f"retriever_rl.rl.{k}" for k in
      ("algo", "group_size", "questions_per_step", "steps", "epochs", "lr", "weight_decay", "clip_eps", "kl_coef",
       "kl_in_reward", "reward", "loss_agg", "grad_clip")),
    *(f"retriever_rl.agent.{k}" for k in (*AGENT, "max_new_tokens", "temperature", "top_p")),
]  # fmt: skip
PPO_KEYS = ("gamma", "lam", "whiten_advantages", "vf_coef", "vf_clip", "value_lr")
RETRIEVER_PPO = [f"retriever_rl.rl.{k}" for k in PPO_KEYS]
RETRIEVER_GRPO = ["retriever_rl.rl.norm_by_std"]
LORA = [f"retriever_rl.encoder.{k}" for k in ("lora_alpha", "lora_dropout", "lora_targets")]


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
    if kind == "rl":
        keys += RL
        info = ADVANTAGES.info(a.advantage)
        keys += CRITIC if info.get("needs_critic") else []
        keys += ["algo.gamma"] if a.advantage in ("group_norm", "reinforce_pp") else []
        keys += ["algo.norm_by_std"] if a.advantage == "grpo" else []
        if info.get("needs_step_scores"):
            keys += ["algo.dual_beta", "algo.step_scorer", "algo.step_scorer_format"]
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
        keys += RETRIEVER + (RETRIEVER_PPO if r.rl.algo == "ppo" else RETRIEVER_GRPO)
        keys += LORA if r.encoder.lora_r > 0 else []
    return keys  # a section (model.lora, sft.tag_weights) is one key, compared as a whole


def _has(eff: dict[str, Any], key: str) -> bool:
    try:
        lookup(eff, key)
    except KeyError:
        return False
    return True


def check(path: str, cfg: TrainConfig) -> list[str]:
    """Every problem of the recipe at ``path`` against its source block (empty: it matches)."""
    problems: list[str] = []
    src = cfg.source
    if not (src.repository and src.file and len(src.commit) == 40):
        problems.append("source needs repository, file, commit")
    eff = effective(cfg)
    deviations = {d.key: d.reason for d in cfg.deviations}
    if len(deviations) != len(cfg.deviations):
        problems.append("a key is listed twice under deviations")
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
