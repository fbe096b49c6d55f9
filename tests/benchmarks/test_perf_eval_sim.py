"""benchmarks/perf/eval_sim.py: the simulated engine's clock against hand arithmetic, and the two
schedules (the agent's and the turn-synchronous gate) on workloads whose answer is known."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.perf.eval_sim import CostModel, Shape, plan, read_shapes, simulate

FIXTURE_RUN = Path(__file__).resolve().parents[1] / "fixtures" / "runs" / "research-demo-test"
COST = CostModel(a=0.01, b=0.001, c=1e-5, p=1e-4, retrieval_s=1.0)


def test_one_turn_costs_its_prefill_step_and_one_decode_step_per_further_token():
    P, G = 100, 3
    out = simulate([Shape(P, ((G, 0),))], "agent", 1, COST)
    a, b, c, p = COST.a, COST.b, COST.c, COST.p
    # step 1 prefills the prompt and yields the first token; steps 2 and 3 decode one token each
    expect = (a + b + c * P + p * P) + (a + b + c * (P + 1)) + (a + b + c * (P + 2))
    assert out["sim_s"] == pytest.approx(expect)
    assert out["idle_frac"] == pytest.approx(0.0) and out["mean_batch"] == 1


def test_a_search_leaves_the_engine_idle_for_the_retrieval_and_prefills_only_the_new_tokens():
    P, G1, O1, G2 = 50, 2, 30, 1
    out = simulate([Shape(P, ((G1, O1), (G2, 0)))], "agent", 1, COST)
    a, b, c, p = COST.a, COST.b, COST.c, COST.p
    turn1 = (a + b + c * P + p * P) + (a + b + c * (P + 1))
    ctx2 = P + G1 + O1  # the cached prefix plus the new tokens; only G1 + O1 are prefilled
    turn2 = a + b + c * ctx2 + p * (G1 + O1)
    assert out["sim_s"] == pytest.approx(turn1 + COST.retrieval_s + turn2)
    assert out["idle_frac"] == pytest.approx(COST.retrieval_s / (turn1 + COST.retrieval_s + turn2))


def test_identical_questions_schedule_alike_and_stragglers_cost_the_synchronous_loop():
    same = [Shape(40, ((5, 10), (5, 0)))] * 4
    agent, sync = (simulate(same, s, 2, COST) for s in ("agent", "sync"))
    assert agent["sim_s"] == pytest.approx(sync["sim_s"])  # no straggler: nothing to gain
    # short and long questions alternate: the turn-synchronous loop waits for the long ones
    mixed = [Shape(40, ((5, 0),)), Shape(40, ((5, 10), (5, 10), (5, 10), (5, 0)))] * 3
    agent, sync = (simulate(mixed, s, 2, COST) for s in ("agent", "sync"))
    assert agent["questions_per_s"] > 1.2 * sync["questions_per_s"]
    assert sync["idle_frac"] > agent["idle_frac"]


def test_shapes_come_from_real_trajectories_and_mixed_plans_span_zero_to_four_searches():
    shapes = read_shapes([FIXTURE_RUN])
    assert shapes and all(s.prompt > 0 and s.turns for s in shapes)
    mixed = plan(shapes, 200, "mixed", random.Random(0))
    assert {len(s.turns) for s in mixed} == {1, 2, 3, 4, 5}
    assert all(s.turns[-1][1] == 0 for s in mixed)  # nothing is inserted after the answer
    uniform = plan(shapes, 10, "uniform", random.Random(0))
    assert all(s in shapes for s in uniform)
    with pytest.raises(FileNotFoundError, match="no trajectories.jsonl"):
        read_shapes([FIXTURE_RUN.parent])
