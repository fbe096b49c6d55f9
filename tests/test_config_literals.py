"""Config ``Literal``s name what exists: each is the registry's names, or (a choice that is still a
function of a name) exactly the names that function accepts.

Written generally: a choice found as a ``Registry`` in its module is compared with the registry;
until then (loss aggregation and the KL estimator are functions taking a name), every listed name
must be accepted and an unlisted one refused.
"""

from __future__ import annotations

import importlib
import typing

import pytest
import torch

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
    from training.config import AlgoConfig, PRMConfig

    yield "backend.kind", literal(BackendConfig, "kind"), "harness.backends", "backend"
    yield "retriever.kind", literal(RetrieverConfig, "kind"), "harness.retrieval.factory", "retriever"
    yield "algo.kind", literal(AlgoConfig, "kind"), "training.build", "trainer"
    yield "algo.advantage", literal(AlgoConfig, "advantage"), "training.advantages", "advantage"
    yield "prm.loss", literal(PRMConfig, "loss"), "training.prm", "PRM loss"


@pytest.mark.parametrize(
    ("path", "names", "module", "kind"), list(cases()), ids=lambda x: x if isinstance(x, str) else ""
)
def test_literal_is_the_registry(path, names, module, kind):
    registry = registry_in(module, kind)
    assert registry is not None, f"{path}: no {kind} registry in {module}"
    assert names == set(registry.names()), f"{path}: Literal {sorted(names)} vs registry {registry.names()}"


def test_aggregation_and_kl_literals_match_what_exists():
    from training import losses
    from training.config import AlgoConfig

    loss, mask = torch.ones(2, 3), torch.ones(2, 3)
    for field, word, call in (
        ("loss_agg", "aggregation", lambda name: losses.aggregate(loss, mask, name, global_tokens=6)),
        ("kl_estimator", "KL", lambda name: losses.kl_penalty(torch.zeros(2), torch.ones(2), name)),
    ):
        names = literal(AlgoConfig, field)
        registry = registry_in("training.losses", word)
        if registry is not None:
            assert names == set(registry.names()), field
            continue
        for name in names:
            call(name)  # every listed name is implemented
        with pytest.raises((ValueError, KeyError)):
            call("no_such_choice")  # and the function refuses others


def test_retriever_rl_reward_is_a_metric():
    from benchmarks.metrics import METRICS
    from training.retriever_config import RetrieverRLConfig

    assert literal(RetrieverRLConfig, "reward") <= set(METRICS.names())


def test_sft_source_kinds_are_a_registry():
    from training.sft_data import SFT_SOURCES, SFTDataError, SFTSource

    assert set(SFT_SOURCES.names()) == {"run", "chat", "synth"}
    with pytest.raises(SFTDataError, match="kind must be one of chat, run, synth"):
        SFTSource.from_dict({"kind": "csv", "path": "x"})
