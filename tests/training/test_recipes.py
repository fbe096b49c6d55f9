"""Every shipped training recipe composes into a valid TrainConfig (recipes cannot rot)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.config import ConfigError, compose
from pipelines.methods import validate_options
from pipelines.search_agent import AgentConfig
from training.config import _SAMPLING_KEYS, RolloutAgentConfig, SamplingConfig, TrainConfig
from training.rewards import build_reward
from training.validation import rollout_agent_options

RECIPES = sorted((Path(__file__).resolve().parents[2] / "configs" / "train").glob("*.yaml"))


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_is_valid(path):
    cfg = compose(TrainConfig, [path])
    validate_options(cfg.rollout.method, rollout_agent_options(cfg), where="rollout.agent")
    build_reward(cfg.algo.reward)
    assert cfg.papers, "each recipe names the published settings it follows"


@pytest.mark.parametrize(
    ("key", "use"),
    [
        ("rollout.agent.temperature=0.7", "rollout.sampling.temperature"),
        ("rollout.agent.top_p=0.9", "rollout.sampling.top_p"),
        ("rollout.agent.seed=3", "rollout.sampling.seed"),
        ("rollout.agent.max_new_tokens=64", "rollout.sampling.max_new_tokens"),
        ("rollout.temperature=0.7", "rollout.sampling.temperature"),
        ("rollout.top_p=0.9", "rollout.sampling.top_p"),
    ],
)
def test_an_overridden_sampling_key_is_refused_naming_the_key_to_use(key, use):
    # The rollouts sample with rollout.sampling: the same key elsewhere would be silently overridden.
    with pytest.raises(ConfigError) as e:
        compose(TrainConfig, [RECIPES[0]], [key])
    assert repr(key.split("=")[0]) in str(e.value) and repr(use) in str(e.value)


def test_the_rollout_agent_and_sampling_are_the_agent_configs_keys_and_defaults():
    # rollout.agent + rollout.sampling's per-turn tokens = AgentConfig, key for key, default for
    # default, so no agent option is lost.
    agent = {f.name: f.default for f in dataclasses.fields(AgentConfig) if f.name not in _SAMPLING_KEYS}
    assert {f.name: f.default for f in dataclasses.fields(RolloutAgentConfig)} == agent
    assert SamplingConfig.max_new_tokens == AgentConfig.max_new_tokens
    agent_keys = {f.name for f in dataclasses.fields(AgentConfig)}
    assert set(RolloutAgentConfig.MOVED_KEYS) == set(_SAMPLING_KEYS) <= agent_keys


def test_the_agent_is_built_with_the_sampling_the_trainer_uses(tmp_path):
    cfg = compose(TrainConfig, [RECIPES[0]], ["rollout.sampling={temperature: 0.7, top_p: 0.9, max_new_tokens: 33}"])
    built = validate_options(cfg.rollout.method, rollout_agent_options(cfg))
    assert (built.temperature, built.top_p, built.max_new_tokens, built.mode) == (0.7, 0.9, 33, "train")
    # validation: greedy, in the dialect's default mode, with the rollouts' turn length
    val = rollout_agent_options(cfg, validation=True)
    assert (val["temperature"], val["mode"], val["max_new_tokens"], "top_p" in val) == (0.0, None, 33, False)
    explicit = compose(TrainConfig, [RECIPES[0]], ["rollout.agent.mode=eval"])
    assert rollout_agent_options(explicit)["mode"] == rollout_agent_options(explicit, validation=True)["mode"] == "eval"
    assert cfg.rollout_seed == cfg.trainer.seed
    assert compose(TrainConfig, [RECIPES[0]], ["rollout.sampling.seed=7"]).rollout_seed == 7
    with pytest.raises(ConfigError, match="rollout.sampling.top_p"):
        compose(TrainConfig, [RECIPES[0]], ["rollout.sampling.top_p=0"])


def test_there_is_a_cpu_recipe_and_gpu_recipes():
    names = {p.stem for p in RECIPES}
    assert "smollm2_cpu_grpo" in names and len(names) >= 6


# ---- dry runs: every recipe's data config, model config and reward on tiny stand-ins ------------
TINY_MODEL = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def _datasets(cfg: TrainConfig) -> list[str]:
    return [cfg.data.dataset] if isinstance(cfg.data.dataset, str) else list(cfg.data.dataset)


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_recipe_dry_run_on_tiny_stand_ins(path):
    """Data: every dataset and split is registered, a merged set has a shared-corpus retriever;
    model: the recipe's model config (LoRA, checkpointing, attention) on a tiny Llama, critic for
    GAE, with parameter names and output shapes checked; the update schedule divides; the reward
    scores a trajectory in the recipe's dialect."""
    import torch

    from benchmarks.datasets import get_spec
    from harness.types import Trajectory
    from pipelines.dialects import get_dialect
    from training.advantages import ADVANTAGES
    from training.engine import ValueHead, build_model
    from training.examples import merged_corpus_dataset
    from training.lora import apply_lora, lora_critic, merged_state_dict

    cfg = compose(TrainConfig, [path])
    # data
    for name in _datasets(cfg):
        spec = get_spec(name)
        assert cfg.data.split in spec.all_splits, (name, cfg.data.split, spec.all_splits)
    merged_corpus_dataset(cfg)  # a merged set without a shared corpus raises
    # model, on a tiny stand-in with the recipe's options
    model_cfg = replace(cfg.model, tiny=TINY_MODEL, dtype="float32")
    base = build_model(model_cfg, vocab_size=64)
    names = set(base.state_dict())
    assert base.config._attn_implementation == cfg.model.attn_implementation
    model = apply_lora(base, cfg.model.lora) if cfg.model.lora else base
    ids = torch.randint(0, 64, (2, 5))
    assert model(input_ids=ids).logits.shape == (2, 5, 64)
    if cfg.model.lora:
        trainable = [k for k, p in model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in k for k in trainable)
        assert set(merged_state_dict(model)) == names  # what weight sync pushes: the base's names
    if ADVANTAGES.info(cfg.algo.advantage).get("needs_critic"):
        critic = ValueHead(build_model(model_cfg, vocab_size=64))
        if cfg.model.lora:
            critic = lora_critic(critic, cfg.model.lora)
        assert critic(ids, torch.ones_like(ids)).shape == (2, 5)
    # the update schedule: some world size splits the step's batch into whole mini-batches
    assert any(_divides(cfg, w) for w in (1, 2, 4, 8)), "no rank count fits ppo_mini_batch_size"
    # reward, on a trajectory in the recipe's dialect
    get_dialect(cfg.rollout.method)
    traj = Trajectory(
        example_id="q",
        question="q",
        answers=["Paris"],
        method=cfg.rollout.method,
        response_text="no tags at all",
        finish_reason="answer",
        metadata={"dialect": cfg.rollout.method},
    )
    r, parts = build_reward(cfg.algo.reward)(traj)
    assert isinstance(r, float) and isinstance(parts, dict)


