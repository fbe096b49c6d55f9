"""The DeepSpeed engine on CPU with a tiny Llama: ZeRO 0–3, bf16, accumulation, clipping, warmup,
full-weight gathering, the frozen reference and the critic."""

from __future__ import annotations

import pytest
import torch

from training.config import ModelConfig, OptimConfig
from training.engine import (
    ValueHead,
    build_model,
    ds_config,
    frozen_copy,
    full_state_dict,
    initialize,
    load_full_state_dict,
    optimizer_step,
    warmup_schedule,
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
    assert warmup_schedule(0) is None


def lrs_at_each_optimizer_step(warmup_steps: int, updates_per_step: int, n: int) -> list[float]:
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched = warmup_schedule(warmup_steps, updates_per_step)(opt)
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
        warmup_schedule(3, 0)


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
