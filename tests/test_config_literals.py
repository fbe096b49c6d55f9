"""Config choices name what exists, and the registry is the one list of those names.

A key whose registry is light to import is a plain ``str`` checked against the registry when the
recipe loads (``harness.config.require_registered``), so a new name is written once, where it is
registered. A key that stays a ``Literal`` (its registry's module is heavy to import) is compared
with its registry here, found as the ``Registry`` of its kind in its module.
"""

from __future__ import annotations

import importlib
import typing

import pytest

from harness.registry import Registry


def literal(cls: type, field: str) -> set[str]:
    hint = typing.get_type_hints(cls)[field]
    assert typing.get_origin(hint) is typing.Literal, f"{cls.__name__}.{field} is not a Literal"
    return set(typing.get_args(hint))


def registry_in(module: str, kind_word: str) -> Registry | None:
    """The registry in ``module`` whose kind mentions ``kind_word`` (None when there is none yet)."""
    found = [v for v in vars(importlib.import_module(module)).values() if isinstance(v, Registry)]
    found = [r for r in found if kind_word in r.kind]
    assert len(found) <= 1, found
    return found[0] if found else None


def cases():
    from harness.eval_config import BackendConfig, RetrieverConfig
    from training.config import AlgoConfig

    yield "backend.kind", literal(BackendConfig, "kind"), "harness.backends", "backend"
    yield "retriever.kind", literal(RetrieverConfig, "kind"), "harness.retrieval.factory", "retriever"
    yield "algo.kind", literal(AlgoConfig, "kind"), "training.build", "trainer"


@pytest.mark.parametrize(
    ("path", "names", "module", "kind"), list(cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_literal_is_the_registry(path, names, module, kind):
    registry = registry_in(module, kind)
    assert registry is not None, f"{path}: no {kind} registry in {module}"
    assert names == set(registry.names()), f"{path}: Literal {sorted(names)} vs registry {registry.names()}"


# Keys whose names are a registry's, written only there: the config field is a plain ``str``,
# checked against the registry when the recipe loads. (key, its section's class and field, registry)
REGISTERED = [
    ("algo.advantage", "training.algo_config:AlgoConfig", "advantage", "training.advantages:ADVANTAGES"),
    ("algo.loss_agg", "training.algo_config:AlgoConfig", "loss_agg", "training.losses:AGGREGATIONS"),
    ("algo.kl_estimator", "training.algo_config:AlgoConfig", "kl_estimator", "training.losses:KL_ESTIMATORS"),
    (
        "algo.rollout_correction.kind",
        "training.algo_config:RolloutCorrectionConfig",
        "kind",
        "training.losses:ROLLOUT_CORRECTIONS",
    ),
    ("optim.schedule", "training.config:OptimConfig", "schedule", "training.engine:LR_SCHEDULES"),
    ("prm.loss", "training.config:PRMConfig", "loss", "training.prm.prm_loss:PRM_LOSSES"),
    (
        "retriever_rl.rl.loss_agg",
        "training.retriever_config:RetrieverRLConfig",
        "loss_agg",
        "training.losses:AGGREGATIONS",
    ),
    (
        "retriever_rl.rl.schedule",
        "training.retriever_config:RetrieverRLConfig",
        "schedule",
        "training.engine:LR_SCHEDULES",
    ),
    ("retriever_rl.rl.reward", "training.retriever_config:RetrieverRLConfig", "reward", "benchmarks.metrics:METRICS"),
]


@pytest.mark.parametrize(("path", "cls", "field", "target"), REGISTERED, ids=[r[0] for r in REGISTERED])
def test_a_registered_name_is_written_once(path, cls, field, target):
    """No second list: the field is a str, its default is registered, every registered name loads,
    and another name is refused naming the key and the registry's names."""
    from harness.config import ConfigError, compose
    from harness.registry import resolve
    from training.config import TrainConfig

    section, registry = resolve(cls), resolve(target)
    assert typing.get_type_hints(section)[field] is str, f"{path}: a Literal repeats the registry"
    assert getattr(section(), field) in registry
    for name in registry.names():
        compose(TrainConfig, [], [f"{path}={name}"])
    with pytest.raises(ConfigError) as e:
        compose(TrainConfig, [], [f"{path}=not_registered"])
    said = str(e.value)
    assert said.startswith(f"{path}: 'not_registered' is not a registered {registry.kind}")
    assert all(name in said for name in registry.names()), said


def test_sft_source_kinds_are_a_registry():
    from training.sft.sft_data import SFT_SOURCES, SFTDataError, SFTSource

    assert set(SFT_SOURCES.names()) == {"run", "chat", "synth"}
    with pytest.raises(SFTDataError, match="kind must be one of chat, run, synth"):
        SFTSource.from_dict({"kind": "csv", "path": "x"})
