"""The fairness helpers of the peer benchmarks (vs_trl.py, vs_flashrag.py), without the peers."""

from __future__ import annotations

import argparse

from harness.backends.scripted import ScriptedBackend
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc, Example
from scripts.perf.vs_flashrag import RunResult, agreement, select_mixed
from scripts.perf.vs_trl import group_uniform_frac, trl_reward


def test_trl_side_scores_with_the_harness_reward_and_it_varies():
    seen: list[float] = []
    fn = trl_reward("search_r1_format", 2, seen)
    texts = ["<think>x</think><answer> Paris </answer>", "no tags at all", "<answer> Rome </answer>"]
    got = fn(texts, [["Paris"]] * 3)
    assert got == seen and got[1] == 0.0 and got[0] > got[2] > got[1]  # EM, parsed but wrong, nothing
    assert group_uniform_frac([1.0, 1.0, 0.0, 0.2], 2) == 0.5
    assert group_uniform_frac([0.0] * 8, 4) == 1.0


def test_agreement_lists_each_disagreement_with_where_it_starts():
    a = RunResult(1.0, {"q1": "Paris", "q2": "Rome"}, {"q1": ["t"], "q2": ["x", "y"]}, 0, 0)
    b = RunResult(1.0, {"q1": "paris", "q2": "Oslo"}, {"q1": ["t"], "q2": ["x", "z"]}, 0, 0)
    same, why = agreement(a, b)
    assert same == 1 and why == [("q2", "turn 2 (observation format / turn handling differ)")]


def test_mixed_workload_spreads_the_questions_over_the_model_s_search_counts():
    pool = [Example(f"q{i}", f"question number {i}?", ("a",)) for i in range(12)]
    script = [
        {"match": ex.question, "turns": [f"<search> s{k} </search>" for k in range(i % 3)] + ["<answer> a </answer>"]}
        for i, ex in enumerate(pool)
    ]
    args = argparse.Namespace(n=6, max_turns=4, max_new_tokens=64, max_total_tokens=4096, max_doc_tokens=64, topk=1)
    chosen = select_mixed("search_r1", ScriptedBackend(script), InMemoryRetriever([Doc("d", "t", "x")]), pool, args)
    searches = sorted(int(ex.id[1:]) % 3 for ex in chosen)
    assert len(chosen) == 6 and searches == [0, 0, 1, 1, 2, 2]
