"""MCTS step values through THE agent loop (training.data.mcts), on scripted backends: values stay in
the reward's range, visits add up, pairs respect the margin, budgets hold, and resume is exact."""

from __future__ import annotations

import json

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Example
from pipelines.search_agent import AgentConfig, SearchAgent
from tests.pipelines.conftest import TOY_DOCS
from training.data.mcts import DONE_FILE, PAIRS_FILE, STEPS_FILE, MCTSConfig, TreeSearch, run_mcts, walk
from training.rewards import build_reward

# Alternative policies; a sampled request takes the one its seed picks, a greedy one the first.
GOOD = [
    "Find the inventor.</step>\n<subquery>Who invented the glass harp-clock?</subquery>",
    "Mira Solberg.</step>\n<subanswer>Mira Solberg</subanswer>",
    "Her town's river.</step>\n<subquery>Eddavik river</subquery>",
    "Combine.</step>\n<answer>Lunne</answer>",
]
WRONG = ["Guess.</step>\n<answer>Oslo</answer>"]
HALF = ["Look up the river.</step>\n<subquery>Eddavik river</subquery>", "So.</step>\n<answer>the Lunne river</answer>"]


class SeededScripts(ScriptedBackend):
    """Scripted replay where the sampling seed picks one of several scripts (greedy: the first)."""

    def __init__(self, scripts):
        super().__init__([{"match": "glass harp-clock", "turns": scripts[0]}])
        self.alts = [ScriptedBackend([{"match": "glass harp-clock", "turns": t}]) for t in scripts]

    async def agenerate(self, input_ids, params):
        self.calls += 1
        return await self.alts[(params.seed or 0) % len(self.alts)].agenerate(input_ids, params)


def make_agent(scripts=(GOOD, WRONG, HALF)):
    backend = SeededScripts(list(scripts))
    return SearchAgent(backend, InMemoryRetriever(TOY_DOCS), "prorag", AgentConfig(max_turns=6, max_total_tokens=8192))


EXAMPLES = [
    Example(f"q{i}", "Which river flows by the glass harp-clock inventor's town?", ("Lunne",)) for i in range(3)
]


def search(cfg: MCTSConfig, example=EXAMPLES[0]):
    import asyncio

    return asyncio.run(TreeSearch(make_agent(), cfg, build_reward(cfg.reward)).search(example))


def test_values_in_range_and_visits_add_up():
    cfg = MCTSConfig(num_simulations=12, expansion_width=4, max_depth=6)
    root, used = search(cfg)
    nodes = walk(root)
    assert root.visits == used.simulations == 12
    assert used.nodes == len(nodes) and used.rollouts >= 1 and used.tokens > 0
    for n in nodes:
        assert n.visits == n.own + sum(ch.visits for ch in n.children)  # every backup passes up once
        assert 0.0 <= n.value <= 1.0  # prorag_f1 is in [0, 1], gamma <= 1
    assert root.own == 0
    # The wrong answer ends the item at once with value 0; the other two first steps lead (under
    # greedy rollouts, the GOOD script) to F1 1 a few discounted levels down: the tree separates them.
    assert len(root.children) == 3  # 4 samples, 3 distinct steps (duplicates dropped)
    (wrong,) = [n for n in root.children if n.terminal]
    assert wrong.value == 0.0 and wrong.traj.prediction == "Oslo" and wrong.visits >= 1
    for n in root.children:
        if n is not wrong:
            assert n.visits > wrong.visits and n.value > 0.5


