"""Every seed system's record (``pipelines/dialects/<name>.py``) against the rooms it names by
string: its metric profile, its reward, its shipped config files, its agent method, its dialect
and golden rendering (docs/adding_a_system.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.profiles import PROFILES
from harness.config import read_yaml
from pipelines.dialects import DIALECTS, FLASHRAG_DIFFERENCES, SYSTEMS, System, get_dialect, synth_turns
from pipelines.methods import AGENT_METHODS, CHAT_API_METHOD, METHODS, method_kind
from training.rewards import REWARDS

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
NAMES = SYSTEMS.names()


def test_there_are_the_seed_systems_and_each_is_an_agent_method():
    assert {"research", "search_r1", "r1_searcher", "rag_r1", "prorag", "harr"} <= set(NAMES)
    assert set(AGENT_METHODS) == set(NAMES)
    # and the tool_call agent's second path, through a chat server (not a system of its own)
    assert {n for n in METHODS.names() if method_kind(n) == "agent"} == {*NAMES, CHAT_API_METHOD}
    assert set(FLASHRAG_DIFFERENCES) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_record_names_what_resolves(name):
    s = SYSTEMS.get(name)
    assert isinstance(s, System) and s.name == name
    assert s.profile in PROFILES, f"{name}: metric profile {s.profile!r} is not in benchmarks.profiles.PROFILES"
    assert s.reward is None or s.reward in REWARDS, f"{name}: reward {s.reward!r} is not in training.rewards.REWARDS"
    assert get_dialect(name).name == name and name in DIALECTS
    assert get_dialect(name).options["flashrag_differences"] == s.flashrag_differences
    assert s.flashrag_differences, f"{name}: say what FlashRAG's port does differently (or that it has none)"
    assert synth_turns(name) is s.turns
    assert (GOLDEN / f"{name}.yaml").is_file(), f"{name}: tests/pipelines/golden/{name}.yaml (test_protocols.py)"


@pytest.mark.parametrize("name", NAMES)
def test_its_config_files_exist_and_parse(name):
    s = SYSTEMS.get(name)
    for required in (f"configs/dialects/{name}.yaml", f"configs/methods/{name}.yaml", f"configs/replicate/{name}.yaml"):
        assert required in s.configs, f"{name}: the record lists no {required}"
    assert len(set(s.configs)) == len(s.configs)
    for rel in s.configs:
        path = REPO / rel
        assert path.is_file(), f"{name}: {rel} does not exist"
        assert isinstance(read_yaml(path), dict), f"{name}: {rel} is not a YAML mapping"


def test_every_config_named_after_a_system_is_in_its_record():
    """A config file whose name starts with a system's, or that lies in a folder named after it,
    is that system's: the record lists it (so a new recipe is not forgotten there)."""
    claimed = {rel: n for n in NAMES for rel in SYSTEMS.get(n).configs}
    missing = []
    for path in sorted((REPO / "configs").rglob("*.yaml")):
        rel = path.relative_to(REPO).as_posix()
        owners = [n for n in NAMES if path.stem.startswith(n) or n in path.relative_to(REPO).parts[:-1]]
        for n in owners:
            if claimed.get(rel) != n:
                missing.append(f"{rel} (named after {n})")
    assert not missing, "config files not in their system's record:\n" + "\n".join(missing)
