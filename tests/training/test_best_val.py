"""trainer.best_metric: validation chooses the weights of final/ (training.best_val)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from harness.config import compose
from tests.training.rl.test_trainer import make, read_jsonl, recipe
from training.best_val import BestValidation
from training.config import TrainConfig

VAL = ("data.val_split=test", "data.val_limit=2", "trainer.eval_every=1", "trainer.best_metric=em")


def test_only_a_strictly_higher_score_is_a_new_best():
    best = BestValidation("em")
    assert best.consider({"em": 0.5, "f1": 0.6}, 0)
    assert best.consider({"em": 0.7}, 3)
    assert not best.consider({"em": 0.7}, 6)  # a tie keeps the earlier step
    assert not best.consider({"em": 0.2}, 9)
    assert (best.step, best.value) == (3, 0.7)


def test_a_metric_the_validation_does_not_report_is_named():
    with pytest.raises(ValueError, match=r"best_metric='exact'.*\['em', 'f1'\]"):
        BestValidation("exact").consider({"em": 0.5, "f1": 0.6, "n": "x"}, 0)


def test_the_best_is_read_back_from_the_log_up_to_the_resumed_step(tmp_path):
    rows = [{"step": 0, "val/em": 0.5}, {"step": 1, "loss": 1.0}, {"step": 2, "val/em": 0.6}]
    rows += [{"step": 2, "val/best_step": 2.0}, {"step": 4, "val/em": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    best = BestValidation.from_log("em", tmp_path / "metrics.jsonl", upto=3)
    assert (best.step, best.value) == (2, 0.6)  # step 4 runs again after the resume
    assert BestValidation.from_log("em", tmp_path / "none.jsonl", upto=3).step is None


def test_a_best_metric_the_validation_does_not_report_is_refused_when_the_trainer_is_built(tmp_path):
    with pytest.raises(ValueError, match=r"best_metric='exact' is not a validation metric \(it reports \['em'"):
        make(tmp_path, *VAL[:-1], "trainer.best_metric=exact")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.eval_every=0", "data.val_split=test"], "needs data.val_split and trainer.eval_every"),
        (["trainer.eval_every=1", "data.val_split=null"], "needs data.val_split and trainer.eval_every"),
        (["algo.kind=sft", "trainer.eval_every=1", "data.val_split=test"], "for algo.kind=sft is 'loss', not 'em'"),
        (["algo.kind=retriever", "trainer.eval_every=1", "data.val_split=null"], "needs data.val_split and trainer"),
    ],
)
def test_a_best_metric_without_validations_to_choose_from_is_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        compose(TrainConfig, [recipe(tmp_path)], ["trainer.best_metric=em", *overrides])


def scripted_validation(trainer, scores: dict[int, float], seen: dict[int, dict]):
    """A validation that reports ``scores[step]`` and records the policy's weights it scored."""

    def validate(step: int):
        seen[step] = {k: v.detach().clone() for k, v in trainer.policy.module.state_dict().items()}
        return SimpleNamespace(metrics={"em": scores[step], "f1": scores[step]})

    trainer.validate = validate


def assert_final_holds(run: Path, weights: dict[str, torch.Tensor]) -> None:
    final = load_file(str(run / "final" / "model.safetensors"))
    shared = [k for k in final if k in weights]
    assert shared and all(torch.equal(final[k], weights[k]) for k in shared)


@pytest.mark.slow
def test_final_holds_the_best_validation_step_and_a_resume_keeps_choosing(tmp_path):
    run = tmp_path / "run"
    seen: dict[int, dict] = {}
    trainer = make(tmp_path, *VAL, "trainer.max_steps=2")
    scripted_validation(trainer, {0: 0.5, 1: 0.7, 2: 0.6}, seen)
    trainer.train()
    assert any(not torch.equal(seen[1][k], seen[2][k]) for k in seen[1])  # the steps' weights differ
    assert_final_holds(run, seen[1])
    assert sorted(p.name for p in run.glob("best-step-*")) == ["best-step-1"]  # kept for a resume
    assert [r["val/best_step"] for r in read_jsonl(run / "metrics.jsonl") if "val/best_step" in r] == [0, 1, 1]

    # More steps on a resume: step 3 scores 0.65, so step 1 stays the best; then step 4 beats it.
    for steps, scores, chosen in ((3, {3: 0.65}, 1), (4, {4: 0.8}, 4)):
        resumed = make(tmp_path, *VAL, f"trainer.max_steps={steps}")
        resumed.resume(run)
        assert resumed.best.step == 1  # from the log, up to the resumed step
        scripted_validation(resumed, scores, seen)
        resumed.train()
        assert_final_holds(run, seen[chosen])
        assert sorted(p.name for p in run.glob("best-step-*")) == [f"best-step-{chosen}"]


@pytest.mark.slow
def test_a_run_that_never_beats_its_start_ends_with_the_starting_policy(tmp_path):
    seen: dict[int, dict] = {}
    trainer = make(tmp_path, *VAL, "trainer.max_steps=1")
    scripted_validation(trainer, {0: 0.5, 1: 0.5}, seen)
    trainer.train()
    assert_final_holds(tmp_path / "run", seen[0])


