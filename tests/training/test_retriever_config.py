"""The ``retriever_rl`` section of a recipe (``training.retriever_config``): what loads, and that a
bad value is refused when the recipe loads with an error naming the full key and what it accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.metrics import METRICS
from harness.config import ConfigError, compose
from training.config import TrainConfig
from training.engine import LR_SCHEDULES
from training.losses import AGGREGATIONS
from training.retriever_config import RetrieverRLConfig, RetrieverTrainConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs" / "train").glob("**/*.yaml"))


def load(*overrides: str) -> TrainConfig:
    return compose(TrainConfig, [], ["algo.kind=retriever", *overrides])


def test_the_defaults_load():
    cfg = load()
    assert cfg.retriever_rl == RetrieverTrainConfig()
    rl = cfg.retriever_rl.rl
    assert rl.loss_agg in AGGREGATIONS and rl.schedule in LR_SCHEDULES and rl.reward in METRICS


def test_the_shipped_retriever_recipes_load():
    shipped = [f for f in RECIPES if "kind: retriever" in f.read_text(encoding="utf-8")]
    assert shipped, "no retriever recipe under configs/train"
    for f in shipped:
        cfg = compose(TrainConfig, [f])
        assert cfg.algo.kind == "retriever" and isinstance(cfg.retriever_rl.rl, RetrieverRLConfig), f


@pytest.mark.parametrize(
    ("key", "registry"),
    [("loss_agg", AGGREGATIONS), ("schedule", LR_SCHEDULES), ("reward", METRICS)],
)
def test_a_name_outside_its_registry_is_refused_naming_the_key_and_the_names(key, registry):
    for name in registry.names():  # every registered name loads: the registry is the one list
        assert getattr(load(f"retriever_rl.rl.{key}={name}").retriever_rl.rl, key) == name
    with pytest.raises(ConfigError) as e:
        load(f"retriever_rl.rl.{key}=bogus")
    said = str(e.value)
    assert said.startswith(f"retriever_rl.rl.{key}: 'bogus' is not a registered {registry.kind}; one of ")
    assert all(name in said for name in registry.names()), said


def test_a_near_miss_gets_a_did_you_mean():
    with pytest.raises(ConfigError, match=r"retriever_rl.rl.loss_agg: 'token_man' .* did you mean 'token_mean'\?"):
        load("retriever_rl.rl.loss_agg=token_man")


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("retriever_rl.rl.algo=dpo", "retriever_rl.rl.algo: 'dpo' is not one of 'grpo', 'ppo'"),
        ("retriever_rl.rl.group_size=0", "retriever_rl.rl.group_size must be at least 1, got 0"),
        ("retriever_rl.rl.gamma=2", r"retriever_rl.rl.gamma must be in \[0, 1\], got 2.0"),
        ("retriever_rl.rl.sync_timeout=0", "retriever_rl.rl.sync_timeout must be greater than 0"),
        ("retriever_rl.encoder.lora_dropout=1.5", r"retriever_rl.encoder.lora_dropout must be in \[0, 1\]"),
        ("retriever_rl.sampling.tau=0", "retriever_rl.sampling.tau must be greater than 0"),
        ("retriever_rl.rl.los_agg=token_mean", "unknown config key 'retriever_rl.rl.los_agg'; did you mean"),
    ],
)
def test_a_bad_value_names_its_key(override, error):
    with pytest.raises(ConfigError, match=error):
        load(override)
