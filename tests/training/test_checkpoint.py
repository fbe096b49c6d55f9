"""Checkpoints: RNG round trip, atomic writes (no half checkpoint is ever picked up), exact resume
under ZeRO 0/2/3, and the exported model loading through ``harness eval --model DIR``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from harness.tokenization import byte_tokenizer
from training.checkpoint import export_hf, latest_checkpoint, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from training.config import ModelConfig, OptimConfig
from training.engine import build_model, full_state_dict, initialize, optimizer_step

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
TINY["num_key_value_heads"] = 1


def engine(stage: int = 0, vocab: int = 64):
    torch.manual_seed(0)
    model = build_model(ModelConfig(tiny=TINY), vocab_size=vocab)
    return initialize(model, OptimConfig(zero_stage=stage, micro_batch_size=2, warmup_steps=3), lr=1e-2, batch_size=2)


def train_step(eng, seed: int) -> float:
    x = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(seed))  # [2, 12]
    loss = eng(input_ids=x, labels=x).loss
    eng.backward(loss)
    optimizer_step(eng)
    return float(loss.detach())


def test_rng_states_round_trip():
    set_rng_state(rng_state())  # JSON-able and loadable
    state = json.loads(json.dumps(rng_state()))
    expect = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    set_rng_state(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expect


def test_latest_checkpoint_ignores_partial_writes(tmp_path):
    (tmp_path / "step-2").mkdir()
    (tmp_path / "step-2" / "trainer_state.json").write_text("{}")
    (tmp_path / ".step-4.tmp").mkdir()  # a crash during the write of step 4
    (tmp_path / "step-3").mkdir()  # no trainer_state.json: not complete
    assert latest_checkpoint(tmp_path) == tmp_path / "step-2"
    assert latest_checkpoint(tmp_path / "none") is None


@pytest.mark.slow
@pytest.mark.parametrize("stage", [0, 2, 3])
def test_resume_continues_exactly(tmp_path, stage):
    """Save after step 1, keep going; a fresh engine loaded from the checkpoint takes the same step 2
    (same loss, same weights after it: compared exactly, tolerance 0)."""
    a = engine(stage)
    train_step(a, 1)
    ckpt = save_checkpoint(tmp_path, 1, a, {"sampler": {"epoch": 0, "index": 2}})
    assert not list(tmp_path.glob(".*.tmp"))  # renamed into place
    assert {p.name for p in ckpt.iterdir()} >= {"model.safetensors", "model_optim_rank0.pt", "trainer_state.json"}
    expect_rand, lr_a = torch.rand(3), a.get_lr()
    loss_a = train_step(a, 2)

    b = engine(stage)
    state = load_checkpoint(ckpt, b)
    assert state["step"] == 1 and state["sampler"] == {"epoch": 0, "index": 2}
    assert torch.equal(torch.rand(3), expect_rand)  # RNG restored to the moment of saving
    assert b.get_lr() == lr_a  # the warmup schedule's position restored
    loss_b = train_step(b, 2)
    assert loss_b == loss_a
    wa, wb = full_state_dict(a), full_state_dict(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["final", "checkpoint"])
def test_exported_model_loads_with_harness_eval(tmp_path, what):
    """``final/`` and an intermediate checkpoint given the trainer's tokenizer both evaluate as they are."""
    from cli.main import app

    tok = byte_tokenizer()
    eng = engine(0, vocab=len(tok))
    train_step(eng, 1)
    if what == "final":
        final = export_hf(eng, tok, tmp_path / "final")
    else:
        final = save_checkpoint(tmp_path / "checkpoints", 1, eng, {"sampler": {}}, tokenizer=tok)
        assert "tokenizer.json" in json.loads((final / "trainer_state.json").read_text())["files"]  # verified too
    assert (final / "config.json").is_file() and (final / "tokenizer.json").is_file()
    assert list(final.glob("*.safetensors"))
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "--model",
            str(final),
            "--method",
            "search_r1",
            "--dataset",
            "demo",
            "--limit",
            "1",
            "--retriever",
            "memory",
            "--out",
            str(tmp_path / "runs"),
            "agent.max_new_tokens=4",
            "agent.max_turns=1",
        ],
    )
    assert result.exit_code == 0, result.output
    run = next((tmp_path / "runs").glob("search_r1-demo-*"))
    assert (run / "results.json").is_file()
    assert len((run / "trajectories.jsonl").read_text().splitlines()) == 1


def test_truncated_weights_fall_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    from training.checkpoint import CheckpointError, verify_checkpoint

    a = engine()
    for step in (1, 2, 3):
        train_step(a, step)
        save_checkpoint(tmp_path, step, a, {"sampler": {"epoch": 0, "index": step}})
    state = json.loads((tmp_path / "step-3" / "trainer_state.json").read_text())
    assert state["files"]["model.safetensors"]["size"] == (tmp_path / "step-3" / "model.safetensors").stat().st_size
    assert len(state["files"]["model.safetensors"]["sha256"]) == 64
    assert latest_checkpoint(tmp_path) == tmp_path / "step-3"

    weights = tmp_path / "step-3" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated (a full disk, a copy cut short)
    with caplog.at_level("WARNING", logger="training.checkpoint"):
        assert latest_checkpoint(tmp_path) == tmp_path / "step-2"
    assert "step-3" in caplog.text and "model.safetensors" in caplog.text
    # Same size, flipped bytes: the hash catches it.
    opt = tmp_path / "step-2" / "model_optim_rank0.pt"
    data = bytearray(opt.read_bytes())
    data[-10] ^= 0xFF
    opt.write_bytes(bytes(data))
    assert "sha256" in verify_checkpoint(tmp_path / "step-2")
    assert latest_checkpoint(tmp_path) == tmp_path / "step-1"
    (tmp_path / "step-1" / "trainer_state.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint.*step-3.*step-2.*step-1"):
        latest_checkpoint(tmp_path)
    # Loading a damaged file directly is a clear error too, not a bare SafetensorError.
    with pytest.raises(CheckpointError, match=r"step-3/model.safetensors: cannot be loaded"):
        load_checkpoint(tmp_path / "step-3", engine())


