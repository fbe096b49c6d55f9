"""ProRAG's demo PRM trains ProRAG's three epochs over the pairs its MCTS found."""

from __future__ import annotations

import json

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
