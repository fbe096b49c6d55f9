"""Every shipped eval config composes into a valid EvalConfig (so configs cannot rot)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.config import compose
from harness.eval_config import EvalConfig

ROOT = Path(__file__).resolve().parents[2]
EVAL_CONFIGS = sorted(
    p for sub in ("methods", "backends", "retrievers") for p in (ROOT / "configs" / sub).glob("*.yaml")
)


@pytest.mark.parametrize("path", EVAL_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_composes(path):
    cfg = compose(EvalConfig, [path])
    assert isinstance(cfg, EvalConfig)


def test_agent_options_in_method_configs_are_valid_agent_keys():
    from harness.config import from_dict
    from pipelines.search_agent import AgentConfig

    for path in (ROOT / "configs" / "methods").glob("*.yaml"):
        cfg = compose(EvalConfig, [path])
        from_dict(AgentConfig, cfg.agent, where="agent")


def test_pop_paths_removes_the_dotted_keys_present_and_returns_them():
    from harness.config import pop_paths

    d = {"optim": {"threads": 2, "lr": 1e-5}, "trainer": {"out": "x"}, "seed": 0}
    popped = pop_paths(d, ["optim.threads", "trainer.progress", "missing.key", "seed"])
    assert popped == {"optim.threads": 2, "seed": 0}
    assert d == {"optim": {"lr": 1e-5}, "trainer": {"out": "x"}}
