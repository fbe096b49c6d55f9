"""RFT filter: outcome, extra expression, step scores (min / mean / per-step masking), dedupe,
several sources merged, the kept run read back by the SFT run source with the right loss mask,
and the ``harness data rft-filter`` command with its summary and refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from harness.run_records import ItemScore, RunManifest
from harness.runlog import RunDir
from harness.tokenization import byte_tokenizer
from harness.types import Doc, SearchRecord, Segment, Trajectory
from training.data.rft import RFTFilterConfig, rft_filter

TOK = byte_tokenizer()
runner = CliRunner()


def traj(qid: str, j: int, turns: list[str], answer: str, gold: str = "Paris", doc: str = "Paris is big") -> Trajectory:
    """Prompt, then model turns with an observation after every turn but the last."""
    segs = [Segment("prompt", TOK.encode("Q: capital?", add_special_tokens=False), "Q: capital?")]
    searches = []
    for k, text in enumerate(turns):
        segs.append(Segment("model", TOK.encode(text, add_special_tokens=False), text))
        if k < len(turns) - 1:
            obs = f"<information>{doc}</information>"
            segs.append(Segment("observation", TOK.encode(obs, add_special_tokens=False), obs))
            searches.append(SearchRecord(k, text, ["d"], [1.0], 0.0, [Doc("d", "", doc)]))
    t = Trajectory(qid, "capital?", [gold], "research", segments=segs, searches=searches, prediction=answer)
    t.finish_reason, t.sample_index = "answer", j
    return t


def make_run(path: Path, items: list[tuple[Trajectory, float]]) -> Path:
    run = RunDir(path)
    run.open(RunManifest(method="research", dataset="demo", split="test", n_total=len(items)))
    for t, em in items:
        run.append(
            t,
            ItemScore(
                t.example_id, t.sample_index, {"em": em, "f1": em}, t.prediction, t.finish_reason, len(t.searches)
            ),
        )
    return path


class KeywordScorer:
    """Scores a model turn 1.0 when it contains ``word``, else 0.0 (a stand-in learned scorer)."""

    def __init__(self, word: str = "good") -> None:
        self.word = word

    def score_steps(self, trajectory):
        from training.data.rft import model_spans

        return [(a, b, float(self.word in trajectory.segments[i].text)) for i, a, b in model_spans(trajectory)]


@pytest.fixture
def sampled(tmp_path) -> Path:
    return make_run(
        tmp_path / "k4",
        [
            (traj("q1", 0, ["<search>good</search>", "<answer>Paris good</answer>"], "Paris"), 1.0),  # all steps good
            (traj("q1", 1, ["<search>bad</search>", "<answer>Paris good</answer>"], "Paris"), 1.0),  # one bad step
            (traj("q1", 2, ["<search>good</search>", "<answer>Paris good</answer>"], "Paris"), 1.0),  # duplicate of 0
            (traj("q1", 3, ["<search>good</search>", "<answer>Rome</answer>"], "Rome"), 0.0),  # wrong
            (traj("q2", 0, ["<search>bad</search>", "<answer>Paris bad</answer>"], "Paris"), 1.0),  # no good step
        ],
    )


def decisions(out: Path) -> dict[tuple[str, int], dict]:
    recs = [json.loads(line) for line in (out / "decisions.jsonl").read_text().splitlines()]
    return {(r["id"], r["sample_index"]): r for r in recs}


def test_min_aggregation_keeps_only_right_answers_with_every_step_good(tmp_path, sampled):
    out = tmp_path / "kept"
    summary = rft_filter([sampled], out, RFTFilterConfig(step_scorer=None), scorer=KeywordScorer())
    d = decisions(out)
    assert {k: v["reason"] for k, v in d.items()} == {
        ("q1", 0): None,
        ("q1", 1): "step_score",
        ("q1", 2): "duplicate",
        ("q1", 3): "outcome",
        ("q2", 0): "step_score",
    }
    assert d[("q1", 1)]["step_scores"] == [0.0, 1.0]
    assert summary.n_in == 5 and summary.n_kept == 1 and summary.questions_kept == 1
    assert summary.dropped == {"step_score": 2, "duplicate": 1, "outcome": 1}
    on_disk = json.loads((out / "rft_summary.json").read_text())
    assert on_disk["n_kept"] == 1 and on_disk["config"]["step_agg"] == "min"
    kept = RunDir(out)
    assert [(t.example_id, t.sample_index) for t in kept.trajectories()] == [("q1", 0)]
    assert kept.scores()[0].metric("step_min") == 1.0 and kept.results().complete


def test_mean_and_per_step_modes(tmp_path, sampled):
    mean = rft_filter(
        [sampled], tmp_path / "mean", RFTFilterConfig(step_scorer=None, step_agg="mean"), scorer=KeywordScorer()
    )
    assert mean.n_kept == 2  # q1#0 (mean 1) and q1#1 (mean 0.5); q2 has mean 0
    step = rft_filter(
        [sampled], tmp_path / "step", RFTFilterConfig(step_scorer=None, step_agg="step"), scorer=KeywordScorer()
    )
    assert step.n_kept == 2
    kept = {t.metadata["rft"]["sample_index"]: t for t in RunDir(tmp_path / "step").trajectories()}
    # q1#1's bad search turn is now context: mask 0, kept as text, listed as masked.
    roles = [s.role for s in kept[1].segments]
    assert roles == ["prompt", "observation", "observation", "model"]
    assert kept[1].metadata["rft"]["masked_segments"] == [1]
    assert [s.role for s in kept[0].segments] == ["prompt", "model", "observation", "model"]


def test_sources_merge_and_sft_reads_the_kept_run_with_the_exact_mask(tmp_path, sampled):
    from training.sft.sft_data import load_sources

    other = make_run(
        tmp_path / "other", [(traj("q1", 0, ["<search>good 2</search>", "<answer>Paris good</answer>"], "Paris"), 1.0)]
    )
    out = tmp_path / "kept"
    cfg = RFTFilterConfig(step_scorer=None, step_agg="step")
    summary = rft_filter([sampled, other], out, cfg, scorer=KeywordScorer())
    assert summary.per_source[str(other)] == {"kept": 1}
    trajs = RunDir(out).trajectories()
    assert sorted((t.example_id, t.sample_index) for t in trajs) == [("q1", 0), ("q1", 1), ("q1", 2)]
    assert {t.metadata["rft"]["source"] for t in trajs} == {str(sampled), str(other)}
    loaded = load_sources([{"kind": "run", "path": str(out)}], TOK)
    assert len(loaded) == 3
    masked = next(t for t in loaded if t.segments[1].role == "observation" and "bad" in t.segments[1].text)
    trained = TOK.decode([i for i, m in zip(masked.token_ids, masked.loss_mask, strict=True) if m])
    assert trained == "<answer>Paris good</answer>"  # only the passing step is trained


def test_rule_scorer_and_where_through_the_cli(tmp_path):
    run = make_run(
        tmp_path / "run",
        [
            (traj("a", 0, ["<search>x</search>", "<answer>Paris</answer>"], "Paris"), 1.0),  # search hit gold
            (traj("b", 0, ["<search>y</search>", "<answer>Paris</answer>"], "Paris", doc="nothing here"), 1.0),
            (traj("c", 0, ["<answer>Paris</answer>"], "Paris"), 1.0),  # no search
        ],
    )
    out = tmp_path / "kept"
    args = ["data", "rft-filter", str(run), "--out", str(out), "--step-scorer", "rule", "--where", "n_searches >= 1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "kept 1 of 3" in result.output
    d = decisions(out)
    assert d[("a", 0)]["kept"] and d[("a", 0)]["step_scores"] == [1.0, 0.5]
    assert d[("b", 0)]["reason"] == "step_score" and d[("c", 0)]["reason"] == "where"
    # Scorer options by name: a lower hit score fails the 0.5 threshold; a wrong option is named.
    result = runner.invoke(app, [*args, "--step-scorer-arg", "hit=0.25"])
    assert result.exit_code != 0 and "nothing passed" in result.output
    result = runner.invoke(app, [*args, "--step-scorer-arg", "hits=1"])
    assert result.exit_code != 0 and "hits" in result.output and "format_score" in result.output
    result = runner.invoke(app, [*args, "--metric", "emm"])
    assert result.exit_code != 0 and "no metric 'emm'" in result.output
    result = runner.invoke(app, [*args[:-4], "--step-scorer", "nope"])
    assert result.exit_code != 0 and "unknown step scorer" in result.output


def test_refuses_to_replace_a_directory_it_did_not_write(tmp_path, sampled):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not replacing"):
        rft_filter([sampled], out, RFTFilterConfig(step_scorer=None))
    assert (out / "notes.txt").exists()
    rft_filter([sampled], tmp_path / "again", RFTFilterConfig(step_scorer=None))
    rft_filter([sampled], tmp_path / "again", RFTFilterConfig(step_scorer=None, min_outcome=0.0))  # replaces
    assert json.loads((tmp_path / "again" / "rft_summary.json").read_text())["config"]["min_outcome"] == 0.0


def test_a_folder_of_run_directories_is_read_in_name_order(tmp_path, sampled):
    make_run(tmp_path / "z-other", [(traj("q9", 0, ["<answer>Paris good</answer>"], "Paris"), 1.0)])
    summary = rft_filter([tmp_path], tmp_path.parent / f"{tmp_path.name}-kept", RFTFilterConfig(step_scorer=None))
    assert summary.sources == [str(tmp_path / "k4"), str(tmp_path / "z-other")]
    assert summary.n_in == 6
    with pytest.raises(FileNotFoundError, match="neither a run directory"):
        rft_filter([tmp_path / "z-other" / "trajectories.jsonl"], tmp_path / "x", RFTFilterConfig(step_scorer=None))
