"""Config choices that name registered functions list exactly the registry's names (ARCHITECTURE:
config ``Literal``s come from, or are checked against, the registries)."""

from __future__ import annotations

import typing

import pytest

from training.advantages import ADVANTAGES
from training.config import AlgoConfig
from training.losses import AGGREGATIONS, KL_ESTIMATORS

# (config class, field, registry): every Literal that selects a registered function.
CHOICES = [
    (AlgoConfig, "advantage", ADVANTAGES),
    (AlgoConfig, "loss_agg", AGGREGATIONS),
    (AlgoConfig, "kl_estimator", KL_ESTIMATORS),
]


@pytest.mark.parametrize("cls, name, registry", CHOICES, ids=[f"{c.__name__}.{n}" for c, n, _ in CHOICES])
def test_literal_is_the_registry(cls, name, registry):
    hint = typing.get_type_hints(cls)[name]
    assert typing.get_origin(hint) is typing.Literal, f"{cls.__name__}.{name} is not a Literal"
    assert sorted(typing.get_args(hint)) == registry.names(), f"{cls.__name__}.{name} vs the {registry.kind} registry"
    assert getattr(cls(), name) in registry  # the default is registered too