def test_budgets_hold():
    root, used = search(MCTSConfig(num_simulations=50, expansion_width=3, max_nodes=5))
    assert used.nodes <= 5 and len(walk(root)) <= 5
    root, used = search(MCTSConfig(num_simulations=50, expansion_width=3, max_rollouts=2))
    assert used.rollouts <= 2 and used.simulations < 50
    root, used = search(MCTSConfig(num_simulations=50, expansion_width=3, max_tokens=300))
    assert used.simulations < 50


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_records_pairs_margin_and_exact_resume(tmp_path):
    cfg = MCTSConfig(num_simulations=10, expansion_width=4, max_depth=6, margin=0.3, concurrency=1)
    full = tmp_path / "full"
    stats = run_mcts(make_agent(), EXAMPLES, cfg, full)
    assert stats.questions == 3 and stats.pairs > 0 and stats.failed == 0
    steps, pairs = read(full / STEPS_FILE), read(full / PAIRS_FILE)
    assert {s["question_id"] for s in steps} == {e.id for e in EXAMPLES}
    for s in steps:
        assert 0.0 <= s["value"] <= 1.0 and s["visits"] >= 1
        assert [x["role"] for x in s["prefix"]][0] == "prompt" and s["step"][0]["role"] == "model"
    by_node = {(s["question_id"], s["node"]): s for s in steps}
    for p in pairs:
        c, r = p["chosen"], p["rejected"]
        assert c["value"] - r["value"] > cfg.margin
        # siblings: the same parent and the same prefix as their step records say
        assert by_node[(p["question_id"], c["node"])]["parent"] == by_node[(p["question_id"], r["node"])]["parent"]
        assert by_node[(p["question_id"], c["node"])]["prefix"] == p["prefix"]
    # Visits of a parent's step records add up with the tree (root: the simulation count).
    for qid in {s["question_id"] for s in steps}:
        top = [s for s in steps if s["question_id"] == qid and s["parent"] == 0]
        assert sum(s["visits"] for s in top) == cfg.num_simulations

    # Interrupted: two questions finished, the third's records half written, no done line.
    part = tmp_path / "part"
    run_mcts(make_agent(), EXAMPLES[:2], cfg, part)
    q3 = [ln for ln in (full / STEPS_FILE).read_text().splitlines(keepends=True) if '"question_id": "q2"' in ln]
    with open(part / STEPS_FILE, "a") as f:
        f.write(q3[0] + q3[1][: len(q3[1]) // 2])
    again = run_mcts(make_agent(), EXAMPLES, cfg, part)
    assert again.skipped == 2 and again.questions == 1
    for name in (STEPS_FILE, PAIRS_FILE, DONE_FILE):
        assert (part / name).read_bytes() == (full / name).read_bytes(), name
    assert run_mcts(make_agent(), EXAMPLES, cfg, part).skipped == 3  # all done: nothing searched


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="gamma"):
        MCTSConfig(gamma=0.0)
    with pytest.raises(ValueError):
        MCTSConfig(expansion_width=0)


def test_cli_writes_and_resumes(tmp_path):
    """`harness data mcts -c configs/train/prorag/mcts_cpu.yaml` with a scripted backend on demo data."""
    from pathlib import Path

    from typer.testing import CliRunner

    from cli.main import app

    script = tmp_path / "script.jsonl"
    turns = ["Look.</step>\n<subquery>capital of France</subquery>", "Done.</step>\n<answer>Paris</answer>"]
    script.write_text(json.dumps({"match": "", "turns": turns}) + "\n")
    cfg = Path(__file__).resolve().parents[3] / "configs" / "train" / "prorag" / "mcts_cpu.yaml"
    out = tmp_path / "out"
    args = ["data", "mcts", "-c", str(cfg), "--out", str(out), "--limit", "2"]
    args += ["backend.kind=scripted", f"backend.script={script}", "mcts.num_simulations=3", "retriever.kind=memory"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "2 questions searched" in res.output
    done = read(out / DONE_FILE)
    assert len(done) == 2 and all(d["simulations"] == 3 for d in done)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "2 already done" in res.output, res.output
    bad = CliRunner().invoke(app, [*args, "mcts.gamma=2"])
    assert bad.exit_code != 0 and "gamma" in bad.output


def test_pairs_as_prorag_filter_one_per_node_recursing_into_well_visited_well_formed_steps():
    # prorag/prm/filter.py traverse_and_collect_jobs, with the GPT-4o choice replaced by
    # highest-vs-lowest value (apart by more than the margin).
    from harness.types import Segment, Trajectory
    from pipelines.dialects.prorag import prorag_step_ok
    from training.data.mcts import Node, tree_records

    ex = EXAMPLES[0]
    search = "q.</step>\n<subquery>x</subquery>"
    obs = "\n<retrieval>\nDoc 1(Title: t) x\n</retrieval>\n<step>\n"

    def child(parent, turn, value, visits, nid, observation=obs):
        base = parent.traj.segments if parent.traj else [Segment("prompt", [1], "P<step>\n")]
        segs = [*base, Segment("model", [2], turn), Segment("observation", [3], observation)]
        traj = Trajectory(example_id=ex.id, question=ex.question, answers=list(ex.answers), method="m")
        traj.segments, traj.finish_reason = segs, "paused"
        n = Node(traj, parent=parent, depth=parent.depth + 1, id=nid, visits=visits, total=value * visits)
        parent.children.append(n)
        return n

    root = Node(None, visits=10)
    a = child(root, search, 0.9, 4, 1)
    child(root, search, 0.5, 2, 2)
    child(root, search, 0.1, 3, 3)
    child(root, "</step>\n<ANSWER>x</ANSWER>", 0.0, 1, 4, observation="\n<step>\n")  # format_check fails
    child(a, "b.</step>\n<subanswer>y</subanswer>", 1.0, 2, 5, observation="\n<step>\n")
    child(a, "c.</step>\n<answer>y</answer>", 0.2, 1, 6, observation="")
    low = root.children[2]
    child(low, search, 1.0, 1, 7)  # under a node visited 3 times: recursed into
    child(low, search, 0.0, 1, 8)
    cfg = MCTSConfig(margin=0.2)
    _, pairs = tree_records(ex, root, cfg, prorag_step_ok)
    got = {(p["parent"], p["chosen"]["node"], p["rejected"]["node"]) for p in pairs}
    assert got == {(0, 1, 3), (1, 5, 6), (3, 7, 8)}  # one per node; node 4 malformed, node 2 not recursed (n=2)
    _, every = tree_records(ex, root, MCTSConfig(margin=0.2, pair_rule="margin"))
    assert len(every) > len(pairs)
