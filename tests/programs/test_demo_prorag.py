"""ProRAG's demo chain: its PRM trains ProRAG's three epochs over the pairs its MCTS found, and an
RFT set the filter left empty ends the chain saying why."""

from __future__ import annotations

import json

import pytest

from harness.config import compose
from programs.demo.program import prm_steps
from programs.demo.systems import get_system, shipped
from training.config import TrainConfig


def _cfg(*over: str) -> TrainConfig:
    return compose(TrainConfig, [shipped(get_system("prorag").extra["prm"])], list(over))


def _pairs(folder, n: int):
    folder.mkdir(parents=True, exist_ok=True)
    line = json.dumps({"prefix": [1], "chosen": {"step": [2]}, "rejected": {"step": [3]}})
    (folder / "pairs.jsonl").write_text("".join(line + "\n" for _ in range(n)))
    return folder


def test_three_epochs_over_the_pairs_that_train(tmp_path):
    cfg = _cfg()  # 8 pairs a step, a fifth held out
    assert prm_steps(_pairs(tmp_path / "a", 5), cfg) == 2  # 4 train: 12 pair visits → 2 steps of 8
    assert prm_steps(_pairs(tmp_path / "b", 100), cfg) == 30  # 80 train × 3 / 8
    assert prm_steps(_pairs(tmp_path / "c", 100), _cfg("prm.batch_size=16")) == 15
    nothing_held_out = _cfg("prm.val_fraction=0.0", "trainer.best_metric=null")
    assert prm_steps(_pairs(tmp_path / "d", 100), nothing_held_out) == 38  # ceil(300 / 8)


def test_at_least_one_step(tmp_path):
    assert prm_steps(_pairs(tmp_path / "one", 1), _cfg()) == 1


def test_an_empty_rft_set_ends_the_chain_saying_why(tmp_path):
    from dataclasses import asdict

    from programs.demo.program import _refuse_an_empty_set
    from training.data.rft import DECISIONS, SUMMARY, RFTFilterConfig, RFTSummary

    cfg = RFTFilterConfig(
        metric="f1", min_outcome=0.5, step_scorer="prm", step_scorer_args={"path": "PRM"}, step_agg="step"
    )

    def summary(kept: int, **dropped: int) -> None:
        n = kept + sum(dropped.values())
        s = RFTSummary(asdict(cfg), ["S"], n_in=n, n_kept=kept, questions_in=2, dropped=dropped)
        (tmp_path / SUMMARY).write_text(json.dumps(asdict(s)))

    summary(0, outcome=1, step_score=2)
    rows = [{"kept": False, "reason": "outcome"}, {"step_scores": [0.31, 0.44]}, {"step_scores": [0.28]}]
    (tmp_path / DECISIONS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = r"kept 0 of 3 trajectories \(0 of 2 questions\); dropped: step_score 2, outcome 1; "
    with pytest.raises(
        RuntimeError, match=said + r"every step the PRM \(PRM\) scored was below step_threshold 0.5 .*highest: 0.440"
    ):
        _refuse_an_empty_set(tmp_path, cfg)
    summary(0, outcome=3)
    (tmp_path / DECISIONS).write_text(json.dumps({"kept": False, "reason": "outcome"}) + "\n")
    with pytest.raises(RuntimeError, match=r"dropped: outcome 3; see"):
        _refuse_an_empty_set(tmp_path, cfg)
    summary(1, outcome=2)
    _refuse_an_empty_set(tmp_path, cfg)  # a set with something in it goes on


def test_a_raised_question_limit_resumes_the_mcts_and_anything_else_does_not():
    from programs.demo.program import mcts_grown

    def stamp(limit, offset=28, model="SFT"):
        dataset = {"name": "demo", "split": "train"} | ({} if limit == "none" else {"limit": limit})
        return {"recipe": {"dataset": dataset, "offset": offset}, "overrides": [model], "sft": {}}

    assert mcts_grown(stamp(40), stamp(71))  # the 12 searched are the first of the 43 asked
    assert mcts_grown(stamp(40), stamp("none"))  # every question
    assert not mcts_grown(stamp(71), stamp(40))  # fewer: the folder holds questions outside the list
    assert not mcts_grown(stamp(40), stamp(40))  # the same stamp: resumed as it is, not grown
    assert not mcts_grown(stamp("none"), stamp(71))
    assert not mcts_grown(stamp(40), stamp(71, offset=40))  # other questions first
    assert not mcts_grown(stamp(40), stamp(71, model="RETRAINED"))
    assert not mcts_grown(None, stamp(71))


def test_the_demo_resumes_an_mcts_folder_whose_recipe_asks_for_more_questions(tmp_path, monkeypatch):
    from types import SimpleNamespace

    import training.data.mcts as mcts_module
    from programs.demo.program import _mcts
    from training.build import StaleRunError

    searched: list[str] = []

    def fake_search(recipes, over, out):  # the search itself is training.data.mcts's (its own tests)
        searched.append(out)
        stats = SimpleNamespace(questions=31, summary=lambda: "31 questions")
        return stats, None

    monkeypatch.setattr(mcts_module, "run_mcts_recipe", fake_search)
    said: list[str] = []
    ui = SimpleNamespace(say=said.append)
    (tmp_path / "sft" / "final").mkdir(parents=True)

    def recipe(limit: int):
        path = tmp_path / f"mcts{limit}.yaml"
        path.write_text(f"method: prorag\ndataset: {{name: demo, split: train, limit: {limit}}}\noffset: 28\n")
        return str(path)

    out = tmp_path / "mcts"
    _mcts(ui, recipe(40), {}, tmp_path / "sft" / "final", out, retrain=False)  # a new folder
    (out / "done.jsonl").write_text('{"question_id": "q28"}\n')
    folder, new = _mcts(ui, recipe(71), {}, tmp_path / "sft" / "final", out, retrain=False)
    assert (folder, new) == (out, True) and searched == [str(out)] * 2
    assert any("the searched ones stand, resuming" in line for line in said)
    assert json.loads((out / "inputs.json").read_text())["recipe"]["dataset"]["limit"] == 71
    assert (out / "done.jsonl").exists()  # nothing searched before was removed
    with pytest.raises(StaleRunError):  # fewer questions: refused, as any other change
        _mcts(ui, recipe(40), {}, tmp_path / "sft" / "final", out, retrain=False)
