"""``harness eval`` when things break: failed items are retried on resume, a dead server fails the
preflight at once, changed data or a typo never poisons a run folder, execution-only keys resume,
bad ranges are refused, and the summary is readable when piped.

The retrieval server here is a real HTTP server on loopback (Search-R1's ``/retrieve`` API) over
the demo corpus, which can be told to fail (HTTP 503) from some request on.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from programs.faults.kit import RetrievalServer

runner = CliRunner()


@pytest.fixture
def server():
    s = RetrievalServer()  # the fault battery's; a test sets fail_after (HTTP 503 from then on), then None
    yield s
    s.close()


@pytest.fixture(scope="module")
def demo_examples():
    from benchmarks.datasets import load_examples

    return load_examples("demo")


def write_script(path: Path, examples) -> Path:
    """Every question: one search, then its gold answer (so a finished item scores EM 1)."""
    with open(path, "w", encoding="utf-8") as f:
        for ex in examples:
            turns = [f"<search>{ex.question}</search>", f"<answer>{ex.answers[0]}</answer>"]
            f.write(json.dumps({"match": ex.question, "turns": turns}) + "\n")
    return path


def args(script: Path, out: Path, *extra: str, method: str = "search_r1") -> list[str]:
    return [
        "eval", "--method", method, "--dataset", "demo", "--backend", "scripted", "--script", str(script),
        "--out", str(out), "agent.max_total_tokens=100000", *extra,
    ]  # fmt: skip


def http_args(script: Path, out: Path, url: str, *extra: str) -> list[str]:
    return args(script, out, "--retriever", "http", "--index", url, "--limit", "6", "retriever.retries=0", *extra)


def test_failed_items_are_retried_on_resume_and_the_run_is_not_complete_until_then(tmp_path, demo_examples, server):
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    run = tmp_path / "runs" / "search_r1-demo-test"
    server.fail_after = 3  # the preflight and two items' searches succeed; then the server fails
    first = runner.invoke(app, http_args(script, tmp_path / "runs", server.url, "agent.max_concurrency=1"))
    assert first.exit_code == 1, first.output
    assert "4 items failed: RetrievalError ×4; rerun to retry them" in " ".join(first.output.split())
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False and results["errors"] == 4 and results["error_kinds"] == {"RetrievalError": 4}

    server.fail_after = None  # the server is back: the same command retries only the failed items
    before = server.requests
    again = runner.invoke(app, http_args(script, tmp_path / "runs", server.url))
    assert again.exit_code == 0, again.output
    assert server.requests - before == 1 + 4  # the preflight and the four retried items
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is True and results["errors"] == 0 and results["n"] == 6
    assert results["metrics"]["em"] == 1.0
    attempts = (run / "scores.jsonl").read_text().splitlines()
    assert len(attempts) == 10  # failed attempts stay in the log; the report uses the latest


def test_a_dead_server_fails_the_preflight_at_once_and_writes_nothing(tmp_path, demo_examples, server):
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    url = server.url
    server.close()
    t0 = time.perf_counter()
    result = runner.invoke(app, http_args(script, tmp_path / "runs", url, "retriever.retries=3"))
    assert result.exit_code != 0 and "retrieval server" in result.output
    assert time.perf_counter() - t0 < 10
    assert not (tmp_path / "runs" / "search_r1-demo-test" / "scores.jsonl").exists()


def test_changed_data_is_refused_naming_what_changed(tmp_path):
    data = tmp_path / "data" / "hotpotqa"
    data.mkdir(parents=True)
    rows = [{"id": f"q{i}", "question": f"Who is person {i}?", "golden_answers": [f"P{i}"]} for i in range(3)]
    (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    from benchmarks.datasets import demo_path

    script = tmp_path / "s.jsonl"
    script.write_text("")  # every answer is the scripted default
    common = [
        "eval", "--method", "search_r1", "--dataset", "hotpotqa", "--split", "dev", "--data-dir",
        str(tmp_path / "data"), "--backend", "scripted", "--script", str(script), "--retriever", "memory",
        f"retriever.corpus={demo_path('corpus.jsonl')}", "--out", str(tmp_path / "runs"),
    ]  # fmt: skip
    assert runner.invoke(app, common).exit_code == 0
    rows.append({"id": "q3", "question": "A new one?", "golden_answers": ["x"]})
    (data / "dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    changed = runner.invoke(app, common)
    assert changed.exit_code != 0 and "other items: data_hash was" in " ".join(changed.output.split())


def test_a_typo_leaves_no_run_folder_and_execution_keys_resume(tmp_path, demo_examples):
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    out = tmp_path / "runs"
    typo = runner.invoke(app, args(script, out, "--limit", "2", "agent.max_turnz=3"))
    assert typo.exit_code != 0 and "did you mean 'agent.max_turns'" in typo.output
    assert not out.exists()
    assert runner.invoke(app, args(script, out, "--limit", "2", "agent.max_turns=3")).exit_code == 0
    # Concurrency only changes how the run executes: the same run resumes (nothing to redo).
    lines = (out / "search_r1-demo-test" / "scores.jsonl").read_text()
    resumed = runner.invoke(app, args(script, out, "--limit", "2", "agent.max_turns=3", "agent.max_concurrency=1"))
    assert resumed.exit_code == 0, resumed.output
    assert (out / "search_r1-demo-test" / "scores.jsonl").read_text() == lines
    # A key that changes results is refused, naming the key.
    other = runner.invoke(app, args(script, out, "--limit", "2", "agent.max_turns=2"))
    assert other.exit_code != 0 and "agent.max_turns: 3 → 2" in " ".join(other.output.split())


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--topk", "0"], "retriever.topk must be at least 1, got 0"),
        (["--topk", "-1"], "retriever.topk must be at least 1, got -1"),
        (["agent.max_turns=-1"], "agent.max_turns must be at least 0, got -1"),
        (["agent.max_new_tokens=0"], "agent.max_new_tokens must be at least 1, got 0"),
        (["--limit", "0"], "dataset.limit must be at least 1, got 0"),
        (["retriever.timeout=0"], "retriever.timeout must be greater than 0, got 0"),  # issue 23 defect 11
        (["retriever.timeout=-5"], "retriever.timeout must be greater than 0, got -5"),
        (["backend.timeout=0"], "backend.timeout must be greater than 0, got 0"),
        (["stop_after_failures=-1"], "stop_after_failures must be at least 0, got -1"),
    ],
)
def test_out_of_range_values_are_refused(tmp_path, demo_examples, extra, message):
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    result = runner.invoke(app, args(script, tmp_path / "runs", *extra))
    assert result.exit_code != 0 and message in " ".join(result.output.split())
    assert not (tmp_path / "runs").exists()


def test_the_summary_table_is_not_cut_when_piped(tmp_path, demo_examples):
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    result = runner.invoke(app, args(script, tmp_path / "runs", "--limit", "2", "--retriever", "memory"))
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "method" in line and "dataset" in line)
    assert "p50 s" in header and "err" in header and "…" not in result.output
    assert "search_r1" in result.output and "2/2" in result.output


def test_a_retriever_that_dies_mid_run_stops_it_at_once_with_exit_1(tmp_path, demo_examples, server, monkeypatch):
    """Issue 23 defect 5: after N items in a row fail for an infrastructure reason the run pauses,
    checks the servers' health and stops ("retriever down at item k"), instead of failing every
    remaining item after its retries; failed items are not counted in ``n`` as if scored."""
    import benchmarks.evaluate

    monkeypatch.setattr(benchmarks.evaluate, "HEALTH_PAUSE_S", 0.0)
    script = write_script(tmp_path / "s.jsonl", demo_examples)
    server.fail_after = 3  # the preflight and two items' searches succeed; then the server is down for good
    extra = ["--limit", "12", "agent.max_concurrency=1", "stop_after_failures=3"]
    res = runner.invoke(app, http_args(script, tmp_path / "runs", server.url, *extra))
    out = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "retriever down: 3 items failed (3 in a row" in out and "Stopped after 5 of 12 items" in out
    assert "resume" in out
    run = tmp_path / "runs" / "search_r1-demo-test"
    assert len((run / "scores.jsonl").read_text().splitlines()) == 5  # items 6-12 were never tried
    results = json.loads((run / "results.json").read_text())
    assert results["n"] == 2 and results["errors"] == 3 and results["metrics"]["em"] == 1.0  # scored items only
    assert results["complete"] is False
    server.fail_after = None  # back: the same command resumes the failed and the untried items
    res = runner.invoke(app, http_args(script, tmp_path / "runs", server.url, *extra))
    assert res.exit_code == 0, res.output
    assert json.loads((run / "results.json").read_text())["n"] == 12


def test_the_breaker_goes_on_when_the_health_check_passes(monkeypatch):
    import benchmarks.evaluate
    from benchmarks.evaluate import BreakerTripped, FailureBreaker, InfrastructureDown
    from harness.run_records import ItemScore

    monkeypatch.setattr(benchmarks.evaluate, "HEALTH_PAUSE_S", 0.0)

    def item(kind):
        return ItemScore(id="q", sample_index=0, metrics={}, error=None if kind is None else "X: y", error_kind=kind)

    checks = []
    b = FailureBreaker(2, lambda: checks.append(1), done=0, total=9, where="r")
    trips = 0
    for kind in ("retrieval", None, "retrieval", "other", "backend", "backend", "backend"):
        try:
            b(item(kind))
        except BreakerTripped:  # the run's items are cancelled; then, off the event loop:
            trips += 1
            b.check()
    assert trips == 1 and checks == [1] and len(b.streak) == 1  # one pause at the 2nd failure in a row, then going on

    def down():
        raise OSError("connection refused")

    b = FailureBreaker(2, down, done=4, total=9, where="r")
    b(item("backend"))
    with pytest.raises(BreakerTripped):
        b(item("backend"))
    with pytest.raises(BreakerTripped):  # an item finishing while the run winds down changes nothing
        b(item(None))
    with pytest.raises(InfrastructureDown, match=r"generation backend down: 2 items failed .*Stopped after 7 of 9"):
        b.check()


def test_a_dead_retriever_stops_the_run_within_10_s_at_the_default_concurrency(tmp_path, demo_examples, server, caplog):
    """Issue 31 defect 7: at the default concurrency (64) a retriever that went down took 75 s to
    stop the run, pausing 5 s once per item still running (a blocking sleep on the event loop)
    and naming the wrong item. Now the trip cancels every item still running, the pause is
    taken once, off the loop, counted from the trip, and the message names how many failed."""
    import logging

    script = write_script(tmp_path / "s.jsonl", demo_examples)
    server.fail_after = 20  # the preflight and some items; then HTTP 503 for good (retried 3 times each)
    caplog.set_level(logging.WARNING, logger="benchmarks.evaluate")
    cmd = args(script, tmp_path / "runs", "--retriever", "http", "--index", server.url, "--limit", "154")
    res = runner.invoke(app, cmd)
    ended = time.time()
    out = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    trips = [r for r in caplog.records if "stopping the items still running" in r.getMessage()]
    pauses = [r for r in caplog.records if r.getMessage().startswith("pausing")]
    assert len(trips) == 1 and len(pauses) == 1, [r.getMessage() for r in caplog.records]
    took = ended - trips[0].created
    assert took < 10, f"stopped {took:.1f} s after the trip"
    print(f"stopped {took:.1f} s after the breaker tripped")
    results = json.loads((tmp_path / "runs" / "search_r1-demo-test" / "results.json").read_text())
    assert f"retriever down: {results['errors']} items failed" in out, out
    assert results["n"] + results["errors"] < 154  # the items not yet run were never tried