@pytest.mark.slow
def test_a_resume_whose_best_weights_are_gone_says_so(tmp_path):
    import shutil

    trainer = make(tmp_path, *VAL, "trainer.max_steps=1")
    scripted_validation(trainer, {0: 0.5, 1: 0.7}, {})
    trainer.train()
    shutil.rmtree(tmp_path / "run" / "best-step-1")
    resumed = make(tmp_path, *VAL, "trainer.max_steps=2")
    with pytest.raises(FileNotFoundError, match=r"so far \(step 1\) has no weights in .*best-step-1"):
        resumed.resume(tmp_path / "run")


@pytest.mark.parametrize(
    "kind, overrides, message",
    [
        ("sft", ["trainer.eval_every=1"], "needs sft.val_fraction and trainer.eval_every"),
        ("sft", ["sft.val_fraction=0.1"], "needs sft.val_fraction and trainer.eval_every"),
        ("prm", ["trainer.eval_every=1", "prm.val_fraction=0"], "needs prm.val_fraction and trainer.eval_every"),
    ],
)
def test_sft_and_prm_best_metrics_need_their_held_out_share(tmp_path, kind, overrides, message):
    metric = {"sft": "loss", "prm": "pair_acc"}[kind]
    with pytest.raises(ValueError, match=message):
        compose(TrainConfig, [], [f"algo.kind={kind}", f"trainer.best_metric={metric}", *overrides])
    with pytest.raises(ValueError, match=f"for algo.kind={kind} is '{metric}', not 'em'"):
        compose(TrainConfig, [], [f"algo.kind={kind}", "trainer.best_metric=em", "trainer.eval_every=1"])


def test_a_lower_loss_is_the_better_one():
    best = BestValidation("loss")
    assert best.consider({"loss": 2.0}, 1) and best.consider({"loss": 1.0}, 2)
    assert not best.consider({"loss": 1.0}, 3) and not best.consider({"loss": 1.5}, 4)
    assert (best.step, best.value) == (2, 1.0)


SFT_TINY = """
name: sft-best
model:
  tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1}
algo: {kind: sft}
sft: {batch_size: 2, val_fraction: 0.2}
optim: {lr: 3.0e-3, micro_batch_size: 2}
trainer: {max_steps: 3, save_every: 0, eval_every: 1, best_metric: loss, tensorboard: false, progress: false}
"""


def test_sft_final_holds_the_step_with_the_lowest_held_out_loss(tmp_path):
    """ProRAG's SFT (HF load_best_model_at_end, metric_for_best_model eval_loss, greater_is_better
    False over a 1 % split): val/loss 2.0, 1.0, 1.5 at steps 1-3 -> final/ is step 2's weights."""
    from training.build import build_trainer

    msgs = [[{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"answer {i}"}] for i in range(10)]
    data = tmp_path / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in msgs))
    (tmp_path / "r.yaml").write_text(SFT_TINY)
    cfg = compose(TrainConfig, [tmp_path / "r.yaml"], [f"sft.sources=[{{kind: chat, path: {data}}}]"])
    run = tmp_path / "run"
    trainer = build_trainer(cfg, run)
    assert (len(trainer.data), len(trainer.val)) == (8, 2)
    losses, seen = {1: 2.0, 2: 1.0, 3: 1.5}, {}

    def scripted(trajs=None):
        assert trajs is trainer.val  # the held-out share, not the training data
        seen[trainer.step_no] = {k: v.detach().clone() for k, v in trainer.policy.module.state_dict().items()}
        return losses[trainer.step_no]

    trainer.evaluate_loss = scripted
    trainer.train()
    assert any(not torch.equal(seen[2][k], seen[3][k]) for k in seen[2])
    assert_final_holds(run, seen[2])
    rows = read_jsonl(run / "metrics.jsonl")
    assert [r["val/loss"] for r in rows if "val/loss" in r] == [2.0, 1.0, 1.5]
    assert [r["val/best_step"] for r in rows if "val/best_step" in r] == [1, 2, 2]


def test_final_is_made_of_the_best_folder_with_its_subfolders_and_kind(tmp_path):
    """A kept encoder (retriever RL: kind "encoder") with a LoRA tower's adapter/ subfolder: final
    holds every file of it, the subfolder too, marked as the same kind; the other kept folders go."""
    from harness import safe_delete
    from harness.fsutil import atomic_dir
    from training.best_val import best_dir

    for step in (0, 2):
        with atomic_dir(best_dir(tmp_path, step), kind="encoder") as tmp:
            (tmp / "model.safetensors").write_text(f"weights {step}")
            (tmp / "adapter").mkdir()
            (tmp / "adapter" / "adapter_model.safetensors").write_text(f"adapter {step}")
    best = BestValidation("em", value=0.7, step=2, kind="encoder")
    final = best.to_final(tmp_path, tmp_path / "encoder")
    assert (final / "model.safetensors").read_text() == "weights 2"
    assert (final / "adapter" / "adapter_model.safetensors").read_text() == "adapter 2"
    assert safe_delete.read_marker(final)["kind"] == "encoder"
    assert not best_dir(tmp_path, 0).exists() and best_dir(tmp_path, 2).is_dir()
