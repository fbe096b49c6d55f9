"""One checkpoint policy for every trainer (issue 23, defect 2): SFT and PRM keep only
``trainer.keep_checkpoints`` of their run's checkpoints (they kept all), and ``--resume`` after
falling back past a damaged newest checkpoint trims ``metrics.jsonl`` to the resumed step (the log
read 1, 2, 3, 4, 4), as the RL trainer did."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import compose
from tests.training.prm.test_prm import TINY_PRM, mcts_dir  # noqa: F401 (a fixture)
from tests.training.sft.test_sft import SFT_RECIPE
from training.config import TrainConfig


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> Path:
    from benchmarks.datasets import corpus_path, load_examples
    from harness.eval_config import RetrieverConfig
    from harness.retrieval.factory import build_retriever
    from pipelines.dialects import resolve_dialect
    from training.synthesize import corpus_titles, synthesize

    examples, corpus = load_examples("demo", "test"), corpus_path("demo", "test")
    data = tmp_path_factory.mktemp("sft") / "s.jsonl"
    retriever = build_retriever(RetrieverConfig(kind="memory", topk=2), str(corpus))
    synthesize(examples[:4], resolve_dialect("search_r1", "small"), retriever, data, titles=corpus_titles(corpus))
    return data


def recipe(kind: str, tmp_path: Path, data: Path) -> TrainConfig:
    (tmp_path / "r.yaml").write_text(SFT_RECIPE if kind == "sft" else TINY_PRM)
    source = f"sft.sources=[{{kind: synth, path: {data}}}]" if kind == "sft" else f"prm.data=[{data}]"
    over = [source, "trainer.max_steps=4", "trainer.save_every=1", "trainer.keep_checkpoints=3"]
    return compose(TrainConfig, [tmp_path / "r.yaml"], over + (["prm.max_len=256"] if kind == "prm" else []))


def logged_steps(run: Path) -> list[int]:
    return [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]


@pytest.mark.slow  # two tiny trainers of each kind (~10-30 s on a loaded machine)
@pytest.mark.parametrize("kind", ["sft", "prm"])
def test_keep_checkpoints_and_resume_after_a_fallback_trims_the_log(kind, tmp_path, sft_data, mcts_dir):  # noqa: F811
    from training.build import build_trainer

    cfg = recipe(kind, tmp_path, sft_data if kind == "sft" else mcts_dir)
    run = tmp_path / "run"
    build_trainer(cfg, run).train()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3", "step-4"]
    assert logged_steps(run) == [1, 2, 3, 4]
    # The newest checkpoint is damaged: resume falls back to step 3 and runs step 4 again.
    w = run / "checkpoints" / "step-4" / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    again = build_trainer(cfg, run)
    again.resume(run)
    assert again.step_no == 3
    again.train()
    assert logged_steps(run) == [1, 2, 3, 4]  # not 1, 2, 3, 4, 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-3", "step-4"]
