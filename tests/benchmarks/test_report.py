"""``harness report`` on fixture run directories: golden md/csv/tex, partial and failed runs,
paired significance, --rescore, --reference, the HTML data, and clear errors.

Regenerate the fixtures with ``python tests/fixtures/make_runs.py`` and the golden files with
``UPDATE_GOLDEN=1 pytest tests/benchmarks/test_report.py`` (then read the diff before committing).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from benchmarks.report import build_leaderboard, load_reference, load_runs
from cli.main import app
from harness.safe_delete import MARKER
from tests.helpers.trajectories import trajectory

FIX = Path(__file__).resolve().parents[1] / "fixtures"
RUNS = str(FIX / "runs" / "*")
GOLDEN = FIX / "report_golden"
REFERENCE = Path(__file__).resolve().parents[2] / "configs" / "reference" / "published.yaml"
runner = CliRunner()


def _board(**kw):
    runs, skipped = load_runs([RUNS])
    return build_leaderboard(runs, skipped=skipped, **kw)


def _row(lb, method):
    return next(r for r in lb.rows if r.key[0] == method)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    result = runner.invoke(app, ["report", RUNS, "--out", str(out), "--baseline", "naive"])
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.parametrize("name", ["leaderboard.md", "leaderboard.csv", "leaderboard.tex"])
def test_golden_files(report_dir, name):
    got = (report_dir / name).read_text()
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / name).write_text(got)
    assert got == (GOLDEN / name).read_text()


def test_unwritable_out_dir_is_a_clear_error():
    result = runner.invoke(app, ["report", RUNS, "--out", "/dev/null/x", "--format", "md"])
    # /dev/null/x cannot be created: a clear error, not a traceback.
    assert result.exit_code != 0 and "error" in result.output


def test_terminal_output(tmp_path):
    result = runner.invoke(app, ["report", RUNS, "--out", str(tmp_path), "--format", "md,tex"])
    assert result.exit_code == 0, result.output
    assert "research" in result.stdout and "80.0 [40.0, 100.0]" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != MARKER) == ["leaderboard.md", "leaderboard.tex"]


def test_partial_and_failed_runs_are_shown_not_averaged():
    lb = _board()
    research, naive = _row(lb, "research"), _row(lb, "naive")
    partial = research.cells["bamboogle"].run
    assert (partial.n, partial.n_total, partial.complete, partial.status) == (4, 6, False, "4/6")
    assert research.average == {"em": None, "f1": None, "acc": None, "cover_em": None}
    # naive's one failed item is left out of its n and its mean (as results.json does), so that
    # run is not complete and the row has no average.
    failed = naive.cells["bamboogle"].run
    assert (failed.n, failed.errors, failed.complete, failed.status) == (5, 1, False, "5/6, 1 err")
    assert naive.cells["bamboogle"].ci["em"].mean == pytest.approx(2 / 5) and naive.average["em"] is None
    # Neither bamboogle run is complete: no "best" there (research's 75% is partial).
    assert ("bamboogle", "em") not in lb.best
    assert lb.is_best("demo", "em", research.cells["demo"].ci["em"].mean)


def test_run_without_results_json_is_partial_even_when_all_items_are_scored(tmp_path):
    run = tmp_path / "naive-demo-test"
    shutil.copytree(FIX / "runs" / "naive-demo-test", run)
    (run / "results.json").unlink()
    (summary,), _ = load_runs([str(run)])
    assert (summary.n, summary.n_total, summary.complete) == (5, 5, False)
    assert summary.status == "partial: no results.json"


def test_bootstrap_cell_matches_a_hand_computation():
    # naive on demo: EM per item d1..d5 = 0, 1, 0, 0, 0 (only "Lunne" matches).
    cell = _row(_board(), "naive").cells["demo"]
    values = [0.0, 1.0, 0.0, 0.0, 0.0]
    idx = np.random.default_rng(0).integers(0, 5, size=(1000, 5))
    means = np.sort([sum(values[j] for j in row) / 5 for row in idx])
    assert cell.ci["em"].mean == pytest.approx(0.2)
    assert cell.ci["em"].low == pytest.approx(np.percentile(means, 2.5))
    assert cell.ci["em"].high == pytest.approx(np.percentile(means, 97.5))
    assert cell.ci["em"].high == pytest.approx(0.6)  # P(2+ copies of d2 in 5 draws) > 2.5%, P(4+) is not


def test_paired_significance_against_the_baseline():
    research = _row(_board(baseline="naive"), "research")
    em, acc = research.cells["demo"].vs_baseline["em"], research.cells["demo"].vs_baseline["acc"]
    # Per item research - naive, EM: +1, 0, +1, +1, 0 (d1, d3, d4 won; none lost): significant.
    assert (em.n, em.diff, em.significant) == (5, pytest.approx(0.6), True)
    # Acc: +1, 0, 0, +1, 0; a resample of only ties has probability (3/5)^5 = 7.8% > 2.5%.
    assert (acc.diff, acc.low, acc.significant) == (pytest.approx(0.4), 0.0, False)
    # Bamboogle: only the 4 items the partial run finished are shared.
    assert research.cells["bamboogle"].vs_baseline["em"].n == 4
    assert _row(_board(baseline="naive"), "naive").cells["demo"].vs_baseline == {}


def test_samples_of_one_item_are_averaged_before_resampling(tmp_path):
    run = tmp_path / "naive-demo-test"
    shutil.copytree(FIX / "runs" / "naive-demo-test", run)
    scores = [json.loads(x) for x in (run / "scores.jsonl").read_text().splitlines()]
    extra = [dict(s, sample_index=1, em=1.0) for s in scores]
    (run / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores + extra))
    (summary,), _ = load_runs([str(run)])
    assert summary.item_values("em") == {"d1": 0.5, "d2": 1.0, "d3": 0.5, "d4": 0.5, "d5": 0.5}


def test_html_is_self_contained_with_embedded_data(report_dir):
    html = (report_dir / "report.html").read_text()
    assert "https://" not in html and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "<script src" not in html and "<link" not in html
    blob = html.split('<script type="application/json" id="data">')[1].split("</script>")[0]
    assert "</" not in blob  # a retrieved doc holds "</script>": escaped, the block stays whole
    data = json.loads(blob)
    assert data["datasets"] == ["bamboogle", "demo"] and len(data["items"]) == 5 + 6 + 5 + 4
    assert data["baseline"] == "naive" and data["rows"][1]["cells"]["demo"]["vs"]["em"]["sig"] is True
    item = next(i for i in data["items"] if i["error"])
    assert item["finish_reason"] == "error" and item["method"] == "naive"
    research = next(i for i in data["items"] if i["method"] == "research" and i["id"] == "d2")
    assert [s["role"] for s in research["steps"]] == ["prompt", "model", "search", "observation"] + [
        "model",
        "search",
        "observation",
        "model",
    ]
    assert research["steps"][2]["docs"][0]["text"].startswith("some text </script>")


def test_reference_rows_are_labelled_published(tmp_path):
    result = runner.invoke(app, ["report", RUNS, "--out", str(tmp_path), "--reference", "--format", "md,csv,latex"])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "leaderboard.md").read_text()
    assert "not directly comparable" in md
    # Systems with a replication card take their published rows from the card (configs/replicate/).
    assert "| ReSearch (published) | agentrl/ReSearch-Qwen-7B-Instruct (Qwen2.5-7B-Instruct, GRPO) | EM | 43.52 |" in md
    assert "replication card configs/replicate/research.yaml" in md
    assert "| R1-Searcher (published) |" in md and "| Cover-EM | 65.4 |" in md
    # The file's rows follow: the papers' other rows and independent reproductions, each with its kind,
    # setting and source (issue 49).
    assert "| FlashRAG IRCoT (published) |" in md and "| Search-R1 (SkyRL, 3 turns) (published) |" in md
    assert "independent reproduction, GRPO" in md and "NovaSky-AI/SkyRL docs/content/docs/recipes/overview.mdx" in md
    csv_lines = (tmp_path / "leaderboard.csv").read_text().splitlines()
    from benchmarks.replication_cards import reference_entries

    assert sum(line.startswith("published,") for line in csv_lines) == sum(
        len(e["values"]) for e in reference_entries(str(REFERENCE))
    )
    assert "System (published)" in (tmp_path / "leaderboard.tex").read_text()


def test_reference_entries_must_carry_their_setting(tmp_path):
    from benchmarks.datasets import DATASETS

    bad = tmp_path / "ref.yaml"
    bad.write_text("entries:\n  - {system: X, model: M, metric: EM, values: {hotpotqa: 1.0}}\n")
    with pytest.raises(ValueError, match="lacks"):
        load_reference(bad)
    good = dict(load_reference(REFERENCE)[0])
    for change, error in (({"kind": "blog"}, "kind 'blog' is not one of"), ({"source": "a paper"}, "source must name")):
        bad.write_text(yaml.safe_dump({"entries": [{**good, **change}]}))
        with pytest.raises(ValueError, match=error):
            load_reference(bad)
    entries = load_reference(REFERENCE)
    assert {e["kind"] for e in entries} == {"paper", "independent reproduction"}
    for e in entries:
        assert set(e["values"]) <= set(DATASETS.names()), e["system"]  # harness dataset names
        assert all(0 <= v <= 100 for v in e["values"].values()), e["system"]  # percent
        assert str(e["read"]).startswith("2026-"), e["system"]


def _digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_rescore_recomputes_from_trajectories_without_touching_the_run(tmp_path):
    run = tmp_path / "naive-demo-test"
    shutil.copytree(FIX / "runs" / "naive-demo-test", run)
    scores = [json.loads(x) for x in (run / "scores.jsonl").read_text().splitlines()]
    for s in scores:
        s["em"] = 0.0  # stale scores from older metric code
    (run / "scores.jsonl").write_text("".join(json.dumps(s) + "\n" for s in scores))
    before = _digest(run)
    for flag, em in (([], "0.0000"), (["--rescore"], "0.2000")):  # with current metrics only "Lunne" matches
        out = tmp_path / f"r{len(flag)}"
        result = runner.invoke(app, ["report", str(run), "--out", str(out), "--format", "csv", *flag])
        assert result.exit_code == 0, result.output
        line = next(x for x in (out / "leaderboard.csv").read_text().splitlines() if ",demo,em," in x)
        assert line.split(",")[6] == em
    assert _digest(run) == before


def test_unreadable_runs_are_listed_not_dropped(tmp_path):
    for name in ("naive-demo-test", "research-demo-test"):
        shutil.copytree(FIX / "runs" / name, tmp_path / name)
    (tmp_path / "research-demo-test" / "scores.jsonl").write_text('{"id": "d1"}\nnot json\n{"id": "d2"}\n')
    result = runner.invoke(app, ["report", str(tmp_path / "*"), "--out", str(tmp_path / "r"), "--format", "md"])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "research-demo-test" in result.output
    assert "Skipped (not in this report, and why)" in (tmp_path / "r" / "leaderboard.md").read_text()


def test_errors(tmp_path):
    result = runner.invoke(app, ["report", str(tmp_path / "nothing*"), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "no run directories found" in result.output
    # One good glob does not hide a mistyped one.
    result = runner.invoke(app, ["report", RUNS, str(tmp_path / "typo*"), "--out", str(tmp_path)])
    assert result.exit_code != 0 and "typo*" in result.output
    result = runner.invoke(app, ["report", RUNS, "--out", str(tmp_path), "--baseline", "ircot"])
    assert result.exit_code != 0 and "'ircot' is not among the methods" in result.output
    result = runner.invoke(app, ["report", RUNS, "--out", str(tmp_path), "--format", "md,pdf"])
    assert result.exit_code != 0 and "unknown format 'pdf'" in result.output


def test_browser_shows_a_baselines_searches_before_its_answer():
    from benchmarks.report_html import _steps
    from harness.types import Doc, SearchRecord, Segment

    t = trajectory(
        ["A"],
        question="Q?",
        method="ircot",
        segments=[Segment("prompt", [1], "P"), Segment("model", [2], "A")],
        searches=[
            SearchRecord(1, "second", ["d2"], [0.5], 0.1, [Doc("d2", "T2", "x")]),
            SearchRecord(0, "first", ["d1"], [0.9], 0.1, [Doc("d1", "T1", "y")]),
        ],
        metadata={"baseline": "flashrag"},
    )
    steps = _steps(t)
    assert [s["role"] for s in steps] == ["prompt", "search", "search", "model"]
    assert [s.get("query") for s in steps[1:3]] == ["first", "second"]


def _summary(method: str, em: list[float]):
    from benchmarks.report import RunSummary
    from harness.run_records import ItemScore, RunResults

    scores = [ItemScore(f"q{i}", metrics={"em": v}) for i, v in enumerate(em)]
    return RunSummary(Path(method), method, "demo", "test", "m", "none", len(em), scores, RunResults(complete=True))


def test_p_values_below_what_three_decimals_show_read_p_below_0001():
    from benchmarks.fmt import p_value
    from benchmarks.report_render import paired_markdown

    assert (p_value(0.0), p_value(0.0004), p_value(0.001), p_value(0.0204)) == (
        "p<0.001",
        "p<0.001",
        "p=0.001",
        "p=0.020",
    )
    # 20 items all won: no resample has a difference <= 0, so the bootstrap's p is 0.
    lb = build_leaderboard([_summary("base", [0.0] * 20), _summary("better", [1.0] * 20)], ("em",), baseline="base")
    row = next(line for line in paired_markdown(lb) if line.startswith("| better"))
    assert "| <0.001 |" in row and "0.000" not in row


def test_user_output_cites_no_internal_document(tmp_path):
    import yaml

    from benchmarks.profiles import PROFILES

    result = runner.invoke(app, ["report", RUNS, "--out", str(tmp_path), "--reference", "--baseline", "naive"])
    assert result.exit_code == 0, result.output
    for f in tmp_path.iterdir():
        assert "REFERENCE §" not in f.read_text(), f.name
    # Everything a card or the published file says is shown somewhere (report, harness replicate).
    root = Path(__file__).resolve().parents[2] / "configs"
    for path in [root / "reference" / "published.yaml", *sorted((root / "replicate").glob("*.yaml"))]:
        assert "REFERENCE §" not in json.dumps(yaml.safe_load(path.read_text()), ensure_ascii=False), path.name
    for name in PROFILES.names():
        assert "REFERENCE §" not in PROFILES.get(name).source, name


def test_published_averages_match_their_rows():
    """A transcription check: where a note gives the source's average, it is the mean of the row's
    numbers (or the note says the source's own average is not)."""
    import re

    checked = 0
    for e in load_reference(REFERENCE):
        m = re.search(r"average (0\.\d+)", e.get("note") or "")
        if not m or "not the mean" in e["note"]:
            continue
        values = list(e["values"].values())
        assert abs(sum(values) / len(values) / 100 - float(m.group(1))) < 0.0015, e["system"]
        checked += 1
    assert checked >= 3
