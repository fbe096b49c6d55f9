"""Config ``Literal``s name what exists: each is the registry's names, or (a choice that is still a
function of a name) exactly the names that function accepts.

Each choice is found as the ``Registry`` of its kind in its module and compared with it; the
defaults must be registered names too.
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
    from training.config import AlgoConfig, OptimConfig, PRMConfig, RolloutCorrectionConfig

    yield "backend.kind", literal(BackendConfig, "kind"), "harness.backends", "backend"
    yield "retriever.kind", literal(RetrieverConfig, "kind"), "harness.retrieval.factory", "retriever"
    yield "algo.kind", literal(AlgoConfig, "kind"), "training.build", "trainer"
    yield "algo.advantage", literal(AlgoConfig, "advantage"), "training.advantages", "advantage"
    yield "algo.loss_agg", literal(AlgoConfig, "loss_agg"), "training.losses", "aggregation"
    yield "algo.kl_estimator", literal(AlgoConfig, "kl_estimator"), "training.losses", "KL"
    yield "prm.loss", literal(PRMConfig, "loss"), "training.prm", "PRM loss"
    rc_kind = literal(RolloutCorrectionConfig, "kind")
    yield "algo.rollout_correction.kind", rc_kind, "training.losses", "rollout correction"
    yield "optim.schedule", literal(OptimConfig, "schedule"), "training.engine", "LR schedule"


@pytest.mark.parametrize(
    ("path", "names", "module", "kind"), list(cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_literal_is_the_registry(path, names, module, kind):
    registry = registry_in(module, kind)
    assert registry is not None, f"{path}: no {kind} registry in {module}"
    assert names == set(registry.names()), f"{path}: Literal {sorted(names)} vs registry {registry.names()}"


def test_defaults_are_registered():
    from training.advantages import ADVANTAGES
    from training.config import AlgoConfig, OptimConfig
    from training.engine import LR_SCHEDULES
    from training.losses import AGGREGATIONS, KL_ESTIMATORS, ROLLOUT_CORRECTIONS

    algo = AlgoConfig()
    assert algo.advantage in ADVANTAGES and algo.loss_agg in AGGREGATIONS and algo.kl_estimator in KL_ESTIMATORS
    assert algo.rollout_correction.kind in ROLLOUT_CORRECTIONS and OptimConfig().schedule in LR_SCHEDULES


def test_retriever_rl_reward_is_a_metric():
    from benchmarks.metrics import METRICS
    from training.retriever_config import RetrieverRLConfig

    assert literal(RetrieverRLConfig, "reward") <= set(METRICS.names())


def test_sft_source_kinds_are_a_registry():
    from training.sft_data import SFT_SOURCES, SFTDataError, SFTSource

    assert set(SFT_SOURCES.names()) == {"run", "chat", "synth"}
    with pytest.raises(SFTDataError, match="kind must be one of chat, run, synth"):
        SFTSource.from_dict({"kind": "csv", "path": "x"})
