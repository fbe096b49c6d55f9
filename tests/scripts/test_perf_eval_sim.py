"""scripts/perf/eval_sim.py: the simulated engine's clock against hand arithmetic, the two
schedules (the agent's and the turn-synchronous gate) on workloads whose answer is known, the
saturated replay (the engine's capacity for the same work), and the released 7B agent's turn file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from scripts.perf.eval_sim import (
    R1SEARCHER_7B,
    CostModel,
    Shape,
    generated_tokens,
    least_seconds,
    main,
    plan,
    read_shapes,
    read_turn_file,
    saturated,
    simulate,
)

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


def test_the_saturated_replay_of_one_turn_is_the_agent_run_and_sends_every_turn_at_once():
    one = [Shape(100, ((3, 0),))]
    assert saturated(one, COST)[0] == pytest.approx(simulate(one, "agent", 1, COST)["sim_s"])
    P, G1, O1, G2 = 50, 2, 30, 1
    a, b, c, p = COST.a, COST.b, COST.c, COST.p
    # both turns run in step 1 (the second with its prefix cached: only G1 + O1 prefilled) and the
    # second ends there; step 2 decodes the first turn's last token. No retrieval wait.
    step1 = a + 2 * b + c * (P + (P + G1 + O1)) + p * (P + G1 + O1)
    step2 = a + b + c * (P + 1)
    assert saturated([Shape(P, ((G1, O1), (G2, 0)))], COST) == (pytest.approx(step1 + step2), 2)
    # where only the longest turn limits the steps, the replay reaches the bound exactly
    assert least_seconds([Shape(P, ((G1, O1), (G2, 0)))], COST) == pytest.approx(step1 + step2)
    with pytest.raises(RuntimeError, match="does not fit --kv-tokens 100"):
        saturated([Shape(99, ((5, 0),))], CostModel(kv_tokens=100))


def test_the_released_7b_turn_file_loads_and_its_questions_simulate_under_capacity():
    shapes = read_turn_file(R1SEARCHER_7B)
    assert len(shapes) == 500  # R1-Searcher's HotpotQA subset, every row kept
    assert {len(s.turns) for s in shapes} == {1, 2, 3, 4, 5}
    assert all(o > 0 for s in shapes for _, o in s.turns[:-1])  # every search inserted documents
    assert 80 < generated_tokens(shapes) / sum(len(s.turns) for s in shapes) < 120  # ~99 a turn
    questions = plan(shapes, 24, "uniform", random.Random(0))
    seconds, steps = saturated(questions, CostModel())
    assert steps == max(g for q in questions for g, _ in q.turns)  # the fewest possible steps
    assert seconds == pytest.approx(least_seconds(questions, CostModel()))
    limit = generated_tokens(questions) / seconds
    for schedule in ("agent", "sync"):
        out = simulate(questions, schedule, 8, CostModel())
        assert 0 < out["gen_tokens_per_s"] < limit  # 8 at a time fill less of the engine than 24 at once


def test_a_bad_turn_file_is_named_with_the_question_at_fault(tmp_path):
    bad = tmp_path / "turns.json"
    bad.write_text('{"questions": [[10, [[5, 3], [4, 0]]], [10, [[5, 3]]]]}')
    with pytest.raises(ValueError, match=r"turns.json: question 1 .*answer turn"):
        read_turn_file(bad)
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not a turn file"):
        read_turn_file(bad)


def test_the_report_has_a_row_per_turn_source_with_capacity(capsys):
    main(["--turns", "smollm2", "r1searcher-7b", "--runs", str(FIXTURE_RUN), "--questions", "12",
          "--concurrency", "4", "--workload", "uniform"])  # fmt: skip
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| ") and "---" not in r][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| smollm2", "| r1searcher-7b"]
    assert all(r.split(" | ")[10].endswith("%") for r in rows)  # agent capacity


def test_the_bound_counts_the_steps_the_kv_cache_and_max_running_force():
    twelve = [Shape(10, ((4, 0),))] * 12  # 12 turns of 4 tokens, each holding 14 tokens of KV
    a, b, c, p = COST.a, COST.b, COST.c, COST.p
    fixed = 12 * (b * 4 + c * (4 * 10 + 6) + p * 10)
    assert least_seconds(twelve, COST) == pytest.approx(4 * a + fixed)  # only the longest turn
    assert least_seconds(twelve, CostModel(a, b, c, p, max_running=4)) == pytest.approx(12 * a + fixed)
    assert least_seconds(twelve, CostModel(a, b, c, p, kv_tokens=28)) == pytest.approx(24 * a + fixed)
    # the engine's own packing cannot beat the bound: 2 sequences at a time, 4 steps each
    seconds, steps = saturated(twelve, CostModel(a, b, c, p, kv_tokens=28))
    assert steps == 24 and seconds >= least_seconds(twelve, CostModel(a, b, c, p, kv_tokens=28)) - 1e-12
