"""Training curves (issue 19): training run folders given to ``harness report`` (or to
:func:`benchmarks.training_curves.write_training_curves`) are drawn against step, in the HTML and
as PNG files, from the numbers in their ``metrics.jsonl``, several runs on the same axes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.training_curves import (
    SMOOTH_WINDOW,
    curves_data,
    figure,
    load_training_runs,
    panels,
    smoothed,
    write_training_curves,
)
from cli.main import app

FIX = Path(__file__).resolve().parents[1] / "fixtures"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()

# Run "sync": every quantity the RL trainer logs (training/rl/trainer.py, training/logging_utils.py),
# with validation records in the log at steps 2 and 4, as Trainer.run_validation writes them.
SYNC = [
    {
        "step": s,
        "reward/mean": 0.1 * s,
        "reward/std": 0.05,
        "reward/f1": 0.08 * s,
        "reward/format_valid": 1.0 - 0.1 * s,
        "em": 0.02 * s,
        "kl": 0.001 * s * s,
        "clip_frac": 0.3 / s,
        "entropy": 2.5 - 0.1 * s,
        "response_tokens": 40.0 + s,
        "searches": 0.5 * s,
        "loss": -0.01 * s,
        "time/step_s": 1.5,
    }
    for s in range(1, 6)
]
SYNC_VAL = [{"step": 2, "val/em": 0.25, "val/f1": 0.4}, {"step": 4, "val/em": 0.5, "val/f1": 0.55}]
# Run "async": fewer quantities (no KL logged, no components), validation only as run folders.
# It logs what trainer.async adds (staleness, the trainer's wait), as training/rl/async_rollout.py names them,
# and the engine-vs-trainer mismatch a rollout correction acts on (training.losses.mismatch_stats).
ASYNC = [
    {
        "step": s,
        "reward/mean": 0.3 + 0.05 * s,
        "searches": 1.0,
        "entropy": 2.0,
        "mismatch/abs_log_ratio": 0.01 * s,
        "mismatch/kl_k3": 1e-4 * s,
        "mismatch/ratio_p5": 0.9,
        "mismatch/ratio_p50": 1.0,
        "mismatch/ratio_p95": 1.1 + 0.1 * s,
        "mismatch/corrected_frac": 0.05 * s,
        "mismatch/weight_mean": 1.0,
        "async/staleness_mean": 0.5,
        "async/trainer_wait_s": 0.2 * s,
    }
    for s in range(1, 4)
]


def _write_log(run: Path, records: list[dict]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({"schema": 1, **r}) + "\n")


@pytest.fixture
def two_runs(tmp_path) -> list[Path]:
    sync, asyn = tmp_path / "runs" / "sync", tmp_path / "runs" / "async"
    _write_log(sync, [*SYNC[:2], SYNC_VAL[0], *SYNC[2:4], SYNC_VAL[1], SYNC[4]])
    _write_log(asyn, ASYNC)
    # async's validation at step 3 exists only as an eval run folder (harness eval's layout)
    shutil.copytree(FIX / "runs" / "naive-demo-test", asyn / "validation" / "step-3" / "search_r1-demo-test")
    return [sync, asyn]


def _expected(records: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in records if key in r]


@pytest.mark.slow  # a dozen PNGs: seconds on a busy 2-core machine
def test_pngs_are_drawn_for_the_logged_quantities_only(two_runs, tmp_path):
    paths = write_training_curves(two_runs, tmp_path / "out")
    names = [p.name for p in paths]
    assert names == [
        "reward_mean.png",
        "reward_f1.png",
        "reward_format_valid.png",  # components follow the mean; reward/std is not a component
        "kl.png",
        "clip_frac.png",
        "entropy.png",
        "mismatch_abs_log_ratio.png",  # the async run's engine-vs-trainer mismatch
        "mismatch_kl_k3.png",
        "mismatch_ratio_p5.png",
        "mismatch_ratio_p50.png",
        "mismatch_ratio_p95.png",
        "mismatch_corrected_frac.png",
        "response_tokens.png",
        "searches.png",
        "em.png",  # the rollouts' EM (logged by sync only)
        "val_em.png",
        "val_f1.png",
        "val_acc.png",  # from async's validation run folder (results.json) only
        "val_cover_em.png",
        "loss.png",
        "async_staleness_mean.png",  # trainer.async's, logged by the async run only
        "async_trainer_wait_s.png",
        "time_step_s.png",
    ]
    assert "approx_kl.png" not in names  # logged by no run: skipped, not drawn empty
    for p in paths:
        assert p.parent == tmp_path / "out" / "curves" and p.read_bytes().startswith(PNG_MAGIC)
        assert p.stat().st_size > 5000  # a drawn chart, not an empty canvas


def test_plotted_lines_are_the_runs_metrics(two_runs):
    runs = load_training_runs(two_runs)
    assert [r.label for r in runs] == ["sync", "async"]
    by_key = {p.key: p for p in panels(runs)}
    for key, lines in {
        "reward/mean": [("sync", _expected(SYNC, "reward/mean")), ("async", _expected(ASYNC, "reward/mean"))],
        "kl": [("sync", _expected(SYNC, "kl"))],  # async logged no KL: no line for it
        "clip_frac": [("sync", _expected(SYNC, "clip_frac"))],
        "entropy": [("sync", _expected(SYNC, "entropy")), ("async", _expected(ASYNC, "entropy"))],
        "response_tokens": [("sync", _expected(SYNC, "response_tokens"))],
        "mismatch/ratio_p95": [("async", _expected(ASYNC, "mismatch/ratio_p95"))],
        "mismatch/corrected_frac": [("async", _expected(ASYNC, "mismatch/corrected_frac"))],
        "searches": [("sync", _expected(SYNC, "searches")), ("async", _expected(ASYNC, "searches"))],
        "reward/f1": [("sync", _expected(SYNC, "reward/f1"))],
        # the log's validation records for sync; async's validation run's results.json (em 0.2)
        "val/em": [("sync", [(2, 0.25), (4, 0.5)]), ("async", [(3, 0.2)])],
    }.items():
        ax = figure(by_key[key], runs).axes[0]
        got = [(line.get_label(), [tuple(xy) for xy in line.get_xydata().tolist()]) for line in ax.lines]
        assert got == [(label, [(float(s), pytest.approx(v)) for s, v in pts]) for label, pts in lines], key


@pytest.mark.slow  # a dozen PNGs: seconds on a busy 2-core machine
def test_the_png_files_are_those_figures(two_runs, tmp_path):
    import io

    runs = load_training_runs(two_runs)
    paths = {p.name: p for p in write_training_curves(two_runs, tmp_path / "out")}
    for panel in panels(runs)[:3]:
        buf = io.BytesIO()
        figure(panel, runs).savefig(buf, format="png")
        assert paths[Path(panel.file).name].read_bytes() == buf.getvalue(), panel.key
    # and a figure drawn from other numbers is another picture
    runs[0].series["reward/mean"][0] = (1, 9.0)
    buf = io.BytesIO()
    figure(panels(runs)[0], runs).savefig(buf, format="png")
    assert paths["reward_mean.png"].read_bytes() != buf.getvalue()


@pytest.mark.slow  # a dozen PNGs: seconds on a busy 2-core machine
def test_html_charts_carry_the_runs_metrics(two_runs, tmp_path):
    out = tmp_path / "report"
    result = runner.invoke(app, ["report", *map(str, two_runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "23 training curves in curves/" in " ".join(result.output.split())
    html = (out / "report.html").read_text()
    data = json.loads(html.split('<script type="application/json" id="data">')[1].split("</script>")[0])
    training = data["training"]
    assert [r["label"] for r in training["runs"]] == ["sync", "async"]
    panel = {p["key"]: p for p in training["panels"]}
    for key, records in (("reward/mean", SYNC), ("kl", SYNC), ("searches", SYNC), ("entropy", SYNC)):
        series = panel[key]["series"][0]
        assert series["run"] == "sync"
        assert list(zip(series["steps"], series["values"], strict=True)) == _expected(records, key)
    assert panel["reward/mean"]["series"][1] == {
        "run": "async",
        "steps": [1, 2, 3],
        "values": [pytest.approx(0.35), pytest.approx(0.4), pytest.approx(0.45)],
    }
    assert [s["run"] for s in panel["kl"]["series"]] == ["sync"]
    p95 = panel["mismatch/ratio_p95"]["series"]
    assert [s["run"] for s in p95] == ["async"]
    assert p95[0]["values"] == [pytest.approx(1.1 + 0.1 * s) for s in (1, 2, 3)]
    # Every chart in the page has its PNG beside it, and the Markdown links them.
    assert sorted(p["file"] for p in training["panels"]) == sorted(
        f"curves/{p.name}" for p in (out / "curves").iterdir()
    )
    md = (out / "leaderboard.md").read_text()
    assert "## Training curves" in md and "![KL to the reference policy](curves/kl.png)" in md
    assert "No evaluation runs in this report." in md


def test_training_and_evaluation_runs_in_one_report(two_runs, tmp_path):
    out = tmp_path / "report"
    args = ["report", str(FIX / "runs" / "*"), str(two_runs[0]), "--out", str(out), "--format", "html,md"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads((out / "report.html").read_text().split('id="data">')[1].split("</script>")[0])
    assert len(data["rows"]) == 2 and [r["label"] for r in data["training"]["runs"]] == ["sync"]


def test_a_value_that_is_not_finite_is_a_gap_and_a_repeated_step_keeps_the_last(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.jsonl").write_text(
        '{"step": 1, "kl": 0.1}\n{"step": 2, "kl": NaN}\n{"step": 3, "kl": 0.3}\n{"step": 3, "kl": 0.4}\n'
    )
    (r,) = load_training_runs([run])
    assert r.series["kl"] == [(1, 0.1), (2, None), (3, 0.4)]
    assert any("step 3 logged more than once" in n for n in r.notes)
    line = figure(panels([r])[0], [r]).axes[0].lines[0]
    ys = line.get_ydata().tolist()
    assert ys[0] == 0.1 and ys[1] != ys[1] and ys[2] == 0.4  # NaN: matplotlib leaves a gap


def test_corrupt_metrics_line_names_file_and_line(tmp_path, two_runs):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"step": 1, "kl": 0.1}\n{"step": 2, "kl"\n{"step": 3, "kl": 0.3}\n')
    with pytest.raises(ValueError, match=r"bad/metrics.jsonl:2: malformed JSON"):
        write_training_curves([bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written
    (bad / "metrics.jsonl").write_text('{"kl": 0.1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:1: a metrics record needs an integer 'step'"):
        load_training_runs([bad])
    # In a report the unreadable run is listed with why; the others are drawn.
    result = runner.invoke(app, ["report", str(bad), str(two_runs[0]), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert "skipped" in result.output and "metrics.jsonl:1" in " ".join(result.output.split())


def test_labels_tell_runs_apart():
    from benchmarks.training_curves import run_labels

    assert run_labels([Path("runs/demo/sft/model"), Path("runs/demo/rl/model")]) == ["sft/model", "rl/model"]
    assert run_labels([Path("a/x"), Path("b/x"), Path("c/y")]) == ["a/x", "b/x", "y"]


def test_a_long_runs_reward_gets_its_trailing_mean_in_png_and_html(tmp_path):
    # 12 steps of a noisy reward (step 7 not finite: a gap); the trend is the mean of the last
    # SMOOTH_WINDOW finite values, drawn dashed after the run's own line, and the HTML gets the same numbers
    rewards = [0.1, 0.9, 0.2, 0.8, 0.3, 0.7, float("nan"), 0.6, 0.5, 1.0, 0.4, 0.9]
    run = tmp_path / "long"
    _write_log(run, [{"step": i + 1, "reward/mean": r, "entropy": 1.0} for i, r in enumerate(rewards)])
    finite = [r for r in rewards if r == r]
    want = []
    for i, r in enumerate(rewards):
        seen = [x for x in rewards[: i + 1] if x == x][-SMOOTH_WINDOW:]
        want.append(None if r != r else sum(seen) / len(seen))
    assert len(finite) == 11 and want[4] == pytest.approx(0.46) and want[7] == pytest.approx(0.52)
    runs = load_training_runs([run])
    by_key = {p.key: p for p in panels(runs)}
    lines = figure(by_key["reward/mean"], runs).axes[0].lines
    assert [line.get_label() for line in lines] == ["long", f"long: mean of {SMOOTH_WINDOW} steps"]
    trend = lines[1].get_ydata().tolist()
    assert [None if v != v else pytest.approx(v) for v in trend] == want
    assert len(figure(by_key["entropy"], runs).axes[0].lines) == 1  # only reward panels are smoothed
    series = {p["key"]: p["series"][0] for p in curves_data(runs)["panels"]}
    assert series["reward/mean"]["smoothed"] == [None if w is None else pytest.approx(w) for w in want]
    assert "smoothed" not in series["entropy"]
    # a short run (the other tests' five steps) has no trend: too few steps to average
    assert smoothed("reward/mean", [0.1] * (2 * SMOOTH_WINDOW - 1)) is None
    assert smoothed("reward/std", [0.1] * 20) is None
