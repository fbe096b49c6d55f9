"""The demo as first shipped (``test_v1``/``train_v1``): train disjoint from test and balanced; a
labelled run (``--label research+sft``) reaches the leaderboard and the demo's before/after text
under its label. The v2 splits' rules are checked in test_demo_data.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from benchmarks.datasets import load_examples
from cli.main import app

# The demo's SFT recipe (harness demo trains it; a file, not the CLI module's constant).
TRAIN_CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "train" / "smollm2_cpu_sft_demo.yaml")

runner = CliRunner()
TEMPLATES = (
    r"In which town was the inventor of the .+ born\?",
    r"On which river lies the town where .+ was founded\?",
    r"Who founded the company that makes the .+\?",
    r"Are .+ and .+ in the same province\?",
    r"Who was born earlier, .+ or .+\?",
)


def _support(examples) -> set[str]:
    return {d for e in examples for d in e.metadata["supporting_doc_ids"]}


def test_demo_train_split_is_disjoint_from_test():
    test, train = load_examples("demo", "test_v1"), load_examples("demo", "train_v1")
    assert len(train) >= 30 and len(test) == 39
    assert not {e.id for e in train} & {e.id for e in test}
    assert not {e.question for e in train} & {e.question for e in test}
    # No passage a test question needs is in any train trajectory's gold, and no test answer
    # (yes/no aside) is taught by a train question.
    assert not _support(train) & _support(test)
    test_answers = {a for e in test for a in e.answers} - {"yes", "no"}
    assert not {a for e in train for a in e.answers} & test_answers


def test_demo_train_split_is_balanced():
    test, train = load_examples("demo", "test_v1"), load_examples("demo", "train_v1")
    types = Counter(e.metadata["type"] for e in train)
    assert set(types) == {e.metadata["type"] for e in test} == {"bridge", "comparison"}
    assert min(types.values()) >= 0.4 * len(train)
    # Every question template of the test split is taught.
    for pattern in TEMPLATES:
        assert any(re.fullmatch(pattern, e.question) for e in train), pattern
    assert all(any(re.fullmatch(p, e.question) for p in TEMPLATES) for e in test)
    yes_no = Counter(e.answers[0] for e in train if e.answers[0] in ("yes", "no"))
    assert yes_no["yes"] == yes_no["no"] > 0  # the test split is mostly "no": train must not teach that


def _script(path: Path, examples, n_right: int) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            answer = ex.answers[0] if i < n_right else "unknown"
            turns = [f"<think>look</think><search>{ex.question}</search>", f"<answer>\\boxed{{{answer}}}</answer>"]
            f.write(json.dumps({"match": ex.question, "turns": turns}) + "\n")
    return path


def _eval(script: Path, out: Path, *extra: str):
    args = ["eval", "--method", "research", "--dataset", "demo", "--backend", "scripted", "--script", str(script)]
    args += ["--retriever", "memory", "--out", str(out), "--limit", "6", "agent.max_total_tokens=100000", *extra]
    return runner.invoke(app, args)


@pytest.mark.slow  # two scripted evaluations: ~5 s of CPU, ~20 s on a loaded machine
def test_a_label_flows_into_the_run_dir_the_report_and_the_demo_text(tmp_path):
    from benchmarks.demo_summary import question_template, summarize
    from benchmarks.fmt import pct
    from benchmarks.report import build_leaderboard, load_runs

    examples = load_examples("demo")
    out = tmp_path / "runs"
    assert _eval(_script(tmp_path / "a.jsonl", examples, 1), out).exit_code == 0
    labelled = _eval(_script(tmp_path / "b.jsonl", examples, 5), out, "--label", "research+sft")
    assert labelled.exit_code == 0, labelled.output
    assert "research+sft" in labelled.output
    run = out / "research+sft-demo-test"
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["method"] == "research+sft" and manifest["config"]["method"] == "research"

    runs, skipped = load_runs([str(out / "*")])
    assert not skipped
    lb = build_leaderboard(runs, baseline="research")
    rows = {r.label: r for r in lb.rows}
    assert set(rows) == {"research", "research+sft"}
    diff = rows["research+sft"].cells["demo"].vs_baseline["em"]
    assert diff.n == 6 and abs(diff.diff - 4 / 6) < 1e-9

    text = summarize(out / "research-demo-test", run)
    assert "research+sft minus research" in text and "+66.7 points" in text
    # A third stage is paired against the one before it, overall and per question template.
    rl = _eval(_script(tmp_path / "d.jsonl", examples, 6), out, "--label", "research+sft+rl")
    assert rl.exit_code == 0, rl.output
    text = summarize(out / "research-demo-test", run, out / "research+sft+rl-demo-test", curves=[("reward", "r.png")])
    assert "# Demo: research → research+sft → research+sft+rl" in text
    assert "research+sft+rl minus research+sft" in text and "+16.7 points" in text  # 6/6 against 5/6
    # The one question RL gained (the sixth) alone moves its template's row.
    sixth = question_template(examples[5].question)
    n = sum(question_template(e.question) == sixth for e in examples[:6])
    assert f"| {sixth} | {n} | {n - 1}/{n} | {n}/{n} | {pct(1 / n, signed=True)} |" in text
    assert "[reward](r.png)" in text

    # One label names one run: several methods with a label are refused.
    both = runner.invoke(app, ["eval", "--method", "research,search_r1", "--label", "x", "--backend", "scripted"])
    assert both.exit_code != 0 and "--label names one run" in both.output
    bad = _eval(_script(tmp_path / "c.jsonl", examples, 0), out, "--label", "a/b")
    assert bad.exit_code != 0 and "label" in bad.output


def test_demo_training_is_skipped_only_for_the_same_recipe(tmp_path, monkeypatch):
    """A final model trained with the recipe's exact config is reused; another config is refused
    unless replacing it is asked for, and then retrains."""
    from harness import safe_delete
    from harness.config import compose, to_dict
    from training.build import StaleRunError, train_cached
    from training.config import TrainConfig

    data, run = tmp_path / "train.jsonl", tmp_path / "model"
    source = f"sft.sources=[{{kind: synth, path: {json.dumps(str(data))}}}]"
    cfg = compose(TrainConfig, [TRAIN_CONFIG], [source])
    assert safe_delete.claim(run, "train")  # a run folder harness made (the trainer claims its own)
    assert safe_delete.claim(run / "final", "model")  # a model folder harness wrote (its marker)
    (run / "config.json").write_text(json.dumps(to_dict(cfg)))
    assert train_cached(cfg, run) == (run / "final", False)
    # Torch threads are execution-only: `harness demo` picks them per machine and still reuses the run.
    two_threads = compose(TrainConfig, [TRAIN_CONFIG], [source, "optim.threads=2"])
    assert train_cached(two_threads, run) == (run / "final", False)

    built = []

    class Trainer:
        step_no = 1

        def train(self):
            (run / "final").mkdir(parents=True)
            return run / "final"

    monkeypatch.setattr("training.build.make_trainer", lambda c, r, backend=None: built.append(c) or Trainer())
    three = compose(TrainConfig, [TRAIN_CONFIG], [source, "trainer.max_steps=3"])
    # Another config's finished model is kept unless replacing it is asked for: the refusal names
    # the key that differs (a harness upgrade that changed a default must not delete a trained model).
    with pytest.raises(StaleRunError, match=r"trainer\.max_steps: .* → 3") as refused:
        train_cached(three, run)
    assert refused.value.differences == [f"trainer.max_steps: {cfg.trainer.max_steps!r} → 3"]
    assert (run / "config.json").exists() and not built
    assert train_cached(three, run, replace=True) == (run / "final", True)
    assert built[0].trainer.max_steps == 3 and not (run / "config.json").exists()  # the old run was cleared


def test_question_templates_of_the_demo_cover_every_question():
    from benchmarks.demo_summary import question_template

    v1 = {"inventor's town", "river of a town", "company founder", "born earlier", "same province"}
    assert {question_template(ex.question) for s in ("test_v1", "train_v1") for ex in load_examples("demo", s)} == v1
    years = {"inventor's birth year", "company's founding year"}
    assert {question_template(ex.question) for ex in load_examples("demo")} == v1 | years
    assert question_template("Who wrote Hamlet?") == "other"


def test_demo_threads_follow_how_busy_the_machine_is(monkeypatch):
    """Every core on a quiet machine, one on a busy one (two threads spin-wait on a busy 2-core VM)."""
    import os

    from programs.demo.program import auto_threads

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.4, 0.0, 0.0))
    assert auto_threads()[0] == 2
    monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 0.0, 0.0))
    threads, why = auto_threads()
    assert threads == 1 and "1.50" in why
