"""``harness report --format searchagent-leaderboard`` (issue 49): the board's JSON from run
folders, read back to the same numbers; rows off the board's setting refused unless asked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.evaluate import evaluate
from benchmarks.leaderboard_export import read_board_file
from benchmarks.report import build_leaderboard, load_runs
from benchmarks.report_write import write_report
from harness.run_records import RunManifest
from harness.types import Example
from tests.helpers.trajectories import trajectory

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "runs"


class Answers:
    """Answers the listed question ids right, every other one wrong."""

    def __init__(self, method, right):
        self.method, self.right = method, set(right)

    def run_examples(self, examples, n_samples=1, on_done=None, skip=(), schedule="async"):
        for e in examples:
            pred = e.answers[0] if e.id in self.right else "wrong"
            on_done(trajectory(list(e.answers), example_id=e.id, prediction=pred, finish_reason="answer"))


def _run(root, method, dataset, right, n=4, corpus="/data/wiki-18.jsonl", topk=3):
    examples = [Example(id=f"{dataset}{i}", question=f"Q{i}?", answers=[f"A{i}"]) for i in range(n)]
    manifest = RunManifest(method=method, dataset=dataset, split="test", model="m", corpus=corpus, topk=topk)
    method_ = Answers(method, [f"{dataset}{i}" for i in right])
    evaluate(method_, examples, root / f"{method}-{dataset}", ("em",), manifest)


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    _run(root, "search_r1", "nq", [0, 1, 2])  # 0.75
    _run(root, "search_r1", "2wikimultihopqa", [0])  # 0.25: the board calls it 2wiki
    _run(root, "search_r1", "demo", [0, 1])  # not a board set: left out of the file
    _run(root, "research", "hotpotqa", [1, 3])  # 0.5
    return root


def test_export_round_trips_to_the_reports_numbers(runs, tmp_path):
    out = tmp_path / "report"
    rep = write_report([str(runs)], out, "md,searchagent-leaderboard", bootstrap=10)
    files = sorted((out / "searchagent-leaderboard").glob("*.json"))
    assert [f.name for f in files] == ["research.json", "search_r1.json"]
    doc = json.loads(files[1].read_text())
    assert doc["config"]["model_name"] == "search_r1" and list(doc["results"]) == ["nq", "2wiki"]
    assert read_board_file(files[1]) == {"nq": 0.75, "2wiki": 0.25}
    assert read_board_file(files[0]) == {"hotpotqa": 0.5}
    # the same numbers the report's leaderboard holds
    for row in rep.leaderboard.rows:
        back = read_board_file(out / "searchagent-leaderboard" / f"{row.key[0]}.json")
        names = {"2wikimultihopqa": "2wiki"}
        for ds, cell in row.cells.items():
            if ds != "demo":
                assert back[names.get(ds, ds)] == pytest.approx(cell.ci["em"].mean, abs=0)


def test_rows_off_the_boards_setting_are_refused_unless_asked(tmp_path):
    root = tmp_path / "runs"
    _run(root, "bm25agent", "nq", [0], corpus="/data/demo/corpus.jsonl", topk=5)
    out = tmp_path / "report"
    with pytest.raises(ValueError) as e:
        write_report([str(root)], out, "md,searchagent-leaderboard", bootstrap=10)
    msg = str(e.value)
    assert "bm25agent on nq: corpus /data/demo/corpus.jsonl (board: wiki-18" in msg and "top-5 (board: top-3)" in msg
    assert not out.exists()  # all or none: not even the Markdown
    write_report([str(root)], out, "searchagent-leaderboard", bootstrap=10, any_setting=True)
    assert read_board_file(out / "searchagent-leaderboard" / "bm25agent.json") == {"nq": 0.25}


def test_cli_names_the_incomplete_run_and_the_flag(tmp_path):
    from cli.main import app

    result = CliRunner().invoke(
        app, ["report", str(FIX / "*"), "--out", str(tmp_path / "r"), "--format", "searchagent-leaderboard"]
    )
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert "research on bamboogle:" in text and "incomplete run" in text and "--any-setting" in text
    assert "Traceback" not in result.output


def test_no_board_set_at_all_is_an_error(tmp_path):
    root = tmp_path / "runs"
    _run(root, "m", "demo", [0])
    runs, _ = load_runs([str(root)])
    lb = build_leaderboard(runs, metrics=("em",), b=10)
    from benchmarks.leaderboard_export import board_files

    with pytest.raises(ValueError, match="no run on any of the board's sets"):
        board_files(lb, "searchagent-leaderboard")
