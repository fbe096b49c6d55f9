"""The DeepSpeed engine on CPU with a tiny Llama: ZeRO 0–3, bf16, accumulation, clipping, the LR
schedules after their warmup, full-weight gathering, the frozen reference and the critic."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.ports import child_env
from training.config import ModelConfig, OptimConfig
from training.engine import (
    ValueHead,
    build_model,
    ds_config,
    frozen_copy,
    full_state_dict,
    initialize,
    load_full_state_dict,
    lr_schedule,
    optimizer_step,
)

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
TINY["num_key_value_heads"] = 1
VOCAB = 64


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(ModelConfig(tiny=TINY), vocab_size=VOCAB)


def micro_step(engine, x):
    loss = engine(input_ids=x, labels=x).loss
    engine.backward(loss)
    return optimizer_step(engine), float(loss)


def batch(seed: int = 0):
    return torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(seed))  # [2, 10]


def test_ds_config_accumulates_to_one_step_per_batch_and_warms_up():
    cfg = OptimConfig(micro_batch_size=4, grad_clip=0.5, zero_stage=2, bf16=True, warmup_steps=10)
    c = ds_config(cfg, batch_size=16, lr=3e-6)
    assert c["gradient_accumulation_steps"] == 4  # 16 rows in micro-batches of 4, one process
    assert c["gradient_clipping"] == 0.5 and c["zero_optimization"]["stage"] == 2 and c["bf16"]["enabled"]
    assert ds_config(OptimConfig(micro_batch_size=4), batch_size=6, lr=1.0)["gradient_accumulation_steps"] == 2
    assert lr_schedule(OptimConfig()) is None  # constant, no warmup: DeepSpeed keeps the LR as it is


def lrs_at_each_optimizer_step(
    warmup_steps: int, updates_per_step: int, n: int, max_steps: int | None = None, lr: float = 2.0, **optim
) -> list[float]:
    """The LR of each of ``n`` optimizer steps, ``optim`` being OptimConfig fields (schedule, ...)."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    sched = lr_schedule(OptimConfig(warmup_steps=warmup_steps, **optim), None, updates_per_step, max_steps)(opt)
    lrs = []
    for _ in range(n):  # DeepSpeed steps the scheduler after every optimizer step
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


def test_warmup_counts_training_steps_as_verl():
    # verl's get_constant_schedule_with_warmup: training step t (0-based) at lr · t / W, then lr.
    # W = 4, one optimizer step per training step (SFT, PRM): 2 × [0, 1/4, 2/4, 3/4, 1, 1].
    assert lrs_at_each_optimizer_step(4, 1, 6) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    # W = 3, 2 optimizer steps per training step (e.g. 2 mini-batches, 1 epoch): both optimizer
    # steps of training step t run at 2 × t/3, so the warmup lasts 3 training steps = 6 optimizer steps
    # (counting optimizer steps, as before, would have reached the full LR after 3).
    assert lrs_at_each_optimizer_step(3, 2, 8) == pytest.approx([0, 0, 2 / 3, 2 / 3, 4 / 3, 4 / 3, 2, 2])
    # Search-R1 (v0.2): 512 prompts, mini-batches of 256 → 2 optimizer steps per training step,
    # warmup int(0.285 × 1005) = 286 training steps; the LR of training step 143 is half the peak.
    lrs = lrs_at_each_optimizer_step(286, 2, 2 * 287)
    assert lrs[2 * 143] == lrs[2 * 143 + 1] == pytest.approx(1.0) and lrs[2 * 286] == 2.0
    with pytest.raises(ValueError, match="updates_per_step"):
        lr_schedule(OptimConfig(warmup_steps=3), None, 0)


def test_linear_decay_is_hfs_default_schedule():
    # HF's get_linear_schedule_with_warmup, warmup 2, 10 optimizer steps, lr 2: step s runs at
    # 2 · s/2 in the warmup, then 2 · (10 − s)/8: 0, 1, 2, 1.75, 1.5, 1.25, 1, .75, .5, .25, then 0.
    lrs = lrs_at_each_optimizer_step(2, 1, 11, max_steps=10, schedule="linear", schedule_unit="optimizer_step")
    assert lrs == pytest.approx([0, 1, 2, 1.75, 1.5, 1.25, 1, 0.75, 0.5, 0.25, 0])
    # To a floor of .1 · lr, no warmup, 5 steps: 2 · (.1 + .9 · (1 − s/5)) = 2, 1.64, 1.28, .92, .56, .2, held.
    lrs = lrs_at_each_optimizer_step(0, 1, 7, max_steps=5, schedule="linear", min_lr_ratio=0.1)
    assert lrs == pytest.approx([2, 1.64, 1.28, 0.92, 0.56, 0.2, 0.2])
    # ProRAG's RL (TRL 0.26 on HF's Trainer): lr 1e-5 over one epoch of 1,237 optimizer steps, no warmup:
    # step 618 at 1e-5 · 619/1237 = 5.004042e-6, the last (1236) at 1e-5/1237 = 8.084074e-9.
    lrs = lrs_at_each_optimizer_step(0, 1, 1237, max_steps=1237, lr=1e-5, schedule="linear")
    assert lrs[0] == 1e-5 and lrs[618] == pytest.approx(5.004042e-6, rel=1e-6)
    assert lrs[1236] == pytest.approx(8.084074e-9, rel=1e-6)


