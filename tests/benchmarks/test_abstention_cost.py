"""Abstention and cost per correct answer (issue 49): the ``abstain`` metric, the aggregates of
:func:`benchmarks.evaluate.behaviour` by hand, their place in results.json, the eval table and
reports, and ``--rescore`` recomputing them from the trajectories."""

from __future__ import annotations

import pytest
from rich.console import Console

from benchmarks.evaluate import aggregate, behaviour, evaluate, score_trajectory
from benchmarks.metrics import METRICS, abstained, score_prediction
from benchmarks.report import build_leaderboard, load_run
from benchmarks.report_render import cost_markdown, to_csv
from benchmarks.results_table import print_results
from harness.run_records import ItemScore, RunManifest
from harness.runlog import RunDir
from harness.types import Example
from pipelines.dialects import DIALECTS, get_dialect
from tests.helpers.trajectories import trajectory


@pytest.mark.parametrize(
    "pred, expected",
    [("I don't know.", 1.0), ("i do not know", 1.0), ("", 1.0), (None, 1.0), ("Paris", 0.0), ("I know: Paris", 0.0)],
)
def test_abstained_by_hand(pred, expected):
    assert abstained(pred, ["Paris"]) == expected
    assert METRICS.get("abstain") is abstained
    assert score_prediction(pred, ["Paris"], ("abstain",)) == {"abstain": expected}


def test_every_dialects_no_answer_string_counts_as_abstention():
    """A dialect's own "no answer" string (R1-Searcher: "I don't know.") is an abstention."""
    strings = set()
    for name in DIALECTS.names():
        d = get_dialect(name)
        strings |= {d.no_answer} | {m.get("no_answer") for m in d.modes.values()}
    strings = {s for s in strings if s is not None}
    assert "I don't know." in strings  # the dialects do have one: the check below is not vacuous
    assert all(abstained(s) == 1.0 for s in strings), strings


def _score(i, em, tokens, searches, abstain=0.0, error=None):
    return ItemScore(
        id=f"q{i}",
        metrics={"em": em, "abstain": abstain},
        generated_tokens=tokens,
        n_searches=searches,
        error=error,
    )


SCORES = [
    _score(0, 1.0, 100, 2),
    _score(1, 0.0, 50, 1, abstain=1.0),
    _score(2, 1.0, 30, 3),
    _score(3, 0.0, 20, 0, abstain=1.0),
    _score(4, 0.0, 999, 9, error="RetrievalError: down"),  # failed: in no mean, no sum
]


def test_behaviour_by_hand():
    b = behaviour(SCORES, "em")
    assert b == {"abstention": 0.5, "tokens_per_correct": 200 / 2, "searches_per_correct": 6 / 2}
    split = behaviour(SCORES, "em", unanswerable=["q1", "q2", "q9"])
    # answerable: q0 (1), q3 (0) -> 0.5; unanswerable and scored: q1 (abstained), q2 (answered) -> 0.5
    assert split["answerable_accuracy"] == 0.5 and split["unanswerable_abstention"] == 0.5
    assert split["n_unanswerable"] == 2
    nothing_right = behaviour([_score(0, 0.0, 10, 1)], "em")
    assert nothing_right["tokens_per_correct"] is None and nothing_right["searches_per_correct"] is None


def test_results_json_has_behaviour_and_the_table_shows_it():
    manifest = RunManifest(method="m", dataset="d", split="test", n_total=5)
    manifest.answerability = {"in_corpus": 0.6, "unanswerable": ["q1", "q2"]}
    res = aggregate(SCORES, manifest, ("em",))
    assert res.correct_metric == "em"
    assert res.behaviour["abstention"] == 0.5 and res.behaviour["tokens_per_correct"] == 100.0
    assert res.behaviour["unanswerable_abstention"] == 0.5
    console = Console(width=200, record=True, color_system=None)
    print_results([res], console=console)
    text = console.export_text()
    for col in ("abst", "tok/ok", "srch/ok", "ans acc", "unans abst"):
        assert col in text
    assert "50.0" in text and "100" in text and "3.00" in text


class Abstainer:
    """A method whose every answer declines, except on q0: enough to score a run end to end."""

    method = "abstainer"

    def run_examples(self, examples, n_samples=1, on_done=None, skip=(), schedule="async"):
        for e in examples:
            pred = "Paris" if e.id == "q0" else "I don't know."
            on_done(
                trajectory(
                    list(e.answers), example_id=e.id, prediction=pred, generated_tokens=10, finish_reason="answer"
                )
            )


def test_eval_run_records_abstention_and_rescore_recomputes_it(tmp_path):
    examples = [Example(id=f"q{i}", question="Capital of France?", answers=["Paris"]) for i in range(4)]
    res = evaluate(Abstainer(), examples, tmp_path / "run", metrics=("em",))
    assert res.behaviour["abstention"] == 0.75 and res.behaviour["tokens_per_correct"] == 40.0
    # A run scored before the abstain metric existed: its scores lack it, --rescore recomputes it.
    run = RunDir(tmp_path / "run")
    lines = (run.path / "scores.jsonl").read_text().splitlines()
    (run.path / "scores.jsonl").write_text("\n".join(line.replace('"abstain": 1.0, ', "") for line in lines) + "\n")
    assert load_run(run.path).behaviour("em")["abstention"] == 0.0  # q0's 0.0 alone is left
    rescored = load_run(run.path, rescore=True)
    assert rescored.behaviour("em")["abstention"] == 0.75
    lb = build_leaderboard([rescored], metrics=("em",), b=10)
    md = "\n".join(cost_markdown(lb))
    assert "abstain %" in md and "75.0" in md and "40" in md
    assert "0.7500" in to_csv(lb)


def test_score_trajectory_always_records_abstain():
    s = score_trajectory(trajectory(["Paris"], prediction="I don't know."), ("em",))
    assert s.metrics == {"em": 0.0, "abstain": 1.0}
