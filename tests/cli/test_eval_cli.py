"""``harness eval`` end to end on the demo benchmark with the scripted backend: run directory,
scores, comma-separated pairs, config refusal, and an interrupted run resumed exactly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


@pytest.fixture(scope="module")
def demo_examples():
    from benchmarks.datasets import load_examples

    return load_examples("demo")


def write_script(path: Path, examples, n_right: int, delay: float = 0.0) -> Path:
    """Answer the first ``n_right`` questions correctly after one search; the rest say 'unknown'."""
    with open(path, "w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            answer = ex.answers[0] if i < n_right else "unknown"
            turns = [
                f"<think>look it up</think><search>{ex.question}</search>",
                f"<answer>\\boxed{{{answer}}}</answer>",
            ]
            f.write(json.dumps({"match": ex.question, "turns": turns, "delay": delay}) + "\n")
    return path


def eval_args(script: Path, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--method",
        "research",
        "--dataset",
        "demo",
        "--backend",
        "scripted",
        "--script",
        str(script),
        "--retriever",
        "memory",
        "--out",
        str(out),
        "agent.max_total_tokens=100000",
        *extra,
    ]


def test_eval_writes_a_complete_run_directory(tmp_path, demo_examples):
    script = write_script(tmp_path / "s.jsonl", demo_examples, n_right=3)
    result = runner.invoke(app, eval_args(script, tmp_path / "runs", "--limit", "6"))
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "research-demo-test"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "research" and manifest["n_total"] == 6
    assert manifest["config"]["dataset"]["limit"] == 6 and manifest["data_hash"]
    trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    scores = [json.loads(line) for line in (run / "scores.jsonl").read_text().splitlines()]
    assert len(trajs) == len(scores) == 6
    results = json.loads((run / "results.json").read_text())
    assert results["n"] == 6 and results["complete"] is True and results["errors"] == 0
    assert results["metrics"]["em"] == pytest.approx(3 / 6)
    assert results["mean_searches"] == pytest.approx(1.0)
    assert results["finish_reasons"] == {"answer": 6}
    assert "research" in result.output and "50.0" in result.output


def test_comma_separated_methods_and_a_changed_config(tmp_path, demo_examples):
    script = write_script(tmp_path / "s.jsonl", demo_examples, n_right=1)
    args = eval_args(script, tmp_path / "runs", "--limit", "2")
    args[args.index("research")] = "research,search_r1"
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["research-demo-test", "search_r1-demo-test"]
    changed = runner.invoke(app, [*eval_args(script, tmp_path / "runs", "--limit", "2"), "retriever.topk=5"])
    assert changed.exit_code != 0
    assert "another config" in changed.output


def test_sync_schedule_gives_the_async_predictions_and_is_recorded(tmp_path, demo_examples):
    # Uneven items (0 to 2 searches, some right, some not) in waves of 3: the barrier between
    # turns changes only the order in which turns run.
    with open(tmp_path / "s.jsonl", "w", encoding="utf-8") as f:
        for i, ex in enumerate(demo_examples[:7]):
            searches = [f"<think>hop {k}</think><search>{ex.question} {k}</search>" for k in range(i % 3)]
            answer = ex.answers[0] if i % 2 else "unknown"
            f.write(json.dumps({"match": ex.question, "turns": [*searches, f"<answer>{answer}</answer>"]}) + "\n")
    runs = {}
    for schedule in ("async", "sync"):
        out = tmp_path / schedule
        args = [*eval_args(tmp_path / "s.jsonl", out, "--limit", "7", "--schedule", schedule)]
        args.append("agent.max_concurrency=3")
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
        run = out / "research-demo-test"
        assert json.loads((run / "manifest.json").read_text())["execution"]["schedule"] == schedule
        trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
        runs[schedule] = {t["example_id"]: (t["prediction"], t["n_turns"], t["response_text"]) for t in trajs}
    assert runs["sync"] == runs["async"]
    assert {turns for _, turns, _ in runs["sync"].values()} == {1, 2, 3}
    bad = runner.invoke(app, [*eval_args(tmp_path / "s.jsonl", tmp_path / "x", "--schedule", "lockstep")])
    assert bad.exit_code != 0 and "lockstep" in bad.output


def test_bad_input_gets_a_clear_error(tmp_path):
    result = runner.invoke(app, ["eval", "--method", "reserch", "--backend", "scripted", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "did you mean 'research'" in result.output
    result = runner.invoke(app, ["eval", "--backend", "scripted", "agent.max_turnz=2", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "max_turns" in result.output


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from cli.main import main; main()", *args]


@pytest.mark.slow
def test_interrupted_run_resumes_with_identical_results(tmp_path, demo_examples):
    n = 8
    # The same answers; only the interrupted run is slowed down (0.4 s a turn, ~3 s in all), so
    # the interrupt lands mid-run even when a loaded machine is slow to deliver it.
    fast = write_script(tmp_path / "fast.jsonl", demo_examples, n_right=4)
    script = write_script(tmp_path / "s.jsonl", demo_examples, n_right=4, delay=0.4)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Uninterrupted reference run.
    ref = subprocess.run(_cli(*eval_args(fast, tmp_path / "ref", "--limit", str(n))), env=env, capture_output=True)
    assert ref.returncode == 0, ref.stderr.decode()[-2000:]

    # Interrupted run: SIGINT once a few items are on disk, then the same command again.
    out = tmp_path / "int"
    traj_file = out / "research-demo-test" / "trajectories.jsonl"
    args = [*eval_args(script, out, "--limit", str(n)), "agent.max_concurrency=2"]
    # SIG_DFL first: a CI started as a background job inherits an ignored SIGINT, and Python then
    # installs no KeyboardInterrupt handler.
    proc = subprocess.Popen(
        _cli(*args),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.time() + 60
    while time.time() < deadline:
        if traj_file.exists() and len(traj_file.read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    done_before = len(traj_file.read_text().splitlines())
    assert 2 <= done_before < n, "the interrupt should land mid-run"
    again = subprocess.run(_cli(*args), env=env, capture_output=True)
    assert again.returncode == 0, again.stderr.decode()[-2000:]

    def by_id(path: Path) -> dict:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return {r["id"]: {k: v for k, v in r.items() if k != "wall_time_s"} for r in rows}

    ref_run, int_run = tmp_path / "ref" / "research-demo-test", out / "research-demo-test"
    assert by_id(int_run / "scores.jsonl") == by_id(ref_run / "scores.jsonl")
    ref_results = json.loads((ref_run / "results.json").read_text())
    int_results = json.loads((int_run / "results.json").read_text())
    for key in ("n", "metrics", "mean_searches", "mean_generated_tokens", "finish_reasons", "errors"):
        assert int_results[key] == ref_results[key]
    ref_t = {
        json.loads(x)["example_id"]: json.loads(x) for x in (ref_run / "trajectories.jsonl").read_text().splitlines()
    }
    int_t = {
        json.loads(x)["example_id"]: json.loads(x) for x in (int_run / "trajectories.jsonl").read_text().splitlines()
    }
    assert set(int_t) == set(ref_t)
    for k, t in int_t.items():
        assert [s["token_ids"] for s in t["segments"]] == [s["token_ids"] for s in ref_t[k]["segments"]]
