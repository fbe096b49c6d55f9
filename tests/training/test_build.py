"""``training.build``: every ``algo.kind`` builds a :class:`training.build.Trainer` (the protocol
``build_trainer`` returns), checked at run time on real trainers of all four kinds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.config import compose
from tests.training.prm.test_prm import TINY_PRM, mcts_dir  # noqa: F401 (mcts_dir: the module fixture)
from tests.training.retriever.test_retriever_rl import _setup
from tests.training.rl.test_trainer import recipe
from training.build import TRAINERS, Trainer, make_trainer
from training.config import TrainConfig

TINY = "{hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}"
SFT_DEMO = str(Path(__file__).resolve().parents[2] / "configs" / "train" / "smollm2_cpu_sft_demo.yaml")
GRPO_DEMO = str(Path(__file__).resolve().parents[2] / "configs" / "train" / "smollm2_cpu_grpo_demo.yaml")
QUIET = ["trainer.tensorboard=false", "trainer.progress=false"]


def test_every_trainer_kind_builds_a_trainer(tmp_path, monkeypatch, mcts_dir):  # noqa: F811
    built = {"rl": make_trainer(compose(TrainConfig, [recipe(tmp_path / "rl")], QUIET), tmp_path / "rl" / "run")}
    chat = tmp_path / "chat.jsonl"
    msgs = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]
    chat.write_text(json.dumps({"messages": msgs}) + "\n")
    sft = ["algo.kind=sft", f"model.tiny={TINY}", f"sft.sources=[{{kind: chat, path: {chat}}}]", *QUIET]
    built["sft"] = make_trainer(compose(TrainConfig, [], sft), tmp_path / "sft")
    (tmp_path / "prm.yaml").write_text(TINY_PRM)
    prm = compose(TrainConfig, [tmp_path / "prm.yaml"], [f"prm.data=[{mcts_dir}]"])
    built["prm"] = make_trainer(prm, tmp_path / "p")
    # The retriever trainer over the toy tower and index of the retriever-RL tests (its own
    # builder needs a real encoder and corpus); RetrieverTrainer and RetrieverRL are the real ones.
    monkeypatch.setattr("training.retriever.retriever_rl.build_from_config", lambda cfg, backend=None: _setup(tmp_path))
    over = ["algo.kind=retriever", "data.dataset=demo", "data.split=test_v1", "data.limit=2"]
    over += ["retriever_rl.rl.group_size=2", "retriever_rl.rl.questions_per_step=2", "retriever_rl.rl.steps=1"]
    built["retriever"] = make_trainer(compose(TrainConfig, [], over + QUIET), tmp_path / "ret")
    assert set(built) == set(TRAINERS.names())
    for kind, trainer in built.items():
        assert isinstance(trainer, Trainer), kind
        assert trainer.step_no == 0, kind
    assert not isinstance(object(), Trainer)  # the check can fail
    # The retriever trainer steps on its own (the protocol's step), writing its run records once.
    ret = built["retriever"]
    metrics = ret.step()
    ret.close()
    assert ret.step_no == 1 and "reward" in " ".join(metrics)
    assert (tmp_path / "ret" / "config.json").exists()
    assert len((tmp_path / "ret" / "metrics.jsonl").read_text().splitlines()) == 1


@pytest.fixture
def fake_train(monkeypatch) -> list[Path]:
    """``training.build.train`` replaced by what it leaves (a marked run folder with final/ and its
    config.json); the list of the runs it was asked to train."""
    from harness import safe_delete
    from harness.config import to_dict

    trained: list[Path] = []

    def train(cfg, run, overwrite=False):
        trained.append(run)
        safe_delete.claim(run, "train")
        safe_delete.claim(run / "final", "model")
        (run / "config.json").write_text(json.dumps(to_dict(cfg)))
        return None, run / "final"

    monkeypatch.setattr("training.build.train", train)
    return trained


def test_a_cached_run_is_the_same_from_another_checkout_or_with_a_deviation_reworded(tmp_path, fake_train):
    """A recipe's provenance (``source.shrinks``, a path into the checkout it was composed from;
    ``papers``; each deviation's reason) says where it comes from, not what it trains: a second
    checkout, or a reworded reason, must not make its cached run stale. A trained value still does."""
    from training.build import IDENTITY, StaleRunError, train_cached

    trained = fake_train
    run = tmp_path / "demo" / "rl"
    cfg = compose(TrainConfig, [GRPO_DEMO], [])
    assert cfg.source.shrinks and cfg.deviations
    assert train_cached(cfg, run)[1] is True
    # what another checkout recorded (as a run cached before provenance was left out holds it)
    recorded = json.loads((run / "config.json").read_text())
    recorded["source"]["shrinks"] = "/elsewhere/checkout/" + Path(cfg.source.shrinks).name
    recorded["deviations"][0]["reason"] = "reworded"
    recorded["papers"] = "reworded"
    for name in ("config.json", IDENTITY):
        (run / name).write_text(json.dumps(recorded))
    assert train_cached(cfg, run) == (run / "final", False) and len(trained) == 1
    with pytest.raises(StaleRunError, match=r"optim\.lr"):
        train_cached(compose(TrainConfig, [GRPO_DEMO], ["optim.lr=1e-6"]), run)


def test_a_cached_run_is_the_same_however_its_folder_is_spelled_or_wherever_it_is_copied(
    tmp_path, monkeypatch, fake_train
):
    """Issue 44: the demo's folder copied, then run with ``--out`` spelled relative instead of
    absolute, retrained SFT and re-evaluated everything after it: ``train_cached`` compared the
    recorded paths (the SFT data, the model an RL run starts from, ``trainer.out``) as given."""
    import shutil

    from training.build import train_cached

    def recipe(root) -> TrainConfig:
        source = f"sft.sources=[{{kind: synth, path: {json.dumps(str(root / 'sft' / 'train.jsonl'))}}}]"
        return compose(TrainConfig, [SFT_DEMO], [source, f"trainer.out={root}"])

    trained = fake_train
    root = tmp_path / "demo"
    (root / "sft").mkdir(parents=True)
    (root / "sft" / "train.jsonl").write_text("{}\n")
    assert train_cached(recipe(root), root / "sft" / "model")[1] is True
    monkeypatch.chdir(tmp_path)
    assert train_cached(recipe(Path("demo")), Path("demo/sft/model")) == (Path("demo/sft/model/final"), False)
    shutil.copytree(root, tmp_path / "copy")
    assert train_cached(recipe(tmp_path / "copy"), tmp_path / "copy/sft/model")[1] is False
    assert len(trained) == 1
    # another data file (here one outside the folder) is another recipe: it retrains when asked
    elsewhere = f"sft.sources=[{{kind: synth, path: {json.dumps(str(tmp_path / 'other.jsonl'))}}}]"
    other = compose(TrainConfig, [SFT_DEMO], [elsewhere, f"trainer.out={root}"])
    assert train_cached(other, root / "sft" / "model", replace=True)[1] is True and len(trained) == 2
