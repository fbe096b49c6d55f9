"""Which runs ``harness report`` reads (issue 23, defects 6 and 9): run folders are found at any
depth and what is passed over is said with why; a corrupt run file is named by ``file:line``
with no traceback, and the report is written all or none."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.safe_delete import MARKER

FIX = Path(__file__).resolve().parents[1] / "fixtures"
runner = CliRunner()


def _text(result) -> str:
    return " ".join(result.output.split())  # rich wraps long lines


@pytest.fixture
def runs_tree(tmp_path, monkeypatch) -> Path:
    """``runs/`` as ``make demo`` and ``harness replicate`` leave it, plus a folder of notes."""
    root = tmp_path / "runs"
    for name in ("naive-demo-test", "research-demo-test"):
        shutil.copytree(FIX / "runs" / name, root / "demo" / "eval" / name)
    shutil.copytree(
        FIX / "runs" / "research-bamboogle-test", root / "replicate" / "research" / "research-bamboogle-test"
    )
    model = root / "demo" / "sft" / "model"  # a training run, with one validation (an eval run inside it)
    model.mkdir(parents=True)
    (model / "metrics.jsonl").write_text(
        '{"schema": 1, "step": 1, "loss": 2.0}\n{"schema": 1, "step": 2, "loss": 1.5}\n'
    )
    shutil.copytree(FIX / "runs" / "naive-demo-test", model / "validation" / "step-2" / "research-demo-test")
    (root / "demo" / "sft" / "train.jsonl").write_text("{}\n")
    (root / "demo" / "report").mkdir()
    (root / "demo" / "report" / "demo.md").write_text("# demo\n")
    shutil.copytree(FIX / "runs" / "naive-demo-test", root / "demo" / ".stale-20261127" / "naive-demo-test")
    (root / "notes").mkdir()
    (root / "notes" / "todo.txt").write_text("x\n")
    monkeypatch.chdir(tmp_path)
    return root


def test_runs_are_found_at_any_depth_and_skips_are_explained(runs_tree):
    from benchmarks.report import find_runs

    found = find_runs(["runs/*"])
    names = sorted(p.name for p in found.runs)
    # validation runs inside a training run and moved-aside (.stale-*) runs are not leaderboard rows
    assert names == ["naive-demo-test", "research-bamboogle-test", "research-demo-test"]
    assert [p.name for p in found.training] == ["model"]
    skipped = "\n".join(found.skipped)
    assert "runs/demo/report: no run inside" in skipped and "runs/notes: no run inside" in skipped
    assert "runs/demo/.stale-20261127: hidden folder" in skipped
    assert len(found.skipped) == 3  # each folder once, the topmost without a run
    result = runner.invoke(app, ["report", "runs/*", "--out", "out", "--format", "md"])
    assert result.exit_code == 0, result.output
    out = _text(result)
    assert "skipped runs/notes: no run inside" in out and "3 runs" in out and "training curves in curves/" in out
    md = Path("out/leaderboard.md").read_text()
    assert "| naive |" in md and "| research |" in md and "runs/notes: no run inside" in md


def test_a_parent_folder_of_runs_works(runs_tree):
    result = runner.invoke(app, ["report", "runs/demo", "--out", "out", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert "no run directories found" not in result.output
    csv = Path("out/leaderboard.csv").read_text()
    assert ",naive,smollm2-135m-instruct" in csv and ",research," in csv and "bamboogle" not in csv


def test_a_pattern_with_no_run_is_still_an_error(runs_tree):
    result = runner.invoke(app, ["report", "runs/notes", "--out", "out"])
    assert result.exit_code != 0 and "no run directories found in 'runs/notes'" in _text(result)
    assert not Path("out").exists()


def _corrupt(run: Path, line: str) -> None:
    path = run / "trajectories.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = line
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("line", "why"),
    [('{"example_id": "d2", "segm', "malformed JSON"), ('{"example_id": 3}', "not a trajectory record")],
)
def test_a_corrupt_trajectories_file_is_named_by_file_and_line(tmp_path, line, why):
    for name in ("naive-demo-test", "research-demo-test"):
        shutil.copytree(FIX / "runs" / name, tmp_path / "runs" / name)
    _corrupt(tmp_path / "runs" / "research-demo-test", line)
    where = f"research-demo-test/trajectories.jsonl:2: {why}"
    # With other runs readable: the bad run is skipped, named by file:line, and every file is written.
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(tmp_path / "runs" / "*"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert result.exception is None and "Traceback" not in result.output
    assert "skipped" in result.output and where in _text(result)
    assert sorted(p.name for p in out.iterdir() if p.name != MARKER) == [
        "leaderboard.csv",
        "leaderboard.md",
        "leaderboard.tex",
        "report.html",
    ]
    assert where in (out / "leaderboard.md").read_text() and where in (out / "report.html").read_text()
    # The only run corrupt: a one-line error naming file:line, exit 1, and no file written at all.
    alone = tmp_path / "alone"
    result = runner.invoke(app, ["report", str(tmp_path / "runs" / "research-demo-test"), "--out", str(alone)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert where in _text(result) and "Traceback" not in result.output
    assert not alone.exists()


def test_report_files_are_written_all_or_none(tmp_path, monkeypatch):
    import benchmarks.report_write as report_write

    out = tmp_path / "report"
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md"])
    assert result.exit_code == 0, result.output
    previous = (out / "leaderboard.md").read_text()  # the previous report, harness's own
    (out / "demo.md").write_text("not the report's\n")

    def broken(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(report_write, "to_html", broken)  # md renders first, then html fails
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md,html"])
    assert result.exit_code == 2 and "disk full" in result.output
    assert (out / "leaderboard.md").read_text() == previous  # not half replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # no temporary folder left
    monkeypatch.undo()
    (out / "report.html").mkdir()  # a file that cannot be written: nothing is replaced
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md,html"])
    assert result.exit_code == 2 and "cannot write the report" in _text(result)
    assert (out / "leaderboard.md").read_text() == previous
    (out / "report.html").rmdir()
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md,html"])
    assert result.exit_code == 0, result.output
    assert "## Leaderboard" in (out / "leaderboard.md").read_text() and (out / "report.html").is_file()
    assert (out / "demo.md").read_text() == "not the report's\n"  # files the report does not write stay
    assert json.loads((out / "report.html").read_text().split('id="data">')[1].split("</script>")[0])["rows"]


def test_report_never_replaces_a_file_it_did_not_write(tmp_path):
    """Issue 31 defect 9: a hand-written ``leaderboard.md`` in ``--out`` was overwritten. A file
    the report would replace must be one harness wrote there (the marker records them); anything
    else is refused by name and nothing is written. Its own files are replaced on the next run."""
    out = tmp_path / "report"
    out.mkdir()
    (out / "leaderboard.md").write_text("my own leaderboard\n")
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md,html"])
    assert result.exit_code == 2, result.output
    assert "leaderboard.md, which harness did not write there; nothing was written" in _text(result)
    assert (out / "leaderboard.md").read_text() == "my own leaderboard\n"
    assert sorted(p.name for p in out.iterdir()) == ["leaderboard.md"]  # not even report.html
    (out / "leaderboard.md").rename(out / "mine.md")
    for _ in range(2):  # written, then replaced: its own files
        result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(out), "--format", "md,html"])
        assert result.exit_code == 0, result.output
    assert (out / "mine.md").read_text() == "my own leaderboard\n"
    # a report folder is not another harness output: an eval run folder is refused
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(tmp_path / "runs"), "--format", "md"])
    assert result.exit_code == 0, result.output
    from harness.safe_delete import claim

    claim(tmp_path / "evalrun", "eval")
    result = runner.invoke(app, ["report", str(FIX / "runs" / "*"), "--out", str(tmp_path / "evalrun")])
    assert result.exit_code == 2 and "is a harness 'eval' output, not a 'report' one" in _text(result)


def test_report_and_eval_agree_on_runs_with_failed_items(tmp_path):
    """Issue 31 defect 4: for a run with failed items ``results.json`` said EM 66.7 (n=12) and the
    report ``40.0 (20/39, 8 err)``, failures counted as 0. One rule now
    (:func:`benchmarks.evaluate.item_values`): failed items are left out of every mean and
    counted apart; a run whose items all failed shows no score, not 0.0."""
    from benchmarks.datasets import load_examples
    from benchmarks.report import build_leaderboard, load_runs
    from benchmarks.report_render import to_markdown
    from programs.faults.kit import RetrievalServer
    from tests.harness.test_eval_failures import http_args, write_script

    script = write_script(tmp_path / "s.jsonl", load_examples("demo"))
    server = RetrievalServer()
    try:
        for fail_after, label in ((3, "some"), (1, "all")):  # after the preflight (and two items)
            server.fail_after, server.requests = fail_after, 0
            extra = ("agent.max_concurrency=1", "stop_after_failures=0", "--label", label)
            res = runner.invoke(app, http_args(script, tmp_path / "runs", server.url, *extra))
            assert res.exit_code == 1, res.output
    finally:
        server.close()
    some = json.loads((tmp_path / "runs" / "some-demo-test" / "results.json").read_text())
    assert (some["n"], some["errors"], some["metrics"]["em"]) == (2, 4, 1.0)
    runs, _ = load_runs([str(tmp_path / "runs")])
    lb = build_leaderboard(runs, metrics=("em",))
    cells = {r.label: r.cells["demo"] for r in lb.rows}
    assert cells["some"].ci["em"].mean == some["metrics"]["em"] and cells["some"].run.n == some["n"]
    assert cells["some"].run.errors == some["errors"] and cells["some"].run.status == "2/6, 4 err"
    md = to_markdown(lb)
    assert "| some | 100.0 [100.0, 100.0] (2/6, 4 err) |" in md, md
    assert "| all | – (0/6, 6 err) |" in md, md  # no score, never 0.0
    every = json.loads((tmp_path / "runs" / "all-demo-test" / "results.json").read_text())
    assert every["metrics"]["em"] is None and every["n"] == 0
    assert "failed items are left out of every mean" in md
