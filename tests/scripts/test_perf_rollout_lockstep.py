"""scripts/perf/rollout_lockstep.py on the tiny recipe: both modes run, lockstep reproduces its tokens."""

from __future__ import annotations

import sys

from benchmarks.tiny_recipes import grpo_recipe
from harness.backends.lockstep import lockstep_of
from scripts.perf import rollout_lockstep


def test_both_modes_run_and_lockstep_draws_the_same_tokens(tmp_path, monkeypatch, capsys):
    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(grpo_recipe("tiny", "rollout.agent.max_turns=2", "rollout.sampling.max_new_tokens=16"))
    argv = ["rollout_lockstep.py", "-c", str(recipe), "--rounds", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    rollout_lockstep.main()
    lines = capsys.readouterr().out.splitlines()
    modes = [line.split()[0] for line in lines if line.split() and line.split()[0] in ("lockstep", "free")]
    assert modes == ["lockstep", "free", "free", "lockstep"]
    assert all("4/4 rollouts as this mode's first run" in line for line in lines if line.startswith("lockstep"))
    assert rollout_lockstep.rollout.lockstep_of is lockstep_of  # put back
