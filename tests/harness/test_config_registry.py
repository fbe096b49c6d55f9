"""Config composition/validation and the registry."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import pytest

from harness.config import ConfigError, compose, from_dict, parse_overrides, to_dict
from harness.eval_config import EvalConfig
from harness.registry import Registry, RegistryError


@dataclass(frozen=True)
class Inner:
    k: int = 3
    name: str = "x"


@dataclass(frozen=True)
class Outer:
    inner: Inner = field(default_factory=Inner)
    rate: float = 0.1
    flag: bool = False
    tags: list[str] = field(default_factory=list)
    maybe: int | None = None


def test_overrides_parse_yaml_scalars_into_nested_paths():
    assert parse_overrides(["inner.k=5", "rate=1e-3", "flag=true", "tags=[a, b]", "inner.name=hi"]) == {
        "inner": {"k": 5, "name": "hi"},
        "rate": 1e-3,
        "flag": True,
        "tags": ["a", "b"],
    }
    with pytest.raises(ConfigError, match="key.path=value"):
        parse_overrides(["novalue"])


def test_from_dict_types_and_unknown_keys():
    cfg = from_dict(Outer, {"inner": {"k": 7}, "rate": 2, "tags": "a,b", "maybe": None})
    assert cfg == Outer(inner=Inner(k=7), rate=2.0, tags=["a", "b"])
    with pytest.raises(ConfigError, match=r"unknown config key 'inner.kk'; did you mean 'inner.k'\?"):
        from_dict(Outer, {"inner": {"kk": 1}})
    with pytest.raises(ConfigError, match="inner.k: expected an integer"):
        from_dict(Outer, {"inner": {"k": "three"}})
    with pytest.raises(ConfigError, match="flag: expected true/false"):
        from_dict(Outer, {"flag": "yes please"})


def test_compose_files_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("inner:\n  k: 4\nrate: 0.5\n")
    cfg = compose(Outer, [f], ["inner.k=9"])
    assert cfg.inner.k == 9 and cfg.rate == 0.5
    assert to_dict(cfg)["inner"] == {"k": 9, "name": "x"}
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        compose(Outer, [bad])
    with pytest.raises(ConfigError, match="does not exist"):
        compose(Outer, [tmp_path / "missing.yaml"])


def test_eval_config_literal_is_checked():
    with pytest.raises(ConfigError, match="backend.kind: 'vllm' is not one of"):
        from_dict(EvalConfig, {"backend": {"kind": "vllm"}})
    cfg = from_dict(EvalConfig, {"agent": {"max_turns": 2}, "backend": {"url": ["http://a", "http://b"]}})
    assert cfg.agent == {"max_turns": 2} and cfg.backend.url == ["http://a", "http://b"]


def test_registry_lazy_targets_and_did_you_mean():
    reg: Registry = Registry("thing")
    reg.register("json_loads", "json:loads", cheap=True)

    @reg.register("double")
    def double(x):
        return 2 * x

    import json

    assert reg.get("json_loads") is json.loads
    assert reg.get("double")(2) == 4
    assert reg.info("json_loads") == {"cheap": True}
    assert reg.names() == ["double", "json_loads"]
    with pytest.raises(RegistryError, match="did you mean 'double'"):
        reg.get("doubel")
    with pytest.raises(RegistryError, match="already registered"):
        reg.register("double", double)


@dataclass(frozen=True)
class _Moved:
    MOVED_KEYS: ClassVar[dict[str, str]] = {"temperature": "outer.sampling.temperature"}
    turns: int = 1


@dataclass(frozen=True)
class _Holder:
    inner: _Moved = field(default_factory=_Moved)


def test_a_moved_key_is_refused_naming_its_successor():
    assert from_dict(_Holder, {"inner": {"turns": 2}}).inner.turns == 2
    with pytest.raises(ConfigError, match="'outer.inner.temperature' is not read here .* 'outer.sampling.temperature'"):
        from_dict(_Holder, {"inner": {"temperature": 0.7}}, where="outer")
    assert "MOVED_KEYS" not in to_dict(_Holder())["inner"]  # a class variable, not a key