def _stub_trainer(out, run_id, keep=2, save_every=0, minutes=0.0, max_steps=100):
    """A Trainer with only what save() and _save_due() read (the real methods run)."""
    import time
    from types import SimpleNamespace

    from training.divergence import NonFiniteGuard
    from training.rl.trainer import RLTrainer

    t = RLTrainer.__new__(RLTrainer)
    t.guard = NonFiniteGuard(5)
    t.out, t.run_id, t.rank, t.critic, t.step_no, t.tokenizer = out, run_id, 0, None, 0, None
    t.policy = engine()
    t.sampler = SimpleNamespace(state=lambda: {"epoch": 0, "index": 0})
    t.cfg = SimpleNamespace(
        trainer=SimpleNamespace(
            keep_checkpoints=keep, save_every=save_every, save_every_minutes=minutes, max_steps=max_steps
        )
    )
    t._saved_step, t._saved_at = -1, time.monotonic()
    return t


def test_pruning_leaves_other_runs_checkpoints(tmp_path):
    other = _stub_trainer(tmp_path, "other-run", save_every=1)
    for step in (5, 6):
        other.step_no = step
        other.save()
    mine = _stub_trainer(tmp_path, "this-run", keep=2, save_every=1)
    for step in (1, 2, 3):
        mine.step_no = step
        mine.save()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["step-2", "step-3", "step-5", "step-6"]  # only this run's step-1 was pruned


def test_time_based_checkpoints_are_interim_and_never_push_out_the_every_n_steps_ones(tmp_path):
    """save_every=6, keep 2, a clock checkpoint now and then: the clock's are for resuming only, so
    the next checkpoint replaces each, and steps 6/12/18 are pruned by keep alone (issue 19 needed
    a watcher copying them out when the clock's counted towards keep)."""
    t = _stub_trainer(tmp_path, "r", keep=2, save_every=6, max_steps=20)
    kept = []
    for step in (2, 4, 6, 9, 12, 14, 16, 18, 19, 20):
        t.step_no = step
        t.save()
        kept.append(sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir()))
    assert kept == [
        [2],
        [4],  # an interim one replaces the previous interim one
        [6],  # ... and a regular one replaces it too
        [6, 9],
        [6, 12],
        [6, 12, 14],  # interim: keep counts 6 and 12 only
        [6, 12, 16],
        [12, 18],  # keep 2 of the every-6-steps ones; 16 superseded
        [12, 18, 19],
        [18, 20],  # the last step is regular (the run ends there): it counts towards keep
    ]
    t.cfg.trainer.keep_checkpoints = 0  # keep all: nothing is pruned, interim ones included
    for step in (21, 24):
        t.step_no = step
        t.save()
    assert sorted(int(p.name.split("-")[1]) for p in (tmp_path / "checkpoints").iterdir()) == [18, 20, 21, 24]


def test_time_based_checkpoints(tmp_path):
    t = _stub_trainer(tmp_path, "r", save_every=10, minutes=0.5)
    t.step_no = 3
    assert not t._save_due()
    t._saved_at -= 31  # half a minute since the last save
    assert t._save_due()
    t.step_no = 10
    t._saved_at += 31
    assert t._save_due()  # the step count still triggers


def test_a_write_that_fails_without_naming_its_file_is_named(tmp_path):
    """Issue 44: a disk that filled during a checkpoint named no path at 2 of 4 fill points (a
    write that fails after its open raises an OSError with no file name) and at a third the
    tokenizers library's bare Exception was a traceback."""
    import errno

    from training.checkpoint import write_errors

    def full(error: BaseException):
        with pytest.raises(OSError) as e, write_errors(tmp_path / "trainer_state.json"):
            raise error
        return str(e.value)

    said = full(OSError(errno.ENOSPC, "No space left on device"))
    assert said.startswith(f"{tmp_path / 'trainer_state.json'}: cannot be written (No space left on device;"), said
    said = full(Exception("No space left on device (os error 28)"))  # tokenizers' save
    assert f"{tmp_path / 'trainer_state.json'}: cannot be written" in said
    with pytest.raises(OSError) as named, write_errors(tmp_path / "x"):  # a file already named: as it was
        raise FileNotFoundError(errno.ENOENT, "missing", "/somewhere/else")
    assert named.value.filename == "/somewhere/else"
    with pytest.raises(ValueError), write_errors(tmp_path / "x"):  # not a write error: untouched
        raise ValueError("bad")
