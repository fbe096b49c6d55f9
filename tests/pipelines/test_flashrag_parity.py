"""The agent is the FlashRAG pipeline: FlashRAG's own ``run`` and ``Evaluator`` on a FlashRAG
``Dataset`` give the predictions and EM / F1 / acc that ``harness eval`` gives on the same items."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from benchmarks.build import build_eval, simple_evaluate
from harness.backends.scripted import ScriptedBackend
from harness.config import from_dict
from harness.eval_config import EvalConfig
from harness.runlog import RunDir
from pipelines import SearchAgent
from pipelines.flashrag_compat import safe_config, to_flashrag_dataset


def scripted_for(examples, tmp_path):
    """Right answers for even items, wrong ones for odd items, after one search each."""
    path = tmp_path / "script.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            answer = ex.answers[0] if i % 2 == 0 else "no idea"
            turns = [f"<search>{ex.question}</search>", f"<answer>{answer}</answer>"]
            f.write(json.dumps({"match": ex.question, "turns": turns}) + "\n")
    return path


def flashrag_scores(cfg: EvalConfig, backend) -> tuple[list[str], dict]:
    """FlashRAG's side: the agent's ``run`` then FlashRAG's own ``Evaluator``."""
    from flashrag.evaluator import Evaluator

    run = build_eval(cfg, backend=backend)  # the same examples, retriever and options
    config = safe_config()
    agent = SearchAgent(backend, run.retriever, cfg.method, run.method.config, flashrag_config=config)
    dataset = agent.run(to_flashrag_dataset(run.examples, config), do_eval=False)
    with contextlib.redirect_stdout(io.StringIO()):
        metrics = Evaluator(config).evaluate(dataset)
    return list(dataset.pred), metrics


def harness_scores(cfg: EvalConfig, backend) -> tuple[list[str], dict]:
    results = simple_evaluate(cfg, backend=backend)
    by_id = {t.example_id: t.prediction for t in RunDir(build_eval(cfg, backend=backend).run_dir).trajectories()}
    examples = build_eval(cfg, backend=backend).examples
    return [by_id[e.id] for e in examples], results.metrics


def assert_same(flashrag: tuple[list[str], dict], harness: tuple[list[str], dict]) -> None:
    assert flashrag[0] == harness[0]
    for m in ("em", "f1", "acc"):
        assert flashrag[1][m] == pytest.approx(harness[1][m], abs=1e-9), m


def test_scripted_agent_flashrag_run_and_evaluator_agree_with_harness_eval(tmp_path):
    from benchmarks.datasets import load_examples

    examples = load_examples("demo", limit=8)
    script = scripted_for(examples, tmp_path)
    cfg = from_dict(
        EvalConfig,
        {
            "method": "search_r1",
            "dataset": {"name": "demo", "limit": 8},
            "backend": {"kind": "scripted", "script": str(script)},
            "retriever": {"kind": "memory"},
            "agent": {"max_total_tokens": 100000},
            "out": str(tmp_path / "runs"),
        },
    )
    backend = ScriptedBackend(str(script))
    flashrag, harness = flashrag_scores(cfg, backend), harness_scores(cfg, backend)
    assert_same(flashrag, harness)
    assert harness[1]["em"] == pytest.approx(0.5)  # the script is right on every other item


@pytest.mark.slow
def test_hf_agent_greedy_flashrag_run_and_evaluator_agree_with_harness_eval(tmp_path):
    from harness.backends.hf import HFBackend

    cfg = from_dict(
        EvalConfig,
        {
            "method": "research",
            "dataset": {"name": "demo", "limit": 4},
            "retriever": {"kind": "bm25"},
            "agent": {"max_turns": 1, "max_new_tokens": 32, "max_total_tokens": 96, "few_shot": True},
            "out": str(tmp_path / "runs"),
        },
    )
    backend = HFBackend("smollm2-135m-instruct", max_batch_size=4)
    try:
        assert_same(flashrag_scores(cfg, backend), harness_scores(cfg, backend))
    finally:
        backend.close()
