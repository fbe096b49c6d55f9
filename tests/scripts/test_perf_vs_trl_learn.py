"""vs_trl_learn.py: its pure helpers, and the script itself in CI size (slow; needs TRL)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.ports import child_env
from scripts.perf.vs_trl_learn import demo_examples, report, seed_order, steps_to_half, with_passages

ROOT = Path(__file__).resolve().parents[2]


def test_the_passages_follow_the_question_as_an_information_block():
    text = with_passages("Who?", [("A", "a text"), ("B", "b text")])
    assert text == "Who?\n<information>\nDoc 1(Title: A) a text\nDoc 2(Title: B) b text\n</information>"
    ex = demo_examples("val")[0]
    assert ex.question.count("Doc ") == 2 and "</information>" in ex.question


def test_both_sides_get_one_order_per_seed_and_seeds_differ():
    items = list(range(50))
    assert seed_order(items, 3, 10) == seed_order(items, 3, 10)
    assert seed_order(items, 3, 10) != seed_order(items, 4, 10)
    assert sorted(seed_order(items, 3, 50)) == items


def test_steps_to_half_of_the_final_gain():
    gain, half = steps_to_half([0.0, 0.0, 0.0, 0.2, 0.4, 0.6, 0.6, 0.6, 0.6, 0.6])
    assert gain == pytest.approx(0.6) and half == 6  # trailing 3-step means 0.07, 0.2, then 0.4 >= 0.3 at step 6
    assert steps_to_half([0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4]) == (pytest.approx(-0.1), None)


def test_report_pairs_each_side_with_the_checkpoint_before(tmp_path, capsys):
    steps = [
        {"side": side, "seed": s, "step": i + 1, "reward_mean": 0.1 * i, "step_s": 2.0}
        for side in ("harness", "trl")
        for s in (0, 1)
        for i in range(6)
    ]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (tmp_path / "heldout_before.json").write_text(json.dumps({"ids": ["a", "b"], "scores": [0.0, 0.0]}))
    held = [
        {"side": side, "seed": s, "ids": ["a", "b"], "scores": [1.0, 0.0]}
        for side in ("harness", "trl")
        for s in (0, 1)
    ]
    (tmp_path / "heldout.jsonl").write_text("".join(json.dumps(r) + "\n" for r in held))
    report(tmp_path, tmp_path / "fig.png")
    out = capsys.readouterr().out
    assert "| harness | 2 | 0.0 | 50.0" in out and "+50.0" in out
    assert "harness − TRL after training (seeds [0, 1], paired per question and seed): +0.0" in out
    assert (tmp_path / "fig.png").stat().st_size > 0


@pytest.mark.slow  # both trainers, 2 tiny steps, 2 held-out questions: 58 s measured at load ~2
@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL is absent: pip install -e '.[compare]'")
def test_the_learning_benchmark_runs_in_ci_size(tmp_path):
    cmd = [
        *(sys.executable, "-m", "scripts.perf.vs_trl_learn"),
        *("--side", "both", "--steps", "2", "--group-size", "2", "--prompts", "1", "--max-new-tokens", "8"),
        *("--heldout-limit", "2", "--eval-batch", "2", "--lr", "1e-5", "--out", str(tmp_path)),
    ]
    # no rendezvous variables: an in-process training test may hold this process's MASTER_PORT
    env = {**child_env(), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.startswith("NOT LIKE-FOR-LIKE")
    rows = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(r["side"], r["step"]) for r in rows] == [("harness", 1), ("harness", 2), ("trl", 1), ("trl", 2)]
    assert all(0.0 <= r["signal_frac"] <= 1.0 and r["response_tokens"] > 0 and r["step_s"] > 0 for r in rows)
    held = [json.loads(x) for x in (tmp_path / "heldout.jsonl").read_text().splitlines()]
    assert [h["side"] for h in held] == ["harness", "trl"] and all(len(h["scores"]) == 2 for h in held)