def _divides(cfg: TrainConfig, world: int) -> bool:
    from training.config import mini_batch_rows

    try:
        mini_batch_rows(cfg, world)
    except ValueError:
        return False
    return cfg.rollout.prompts_per_step % world == 0


def test_r1_searcher_stage2_starts_from_stage1():
    root = RECIPES[0].parent
    s1 = compose(TrainConfig, [root / "r1_searcher_reinforce_pp_stage1.yaml"])
    s2 = compose(TrainConfig, [root / "r1_searcher_reinforce_pp_stage2.yaml"])
    assert s2.model.path == f"{s1.trainer.out}/final"


def test_papers_settings_in_the_recipes():
    root = RECIPES[0].parent
    sr1 = compose(TrainConfig, [root / "search_r1_ppo_qwen2.5_3b.yaml"])
    assert list(sr1.data.dataset) == ["nq", "hotpotqa"]
    assert (sr1.rollout.prompts_per_step, sr1.algo.ppo_mini_batch_size, sr1.trainer.max_steps) == (512, 256, 1005)
    pro = compose(TrainConfig, [root / "prorag_dual_granularity.yaml"])
    assert pro.rollout.method == "prorag" and pro.algo.reward == "prorag" and pro.optim.lr == 1e-5
    assert pro.model.lora is not None and (pro.model.lora.r, pro.model.lora.alpha) == (16, 32)
    cpu = compose(TrainConfig, [root / "smollm2_cpu_grpo.yaml"])
    rows = cpu.rollout.prompts_per_step * cpu.rollout.n_samples
    assert cpu.algo.ppo_epochs * rows // (cpu.algo.ppo_mini_batch_size or rows) >= 2  # ≥ 2 updates per batch


def test_merged_dataset_loads_both_with_prefixed_ids():
    from benchmarks.datasets import load_examples, load_merged_examples

    one = load_examples("demo", "test", limit=3)
    both = load_merged_examples(["demo", "demo"], "test", limit=3)
    assert len(both) == 2 * len(one)
    assert [e.id for e in both[:3]] == [f"demo/{e.id}" for e in one]
    assert all(e.metadata["dataset"] == "demo" for e in both)
    with pytest.raises(ValueError, match="empty"):
        load_merged_examples([], "test")


def test_r1_searcher_training_layout_reads(tmp_path):
    """R1-Searcher's data/training_set/stage_1.jsonl layout (idx, question, answer, extra keys)."""
    from benchmarks.datasets import load_examples

    folder = tmp_path / "r1searcher_training_set"
    folder.mkdir()
    rows = [
        {
            "idx": 37653,
            "question": "Which Route 22 runs through a major city?",
            "answer": "U.S. Route 22",
            "pred_anses": [],
        },
        {"idx": 37664, "question": "Who directed it?", "answer": "Someone", "pred_anses": [""]},
    ]
    (folder / "stage_1.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    ex = load_examples("r1searcher_train", "stage_1", data_dir=tmp_path)
    assert [(e.id, e.answers) for e in ex] == [("37653", ("U.S. Route 22",)), ("37664", ("Someone",))]
