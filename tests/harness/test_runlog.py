"""Run directories: manifest, streaming appends, torn lines, resume refusal."""

from __future__ import annotations

import json

import pytest

from harness.run_records import ItemScore, RunManifest, RunResults
from harness.runlog import RunDir, RunDirError
from harness.types import Segment, Trajectory


def manifest(config: dict | None = None, **kw) -> RunManifest:
    return RunManifest(method="m", dataset="d", split="s", config=config or {"a": 1}, **kw)


def score(i: int, em: float = 1.0, **kw) -> ItemScore:
    return ItemScore(id=f"q{i}", metrics={"em": em}, **kw)


def traj(i: int) -> Trajectory:
    return Trajectory(
        example_id=f"q{i}",
        question="Q?",
        answers=["A"],
        method="m",
        segments=[Segment("prompt", [1, 2]), Segment("model", [3], "x", [-0.5])],
        prediction="A",
        finish_reason="answer",
    )


def test_open_append_and_read_back(tmp_path):
    run = RunDir(tmp_path / "r")
    assert run.open(manifest()) is False
    assert run.manifest.method == "m" and run.manifest.versions and run.manifest.config_hash
    run.append(traj(0), score(0, 1.0))
    run.append(traj(1), score(1, 0.0))
    assert [t.example_id for t in run.trajectories()] == ["q0", "q1"]
    assert run.trajectories()[0].segments[1].logprobs == [-0.5]
    assert run.finished_keys() == {("q0", 0), ("q1", 0)}


def test_resume_same_config_and_refuse_another(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    assert run.open(manifest()) is True
    with pytest.raises(RunDirError, match=r"another config \(a: 1 → 2\)"):
        run.open(manifest({"a": 2}))


def test_torn_last_line_is_dropped_and_repaired(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    run.append(traj(0), score(0))
    with open(run.path / "trajectories.jsonl", "a") as f:
        f.write('{"example_id": "q1", "quest')  # killed mid-write
    assert run.finished_keys() == {("q0", 0)}
    run.open(manifest())  # resuming repairs the file so appends start on a clean line
    run.append(traj(2), score(2))
    lines = (run.path / "trajectories.jsonl").read_text().splitlines()
    assert [json.loads(line)["example_id"] for line in lines] == ["q0", "q2"]


def test_corrupt_middle_line_is_an_error(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    (run.path / "scores.jsonl").write_text('{"id": "q0"}\nnot json\n{"id": "q1"}\n')
    with pytest.raises(RunDirError, match="scores.jsonl:2"):
        run.scores()


def test_newer_schema_is_refused():
    d = traj(0).to_dict()
    d["schema_version"] = 99
    with pytest.raises(ValueError, match="newer"):
        Trajectory.from_dict(d)


def test_changed_data_corpus_or_index_is_refused_naming_which(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest(data_hash="d1", corpus_hash="c1", index_id="i1"))
    with pytest.raises(RunDirError, match="other items: data_hash was d1, is now d2"):
        run.open(manifest(data_hash="d2", corpus_hash="c1", index_id="i1"))
    with pytest.raises(RunDirError, match="other corpus"):
        run.open(manifest(data_hash="d1", corpus_hash="c2", index_id="i1"))
    with pytest.raises(RunDirError, match="other index"):
        run.open(manifest(data_hash="d1", corpus_hash="c1", index_id="i2"))
    assert run.open(manifest(data_hash="d1", corpus_hash="c1", index_id="i1")) is True


def test_torn_item_rerun_keeps_one_record_each(tmp_path):
    """Killed between trajectory and score: the item is re-run; readers see it once (latest)."""
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    run.append(traj(0), score(0))
    with open(run.path / "trajectories.jsonl", "a") as f:  # q1's trajectory landed, its score did not
        f.write(json.dumps(traj(1).to_dict()) + "\n")
    assert run.finished_keys() == {("q0", 0)}
    run.append(traj(1), score(1))
    assert [t.example_id for t in run.trajectories()] == ["q0", "q1"]
    assert len(run.trajectories(attempts=True)) == 3 and len(run.scores()) == 2


def test_infrastructure_failures_are_retried_model_outcomes_are_not(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    run.append(traj(0), score(0, 0.0, error="RetrievalError: down", error_kind="retrieval"))
    run.append(traj(1), score(1, 0.0, error="BackendError: 503", error_kind="backend"))
    run.append(traj(2), score(2, 0.0, error="ValueError: bad", error_kind="other"))
    run.append(traj(3), score(3, 0.0, finish_reason="context_overflow"))
    assert run.finished_keys() == {("q2", 0), ("q3", 0)}
    run.append(traj(0), score(0, 1.0))  # the retry succeeded: the latest attempt is what counts
    assert run.finished_keys() == {("q0", 0), ("q2", 0), ("q3", 0)}
    assert {s.id: s.metric("em") for s in run.scores()}["q0"] == 1.0
    assert len(run.scores(attempts=True)) == 5


def test_records_round_trip_and_read_version_1_files_without_a_version(tmp_path):
    s = ItemScore(id="q", sample_index=1, metrics={"em": 1.0, "f1": 0.5}, prediction="A", wall_time_s=0.1)
    d = s.to_dict()
    assert d["em"] == 1.0 and d["schema_version"] == 1  # flat on disk
    assert ItemScore.from_dict(d) == s
    legacy = {"id": "q", "sample_index": 0, "em": 0.0, "prediction": "x", "finish_reason": "answer"}
    assert ItemScore.from_dict(legacy).metrics == {"em": 0.0} and ItemScore.from_dict(legacy).schema_version == 1
    r = RunResults(method="m", n=2, n_total=2, complete=True, metrics={"em": 0.5})
    assert RunResults.from_dict(r.to_dict()) == r
    m = RunManifest.from_dict({"method": "m", "dataset": "d", "split": "s", "launched_engine": {"url": "u"}})
    assert m.extra == {"launched_engine": {"url": "u"}} and m.to_dict()["launched_engine"] == {"url": "u"}


def test_newer_run_records_are_refused_naming_the_version(tmp_path):
    run = RunDir(tmp_path / "r")
    run.open(manifest())
    (run.path / "scores.jsonl").write_text(json.dumps({"id": "q0", "schema_version": 7}) + "\n")
    with pytest.raises(RunDirError, match="schema version 7 .*reads up to version 1"):
        run.scores()
    data = json.loads((run.path / "manifest.json").read_text())
    (run.path / "manifest.json").write_text(json.dumps({**data, "schema_version": 2}))
    with pytest.raises(RunDirError, match="manifest schema version 2"):
        _ = run.manifest