def test_cosine_decay_to_a_minimum_ratio():
    # OpenRLHF's cosine_with_min_lr (min_lr = .1 · lr), no warmup, 4 optimizer steps, lr 2:
    # 2 · (.1 + .9 · ½(1 + cos(π s/4))) = 2, 1.736396 (s 1: ½(1 + .707107) = .853553), 1.1,
    # .463604, then .2 at the end and held there.
    lrs = lrs_at_each_optimizer_step(0, 1, 6, max_steps=4, schedule="cosine", min_lr_ratio=0.1)
    assert lrs == pytest.approx([2, 1.736396, 1.1, 0.463604, 0.2, 0.2], abs=1e-6)
    # verl's cosine (min_lr_ratio 0) counts training steps: 2 optimizer steps each, warmup 1, 3
    # training steps: t = 0 at 0, t = 1 at progress 0 (the full LR), t = 2 at progress ½ (half).
    lrs = lrs_at_each_optimizer_step(1, 2, 6, max_steps=3, schedule="cosine")
    assert lrs == pytest.approx([0, 0, 2, 2, 1, 1])
    # The same run counted in optimizer steps (HF's Trainer): 6 steps, warmup 1; s = 2..5 at progress
    # (s − 1)/5: 2 · ½(1 + cos(π/5)) = 1.809017, cos(2π/5): 1.309017, .690983, .190983.
    lrs = lrs_at_each_optimizer_step(1, 2, 6, max_steps=3, schedule="cosine", schedule_unit="optimizer_step")
    assert lrs == pytest.approx([0, 2, 1.809017, 1.309017, 0.690983, 0.190983], abs=1e-6)
    # optim.schedule_steps sets the horizon instead of the run: R1-Searcher stage 1 decays over
    # 930,000 optimizer steps (10,000 episodes), so 400 steps in, the LR has not moved by 1e-6.
    lrs = lrs_at_each_optimizer_step(
        0, 4, 401, lr=2e-6, schedule="cosine", min_lr_ratio=0.1, schedule_unit="optimizer_step", schedule_steps=930_000
    )
    assert lrs[400] == pytest.approx(2e-6 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 400 / 930_000))), rel=1e-12)
    assert lrs[400] > 2e-6 * (1 - 1e-6)


def test_schedule_options_are_checked():
    with pytest.raises(ValueError, match="decays over the run"):
        lr_schedule(OptimConfig(schedule="linear"))  # no run length and no schedule_steps
    for bad in ({"min_lr_ratio": 1.5}, {"min_lr_ratio": -0.1}, {"schedule_steps": 0}):
        with pytest.raises(ValueError, match="min_lr_ratio|schedule_steps"):
            OptimConfig(**bad)


@pytest.mark.slow
@pytest.mark.parametrize("stage,bf16", [(0, False), (1, False), (2, False), (3, False), (2, True)])
def test_zero_stages_step_and_gather_full_weights(stage, bf16):
    model = tiny_model()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    before = {k: v.clone() for k, v in model.state_dict().items()}
    engine = initialize(model, OptimConfig(zero_stage=stage, micro_batch_size=2, bf16=bf16), lr=1e-2, batch_size=2)
    assert engine.zero_optimization_stage() == stage
    grad_norm, loss = micro_step(engine, batch())
    assert grad_norm is not None and grad_norm > 0 and loss > 0
    full = full_state_dict(engine)  # gathered even when ZeRO-3 partitions the parameters
    assert {k: tuple(v.shape) for k, v in full.items()} == shapes
    assert any(not torch.allclose(before[k].float(), full[k].float()) for k in shapes)
    if bf16:
        assert next(engine.module.parameters()).dtype == torch.bfloat16
    load_full_state_dict(engine, {k: v.to(full[k].dtype) for k, v in before.items()})
    assert all(torch.allclose(before[k].float(), v.float(), atol=1e-2) for k, v in full_state_dict(engine).items())


