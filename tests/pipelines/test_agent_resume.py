"""Resuming THE agent loop from a prefix of segments (what MCTS needs): one step at a time, or to
the end, gives exactly the trajectory of an uninterrupted run."""

from __future__ import annotations

import asyncio

import pytest

from harness.backends.scripted import ScriptedBackend
from pipelines.search_agent import AgentConfig, SearchAgent
from tests.pipelines.test_search_agent import SCRIPTS, Q


def agent_for(dialect, retriever, **cfg):
    backend = ScriptedBackend([{"match": "glass harp-clock", "turns": SCRIPTS[dialect]}])
    cfg.setdefault("max_total_tokens", 8192)
    return SearchAgent(backend, retriever, dialect, AgentConfig(**cfg))


def same(a, b) -> None:
    """Two trajectories agree on everything the loop decides (not on wall-clock timings)."""
    assert [(s.role, s.token_ids, s.text) for s in a.segments] == [(s.role, s.token_ids, s.text) for s in b.segments]
    assert [(r.turn, r.query, r.doc_ids) for r in a.searches] == [(r.turn, r.query, r.doc_ids) for r in b.searches]
    for f in ("finish_reason", "prediction", "response_text", "n_turns", "generated_tokens", "observation_tokens"):
        assert getattr(a, f) == getattr(b, f), f
    assert a.prompt_tokens == b.prompt_tokens


@pytest.mark.parametrize("dialect", ["research", "prorag", "search_r1"])
def test_one_step_at_a_time_equals_one_run(dialect, toy_retriever):
    agent = agent_for(dialect, toy_retriever, max_turns=5)
    full = asyncio.run(agent.arun(Q))
    assert full.finish_reason == "answer"
    traj, n_steps = None, 0
    while traj is None or traj.finish_reason == "paused":
        before = len(traj.segments) if traj else 0
        traj = asyncio.run(agent.arun(Q, prefix=traj, max_steps=1))
        n_steps += 1
        new = [s.role for s in traj.segments[before:]]
        # one step: one model turn plus its observation (the prompt comes with the first)
        assert new[new.count("prompt") :] in (["model", "observation"], ["model"])
        assert (traj.finish_reason == "paused") == (new[-1] == "observation")
    assert n_steps == full.n_turns
    same(traj, full)


def test_resume_to_the_end_from_a_prefix(toy_retriever):
    agent = agent_for("research", toy_retriever, max_turns=4)
    full = asyncio.run(agent.arun(Q))
    two = asyncio.run(agent.arun(Q, max_steps=2))
    assert two.finish_reason == "paused" and two.n_turns == 2 and len(two.searches) == 2
    snapshot = [list(s.token_ids) for s in two.segments]
    rest = asyncio.run(agent.arun(Q, prefix=two))
    same(rest, full)
    assert [s.token_ids for s in two.segments] == snapshot  # the prefix is not modified
    # The turn limit counts the prefix's search turns: resumed with max_turns=2 it must stop
    # searching and take the final no-search turn, as an uninterrupted max_turns=2 run does.
    short = agent_for("research", toy_retriever, max_turns=2)
    same(asyncio.run(short.arun(Q, prefix=two)), asyncio.run(short.arun(Q)))


def test_resume_refuses_a_finished_or_foreign_prefix(toy_retriever):
    agent = agent_for("research", toy_retriever)
    full = asyncio.run(agent.arun(Q))
    with pytest.raises(ValueError, match="paused"):
        asyncio.run(agent.arun(Q, prefix=full))
    other = type(Q)("q2", "another", ("x",))
    with pytest.raises(ValueError, match="belongs to example"):
        asyncio.run(agent.arun(other, prefix=asyncio.run(agent.arun(Q, max_steps=1))))
    with pytest.raises(ValueError, match="max_steps"):
        asyncio.run(agent.arun(Q, max_steps=0))
