"""Device placement, attention choice, autocast and gradient checkpointing, on CPU (the GPU tier,
tests/gpu, runs the same code on CUDA)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from training.batch import Batch
from training.config import ModelConfig
from training.engine import TINY_DEFAULTS, autocast, build_model, check_attn_implementation, engine_device

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}


def test_batch_to_moves_every_tensor():
    b = Batch(
        input_ids=torch.ones(2, 3, dtype=torch.long),
        attention_mask=torch.ones(2, 3, dtype=torch.long),
        loss_mask=torch.ones(2, 3),
        old_logprobs=torch.zeros(2, 3),
        has_rollout_logprobs=True,
        response_start=torch.ones(2, dtype=torch.long),
        group_ids=torch.zeros(2, dtype=torch.long),
        rewards=torch.zeros(2),
        step_spans=[[(0, 1)], []],
    )
    moved = b.to("meta")  # a device without storage: any tensor left behind would stay on cpu
    for k, v in moved.__dict__.items():
        if isinstance(v, torch.Tensor):
            assert v.device.type == "meta", k
    assert moved.step_spans == b.step_spans and moved.has_rollout_logprobs


def test_attn_implementation_is_selectable_and_checked():
    assert check_attn_implementation("sdpa") == "sdpa"
    m = build_model(ModelConfig(tiny=TINY, attn_implementation="eager"), vocab_size=64)
    assert m.config._attn_implementation == "eager"
    assert build_model(ModelConfig(tiny=TINY), vocab_size=64).config._attn_implementation == "sdpa"
    with pytest.raises(ValueError, match="unknown model.attn_implementation"):
        check_attn_implementation("flash3")
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ValueError, match="flash-attn package"):
            check_attn_implementation("flash_attention_2")
    elif not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            check_attn_implementation("flash_attention_2")


def test_autocast_only_on_cuda_and_engine_device():
    assert isinstance(autocast(torch.device("cpu"), True), type(autocast(torch.device("cpu"), False)))
    with autocast(torch.device("cpu"), True):
        assert torch.get_autocast_dtype("cpu") is not None and not torch.is_autocast_enabled("cpu")
    lin = torch.nn.Linear(2, 2)
    assert engine_device(lin).type == "cpu"


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    torch.manual_seed(0)
    plain = build_model(ModelConfig(tiny=TINY), vocab_size=64)
    ckpt = build_model(ModelConfig(tiny=TINY, gradient_checkpointing=True), vocab_size=64)
    ckpt.load_state_dict(plain.state_dict())
    assert ckpt.is_gradient_checkpointing and not plain.is_gradient_checkpointing
    ids = torch.randint(0, 64, (2, 12))
    grads = []
    for m in (plain, ckpt):
        m.train()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        grads.append((float(loss.detach()), m.model.layers[0].mlp.up_proj.weight.grad.clone()))
    assert grads[0][0] == pytest.approx(grads[1][0], abs=1e-6)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=1e-6, rtol=1e-5)
    assert grads[0][1].abs().sum() > 0


def test_gradient_checkpointing_recomputes_layers_on_loaded_weights(tmp_path):
    """from_pretrained returns an eval-mode model, where HF skips checkpointing: build_model must
    put it in training mode, or the option does nothing. Each decoder layer runs twice with it
    (forward, recompute in the backward) and once without (counted inside: the recompute runs no
    module hooks)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    LlamaForCausalLM(LlamaConfig(vocab_size=64, **{**TINY_DEFAULTS, **TINY})).save_pretrained(tmp_path / "m")
    ids = torch.randint(0, 64, (2, 12))
    for on, calls_per_layer in ((True, 2), (False, 1)):
        m = build_model(ModelConfig(path=str(tmp_path / "m"), gradient_checkpointing=on))
        assert m.training
        calls: list[int] = []
        mlp = m.model.layers[0].mlp
        mlp.forward = lambda x, f=mlp.forward, c=calls: c.append(1) or f(x)
        m(input_ids=ids, labels=ids).loss.backward()
        assert len(calls) == calls_per_layer, on