@pytest.mark.slow
def test_accumulation_clipping_warmup_reference_and_critic():
    model = tiny_model()
    ref = frozen_copy(model)
    cfg = OptimConfig(micro_batch_size=2, grad_clip=1e-3, warmup_steps=4)
    engine = initialize(model, cfg, lr=1e-2, batch_size=4)  # 2 micro-batches per optimizer step
    assert engine.gradient_accumulation_steps() == 2 and engine.gradient_clipping() == 1e-3
    w0 = engine.module.lm_head.weight.detach().clone()
    assert micro_step(engine, batch(1))[0] is None  # no boundary: no optimizer step yet
    assert torch.equal(engine.module.lm_head.weight, w0)
    norm, _ = micro_step(engine, batch(2))
    assert norm is not None and norm > 1e-3  # reported before clipping to 1e-3
    assert torch.equal(engine.module.lm_head.weight, w0)  # the first warmup step runs at LR 0 (verl)
    lrs = [engine.get_lr()[0]]  # after 1 optimizer step
    for i in range(6):  # 3 more optimizer steps
        micro_step(engine, batch(3 + i))
        lrs.append(engine.get_lr()[0])
    assert not torch.equal(engine.module.lm_head.weight, w0)
    assert lrs[::2] == pytest.approx([0.25e-2, 0.5e-2, 0.75e-2, 1e-2])  # linear warmup over 4 steps
    # The reference is frozen and untouched by the policy's updates.
    assert not any(p.requires_grad for p in ref.parameters())
    assert torch.equal(ref.lm_head.weight, w0)
    critic = ValueHead(tiny_model(1))
    values = critic(batch(), torch.ones(2, 10, dtype=torch.long))
    assert values.shape == (2, 10)  # [B, L]: one value per position


_LISTENING = """
import os, sys
from pathlib import Path
from benchmarks import tiny_recipes
from harness.config import compose
from training.build import make_trainer
from training.config import TrainConfig

def listening():  # the addresses this process's own TCP sockets listen on
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            mine.add(target[8:-1])
    found = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            parts = line.split()
            if parts[3] == "0A" and parts[9] in mine:
                found.append(parts[1].split(":")[0])
    return found

recipe = tiny_recipes.sft_recipe(Path(sys.argv[1]))
make_trainer(compose(TrainConfig, [recipe], []), Path(sys.argv[1]) / "run")
print("LISTENING", " ".join(listening()))
"""


@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="reads Linux's /proc/self/net/tcp")
def test_a_single_process_run_listens_on_no_outside_interface(tmp_path):
    """Issue 44: a single-process CPU run opened torch's TCPStore on every interface (``*:PORT``);
    a world of one needs no rendezvous port. What is left (gloo's own pair) is on loopback."""
    env = {**child_env(), "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run(
        [sys.executable, "-c", _LISTENING, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    line = next((x for x in out.stdout.splitlines() if x.startswith("LISTENING")), None)
    assert line is not None, out.stderr[-2000:]
    loopback = ("0100007F", "00000000000000000000000001000000")  # 127.0.0.1, ::1 as /proc writes them
    assert all(addr in loopback for addr in line.split()[1:]), line


def test_the_fused_adamw_makes_the_loops_update_and_skips_a_non_finite_step():
    """optim.fused: torch's fused kernel in the engine, the same three updates as the per-parameter
    loop up to float rounding; a step with a NaN gradient is still skipped whole (FiniteAdamW)."""
    finals = []
    for fused in (True, False):
        engine = initialize(
            tiny_model(), OptimConfig(micro_batch_size=2, fused=fused, weight_decay=0.01), lr=1e-2, batch_size=2
        )
        assert engine.optimizer.defaults["fused"] is (True if fused else None)
        for seed in range(3):
            micro_step(engine, batch(seed))
        finals.append(full_state_dict(engine))
    changed = 0
    for k, v in finals[0].items():
        torch.testing.assert_close(v, finals[1][k], atol=1e-5, rtol=1e-5)
        changed += not torch.equal(v, tiny_model().state_dict()[k])
    assert changed
    engine = initialize(tiny_model(), OptimConfig(micro_batch_size=2, fused=True), lr=1e-2, batch_size=2)
    before = {k: v.clone() for k, v in full_state_dict(engine).items()}
    loss = engine(input_ids=batch(), labels=batch()).loss
    engine.backward(loss * float("nan"))
    optimizer_step(engine)
    assert not engine.was_step_applied()
    assert all(torch.equal(before[k], v) for k, v in full_state_dict(engine).items())
