"""Training health (issue 49): the preflight before the first RL step, the per-step ``health/*``
metrics, and ``trainer.stop_on``. The end-to-end check: a run whose retriever returns empty
passages stops before step 1, naming the retriever, and writes no step."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from benchmarks.tiny_recipes import grpo_recipe
from harness.config import compose
from harness.types import Doc, Example, SearchRecord, Segment, Trajectory
from pipelines.dialects import get_dialect
from training.config import TrainConfig, TrainerConfig
from training.health import (
    HealthGuard,
    HealthStop,
    PreflightError,
    broken_tags,
    check_retriever,
    check_reward,
    gold_trajectory,
    health_metrics,
    repeats,
    think_words,
)
from training.rewards import build_reward

EXAMPLES = [Example(id=f"q{i}", question=f"Who wrote book {i}?", answers=[f"Author {i}"]) for i in range(3)]


class Fixed:
    """A retriever that returns the same passages for every query."""

    def __init__(self, docs):
        self.docs = docs

    def search(self, queries, k):
        return [list(self.docs[:k]) for _ in queries]


def test_preflight_retriever_empty_text_fails_naming_the_question():
    with pytest.raises(PreflightError, match=r"no text for 3 of 3 training questions .*'Who wrote book 0\?'"):
        check_retriever(Fixed([Doc("1", "", "   ")]), [e.question for e in EXAMPLES], 3)
    with pytest.raises(PreflightError, match="no text"):
        check_retriever(Fixed([]), ["q?"], 3)
    with pytest.raises(PreflightError, match="has no retriever"):
        check_retriever(None, ["q?"], 3)
    check_retriever(Fixed([Doc("1", "Book", "Author 0 wrote it.")]), ["q?"], 3)  # text: passes


@pytest.mark.parametrize(
    "dialect, reward",
    [
        ("search_r1", "em"),
        ("search_r1", "search_r1_format"),
        ("research", "research_f1_format"),
        ("r1_searcher", "r1_searcher_stage1"),
        ("r1_searcher", "r1_searcher_stage2"),
        ("rag_r1", "em"),
        ("prorag", "prorag_f1"),
    ],
)
def test_a_gold_answer_in_the_dialects_tags_gets_a_positive_reward(dialect, reward):
    d = get_dialect(dialect)
    traj = gold_trajectory(EXAMPLES[0], d)
    assert d.validate_format(traj.response_text)[0], traj.response_text
    check_reward(build_reward(reward), EXAMPLES, d)  # raises when not positive


@pytest.mark.parametrize("dialect", ["search_r1", "search_r1_small", "rag_r1", "rag_r1_small"])
def test_a_reward_read_from_prompt_and_response_scores_gold_after_the_agents_prompt(dialect):
    """Search-R1's and RAG-R1's training reward (em on prompt + response, qa_em) takes the last of
    at least two answers: the prompt's example answer is the first. Scored on the bare question,
    a gold answer got 0 and the preflight refused the demo's PPO recipes; after the prompt the
    agent renders, it scores 1."""
    from harness.models import load_tokenizer

    d, tok = get_dialect(dialect), load_tokenizer("smollm2-135m-instruct")
    reward = build_reward({"name": "em", "answer_from": "prompt_response"})
    with pytest.raises(PreflightError):  # the bare question holds no example answer
        check_reward(reward, EXAMPLES, d)
    check_reward(reward, EXAMPLES, d, lambda q: d.render(q, tok, True, False))


def test_preflight_reward_that_gives_gold_nothing_fails():
    def zero(traj):
        return 0.0, {}

    with pytest.raises(PreflightError, match=r"reward \(algo.reward\) of a gold answer is 0"):
        check_reward(zero, EXAMPLES, get_dialect("search_r1"))


def test_repeats_broken_tags_think_words_by_hand():
    assert repeats("a b c d e f " * 3) and not repeats("a b c d e f " * 2)
    assert not repeats("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen")
    assert not broken_tags("<think> ok </think><answer>x</answer>")
    assert broken_tags("<think> ok <think] still </think>")  # a malformed tag
    assert broken_tags("<think> a </think> </think>")  # closed twice
    assert not broken_tags("<think> a </think><think> cut by the length limit")  # one open at the end
    assert broken_tags("<think> a <think> b </think>")  # opened twice, not at the end
    assert not broken_tags("<step> a </step>", "<step>", "</step>")
    assert think_words("<think> one two </think> x <think> three") == 3


def _traj(model_text, searches=(), prompt="Q"):
    return Trajectory(
        example_id="q",
        question="Q",
        answers=["A"],
        method="m",
        segments=[Segment("prompt", [], prompt), Segment("model", [], model_text)],
        searches=list(searches),
    )


def test_health_metrics_of_a_step():
    full = SearchRecord.from_docs(0, "q", [Doc("1", "T", "text")], 0.0)
    empty = SearchRecord.from_docs(0, "q", [Doc("2", "", "")], 0.0)
    trajs = [
        _traj("<think> a b c </think><answer>A</answer>", [full, empty]),
        _traj("<think] " + "loop loop loop loop loop loop " * 3, [empty]),
    ]
    m = health_metrics(trajs, get_dialect("search_r1"))
    assert m["health/empty_retrieval"] == pytest.approx(2 / 3)
    assert m["health/repeated_ngrams"] == 0.5 and m["health/broken_tags"] == 0.5
    assert m["health/think_words"] == 1.5  # 3 words, and none in the broken one (no "<think>" block)
    assert "health/empty_retrieval" not in health_metrics([_traj("x")], get_dialect("search_r1"))  # no search
    # R1-Searcher's prompt opens the thought: its response's single </think> is not broken
    r1 = _traj("reasoning </think>\n\n<answer> A </answer>", prompt="... Assistant: <think>")
    assert health_metrics([r1], get_dialect("r1_searcher"))["health/broken_tags"] == 0.0


def test_stop_on_rules_and_guard():
    with pytest.raises(ValueError, match=r"trainer.stop_on.health/broken_tags: 'lots' is not a rule"):
        TrainerConfig(stop_on={"health/broken_tags": "lots"})
    guard = HealthGuard({"health/empty_retrieval": "> 0.5", "format_valid": "< 0.2"}, steps=2)
    guard.record(1, {"health/empty_retrieval": 0.9, "format_valid": 0.9})
    guard.stop_if_unhealthy()  # one step over: not yet
    guard.record(2, {"format_valid": 0.1})  # no search this step: the streak neither grows nor breaks
    guard.record(3, {"health/empty_retrieval": 1.0, "format_valid": 0.5})
    with pytest.raises(HealthStop, match=r"stopped at step 3: health/empty_retrieval > 0.5 for 2 step\(s\)"):
        guard.stop_if_unhealthy()
    bare = HealthGuard({"health/repeated_ngrams": 0.25})
    bare.record(1, {"health/repeated_ngrams": 0.3})
    with pytest.raises(HealthStop, match="> 0.25"):
        bare.stop_if_unhealthy()


def _empty_corpus(tmp_path):
    corpus = tmp_path / "empty.jsonl"
    corpus.write_text("".join(json.dumps({"id": str(i), "contents": "\n"}) + "\n" for i in range(3)))
    return corpus


def test_a_training_run_with_an_empty_retriever_stops_before_step_1(tmp_path):
    """The issue's check: the message names the retriever, and no step is trained or logged."""
    from cli.main import app

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(grpo_recipe("tiny-empty", f"retriever.corpus={_empty_corpus(tmp_path)}"))
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["train", "-c", str(recipe), "--out", str(out)])
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert "preflight: the retriever returned no text for 4 of 4 training questions" in text, result.output
    assert "Traceback" not in result.output
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_stop_on_stops_a_run_after_its_step_is_logged(tmp_path):
    """trainer.stop_on: a rule step 1 always crosses stops the run there, its step logged (with the
    health metrics), nothing after it trained."""
    from training.build import build_trainer

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text(grpo_recipe("tiny-stop"))
    cfg = compose(TrainConfig, [recipe], ["trainer.stop_on={health/think_words: '>= 0'}", "trainer.max_steps=3"])
    trainer = build_trainer(cfg, tmp_path / "run")
    with pytest.raises(HealthStop, match=r"stopped at step 1: health/think_words >= 0 for 1 step\(s\)"):
        trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and trainer.step_no == 1
    assert {"health/repeated_ngrams", "health/broken_tags", "health/think_words"} <= set(rows[0])
    # ... and the report's training curves draw them
    from benchmarks.training_curves import load_training_run, panels

    drawn = {p.key for p in panels([load_training_run(tmp_path / "run")])}
    assert {"health/repeated_ngrams", "health/broken_tags", "health/think_words"} <= drawn
