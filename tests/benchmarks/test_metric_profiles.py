"""Metric profiles: each paper's scorer reproduced (R1-Searcher's cover-EM / EM / F1 quirks,
Search-R1's last-<answer> EM, ProRAG's F1), profile selection, and Search-R1 EM on a trajectory."""

from __future__ import annotations

import pytest

from benchmarks.evaluate import score_trajectory
from benchmarks.metrics import (
    METRICS,
    cover_em,
    em_last_answer,
    em_last_answer_response,
    em_r1_searcher,
    exact_match,
    f1_prorag,
    f1_r1_searcher,
)
from benchmarks.profiles import PROFILES, apply_profile, get_profile, profile_metrics
from harness.types import Trajectory
from tests.helpers.trajectories import trajectory


@pytest.mark.parametrize(
    "pred, golds, expected",
    [
        # R1-Searcher splits on " ": a gold that normalises to nothing is covered by an empty prediction.
        ("", ["the"], 1.0),
        ("an", ["?"], 1.0),
        ("Paris", ["the"], 0.0),
        # bool_mapping compares the raw string: "True" → yes, " True" is not mapped.
        ("True", ["yes"], 1.0),
        (" True", ["yes"], 0.0),
        # R1-Searcher's released HotpotQA results hold this prediction; its scorer gives 0 (the
        # paper's 65.4 needs it), where mapping the stripped string would give 1.
        (" False ", ["no"], 0.0),
        # order-free token cover, punctuation → space (so "U.S." gives "u s").
        ("The U.S. state of New York", ["new york"], 1.0),
        ("york new", ["New York"], 1.0),
        ("New", ["New York"], 0.0),
        ("rock_and_roll music", ["Rock and Roll"], 1.0),
    ],
)
def test_cover_em_reproduces_r1_searchers_scorer(pred, golds, expected):
    assert cover_em(pred, golds) == expected


def test_r1_searcher_em_and_f1_use_its_own_normalisation():
    # FlashRAG/SQuAD EM deletes punctuation ("U.S." → "us"); R1-Searcher's turns it into a space.
    assert exact_match("U.S.", ["us"]) == 1.0 and em_r1_searcher("U.S.", ["us"]) == 0.0
    assert em_r1_searcher("U.S.", ["u s"]) == 1.0
    assert em_r1_searcher("False", ["no"]) == 1.0
    assert f1_r1_searcher("the big apple city", ["Big Apple"]) == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert f1_r1_searcher("yes", ["no"]) == 0.0


def test_search_r1_em_takes_the_last_answer_of_the_response():
    response = "<think>x</think><answer> Paris </answer> wait <answer>Lyon</answer>"
    assert em_last_answer_response(response, ["lyon"]) == 1.0
    assert em_last_answer_response(response, ["paris"]) == 0.0
    assert em_last_answer_response("no tags at all: Lyon", ["lyon"]) == 0.0  # Search-R1: None → 0
    assert em_last_answer_response("<answer>The Lyon.</answer>", ["lyon"]) == 1.0  # SQuAD normalisation
    # A prediction column (already extracted) scores as plain EM; a tagged one by its last answer.
    assert em_last_answer("Lyon", ["lyon"]) == 1.0
    assert em_last_answer("<answer>a</answer><answer>Lyon</answer>", ["lyon"]) == 1.0


def test_prorag_f1_keeps_punctuation():
    assert f1_prorag("Paris.", ["Paris"]) == 0.0  # "paris." ≠ "paris": no punctuation removal
    assert f1_prorag("paris france", ["Paris"]) == pytest.approx(2 / 3)


def test_every_profile_names_registered_metrics():
    for name in PROFILES.names():
        p = get_profile(name)
        for m in p.without_judge():
            METRICS.get(m)
    assert get_profile("r1_searcher").headline == "cover_em"
    assert get_profile("search_r1").headline == "em_last_answer"
    assert "cover_em" in get_profile("default").metrics


def test_apply_profile_fills_metrics_and_the_judge_only_with_an_endpoint():
    assert apply_profile({}, "r1_searcher")["metrics"] == ["cover_em", "em_r1_searcher", "f1_r1_searcher"]
    with_judge = apply_profile({"judge": {"url": "http://127.0.0.1:1/v1"}}, "r1_searcher")
    assert with_judge["metrics"][-1] == "judge" and with_judge["metric_profile"] == "r1_searcher"
    assert apply_profile({"judge": {"url": "http://x/v1"}}, None)["metrics"] == ["em", "f1", "acc", "cover_em", "judge"]
    assert apply_profile({"metrics": ["em"]}, "search_r1")["metrics"] == ["em"]  # explicit metrics win
    assert profile_metrics("research", judge_configured=False) == ("em",)
    with pytest.raises(KeyError, match="unknown metric profile"):
        apply_profile({}, "search-r1")


def test_score_trajectory_uses_the_response_for_search_r1_em():
    traj = trajectory(
        ["Paris"],
        question="Capital of France?",
        method="search_r1",
        prediction="Paris",
        response_text="<think>..</think><answer>Lyon</answer> then <answer>Paris</answer>",
        finish_reason="answer",
    )
    s = score_trajectory(traj, ("em_last_answer", "f1", "judge"))
    # no judge: missing, not 0; abstain is recorded whatever the profile (BEHAVIOUR_METRICS)
    assert s.metrics == {"em_last_answer": 1.0, "f1": 1.0, "judge": None, "abstain": 0.0}
    untagged = Trajectory(**{**traj.__dict__, "response_text": "I think Paris"})
    assert score_trajectory(untagged, ("em_last_answer",)).metrics["em_last_answer"] == 0.0


def test_search_r1_profile_reads_prompt_plus_response_as_qa_em():
    # The named option answer_in_response_only: on by default (harness's fix), off for search_r1.
    from harness.types import Segment, Trajectory
    from pipelines.dialects import get_dialect

    assert get_profile("default").answer_in_response_only and not get_profile("search_r1").answer_in_response_only
    prompt = get_dialect("search_r1").raw_text("Which city is the capital of China")
    traj = Trajectory(example_id="a", question="q", answers=["Beijing"], method="search_r1", finish_reason="answer")
    traj.segments = [Segment("prompt", [1], prompt)]
    traj.response_text = "I do not know."
    assert score_trajectory(traj, ("em_last_answer",)).metrics["em_last_answer"] == 0.0
    # qa_em exactly: the prompt's own two matches make "Beijing" the extracted answer.
    assert score_trajectory(traj, ("em_last_answer",), response_only=False).metrics["em_last_answer"] == 1.0
