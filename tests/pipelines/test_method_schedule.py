"""The shared ``Method.arun_examples``: the turn-synchronous schedule (waves of the concurrency,
a barrier between turns) gives, under greedy decoding, exactly the per-question schedule's
trajectories; only the order in which turns run differs."""

from __future__ import annotations

import asyncio

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.types import Example
from pipelines.baselines.flashrag_methods import FlashRAGBaseline
from pipelines.method import Method
from pipelines.methods import build_method
from pipelines.search_agent import AgentConfig, SearchAgent
from tests.pipelines.test_agent_resume import same
from tests.pipelines.test_baselines import tiny_model_dir  # noqa: F401  (a fixture)
from tests.pipelines.test_search_agent import SCRIPTS, Q

SHORT = "Name the glass harp-clock's maker in one word."


def agent(retriever, **cfg) -> SearchAgent:
    script = SCRIPTS["research"]
    backend = ScriptedBackend(
        [
            {"match": SHORT, "turns": script[-1:]},  # answers at once: 1 turn
            {"match": "glass harp-clock", "turns": script},  # 4 turns
        ]
    )
    return SearchAgent(backend, retriever, "research", AgentConfig(max_total_tokens=8192, **cfg))


def examples() -> list[Example]:
    short = [Example(f"s{i}", SHORT, ("Lunne",)) for i in range(3)]
    long = [Example(f"l{i}", Q.question, Q.answers) for i in range(4)]
    return [short[0], long[0], long[1], short[1], long[2], short[2], long[3]]


def test_sync_schedule_equals_per_question(toy_retriever):
    a = agent(toy_retriever, max_concurrency=3)
    assert isinstance(a, Method)
    done_async: list[str] = []
    done_sync: list[str] = []
    per_q = a.run_examples(examples(), on_done=lambda t: done_async.append(t.example_id))
    sync = a.run_examples(examples(), on_done=lambda t: done_sync.append(t.example_id), schedule="sync")
    assert [t.example_id for t in sync] == [e.id for e in examples()]
    assert sorted(done_sync) == sorted(done_async) == sorted(e.id for e in examples())
    assert {t.n_turns for t in sync} == {1, 4}
    for x, y in zip(per_q, sync, strict=True):
        same(x, y)


def test_sync_schedule_releases_turn_k_after_the_wave_finished_turn_k_minus_1(toy_retriever, monkeypatch):
    a = agent(toy_retriever, max_concurrency=3)
    calls: list[tuple[str, int]] = []  # (example id, turns already done) at each step's start
    inner = SearchAgent.arun

    async def spy(self, example, *args, prefix=None, **kw):
        calls.append((example.id, prefix.n_turns if prefix else 0))
        return await inner(self, example, *args, prefix=prefix, **kw)

    monkeypatch.setattr(SearchAgent, "arun", spy)
    asyncio.run(a.arun_examples(examples(), schedule="sync"))
    ids = [e.id for e in examples()]
    waves = [ids[0:3], ids[3:6], ids[6:]]
    order = [ids.index(i) // 3 for i, _ in calls]
    assert order == sorted(order)  # wave after wave
    for w, wave in enumerate(waves):
        turns = [k for (i, k), o in zip(calls, order, strict=True) if o == w]
        assert turns == sorted(turns)  # no turn k before every turn k-1 of the wave
        # the first step is every item's; later steps only the unfinished (4-turn) items'
        assert turns.count(0) == len(wave)


def test_unknown_schedule_is_named(toy_retriever):
    with pytest.raises(ValueError, match="unknown schedule 'lockstep'"):
        agent(toy_retriever).run_examples(examples(), schedule="lockstep")


def test_only_methods_that_pause_between_steps_take_the_sync_schedule(tiny_model_dir):  # noqa: F811
    assert SearchAgent.pauses_between_steps and not FlashRAGBaseline.pauses_between_steps
    naive = build_method("naive", ScriptedBackend([], model_path=tiny_model_dir), None)
    with pytest.raises(ValueError, match=r"schedule 'sync' \(--schedule sync\).*method 'naive' cannot"):
        naive.run_examples(examples(), schedule="sync")
    assert [t.finish_reason for t in naive.run_examples(examples()[:1])] == ["answer"]  # async runs it
