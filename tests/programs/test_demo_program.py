"""programs.demo.program: what demo.md says of the RL run."""

from __future__ import annotations

import json

from programs.demo.program import _rl_choice


def write_run(run, best_metric, records):
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"trainer": {"best_metric": best_metric}}))
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_demo_md_names_the_step_validation_chose(tmp_path):
    records = [{"step": 0, "val/em": 0.75}, {"step": 0, "val/best_step": 0.0}, {"step": 3, "loss": 0.1}]
    records += [{"step": 3, "val/em": 0.857}, {"step": 3, "val/best_step": 3.0}]
    records += [{"step": 6, "val/em": 0.643}, {"step": 6, "val/best_step": 3.0}]
    write_run(tmp_path / "rl", "em", records)
    assert _rl_choice(tmp_path / "rl") == (
        "The RL agent is the RL run's step 3, chosen by validation EM on the val split "
        "(trainer.best_metric; 75.0 at step 0, 85.7 at step 3, 64.3 at step 6)."
    )


def test_demo_md_says_nothing_of_a_choice_without_best_metric(tmp_path):
    write_run(tmp_path / "rl", None, [{"step": 0, "val/em": 0.75}, {"step": 6, "val/em": 0.8}])
    assert _rl_choice(tmp_path / "rl") is None
    assert _rl_choice(tmp_path / "missing") is None
