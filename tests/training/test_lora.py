"""LoRA through peft: merged weights by hand, a LoRA GRPO run that trains only the adapters and
syncs merged weights into the in-process hf backend, the reference as the base with adapters
disabled, checkpoints holding the adapters, and SGLang's /load_lora_adapter protocol against a
stand-in server (NOT against real SGLang)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from training.config import LoraConfig, ModelConfig
from training.engine import build_model
from training.lora import adapters_disabled, apply_lora, merged_state_dict

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
LORA = "model.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}"  # the GRPO/PPO runs' adapters


def test_merged_weights_by_hand_and_under_the_base_names():
    torch.manual_seed(0)
    base = build_model(ModelConfig(tiny=TINY), vocab_size=64)
    names = set(base.state_dict())
    w_q = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    model = apply_lora(base, LoraConfig(r=2, alpha=4, target_modules=["q_proj", "v_proj"]))
    q = model.get_base_model().model.layers[0].self_attn.q_proj
    with torch.no_grad():  # peft starts B at 0 (ΔW = 0); give it a value to see the merge
        q.lora_B["default"].weight.fill_(0.5)
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight  # [r, in], [out, r]
    merged = merged_state_dict(model)
    assert set(merged) == names  # exactly the base model's keys: no lora_, no base_layer
    # ΔW = (alpha / r) · B @ A = 2 · B @ A
    torch.testing.assert_close(merged["model.layers.0.self_attn.q_proj.weight"], w_q + 2.0 * b @ a)
    assert q.base_layer.weight.equal(w_q)  # nothing merged in place
    # A plain model with the merged weights computes what the adapted model computes.
    plain = build_model(ModelConfig(tiny=TINY), vocab_size=64)
    plain.load_state_dict(merged)
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
        with adapters_disabled(model):  # the reference: the base, no second copy
            ref = model(input_ids=ids).logits
        base_again = build_model(ModelConfig(tiny=TINY), vocab_size=64)
        base_again.load_state_dict({**merged, "model.layers.0.self_attn.q_proj.weight": w_q})
        torch.testing.assert_close(ref, base_again(input_ids=ids).logits, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_lora_grpo_trains_adapters_only_and_syncs_into_hf(tmp_path):
    from tests.training.rl.test_trainer import make

    trainer = make(tmp_path, LORA, "algo.reward=test_length", "algo.kl_coef=0.05", "algo.ppo_epochs=2")
    assert trainer.rl_update.ref is None and trainer.rl_update.ref_is_base  # no second copy for the KL reference
    before = {k: v.detach().clone() for k, v in trainer.policy.module.named_parameters()}
    trainable = {k for k, p in trainer.policy.module.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    m = trainer.step()
    assert m["kl"] >= 0 and m["grad_norm"] > 0
    after = dict(trainer.policy.module.named_parameters())
    assert any(not torch.equal(before[k], after[k]) for k in trainable), "adapters must change"
    assert all(torch.equal(before[k], after[k]) for k in before if k not in trainable), "base must stay frozen"
    # The hf backend serves the merged weights of step 1.
    assert trainer.backend.weight_version == "1"
    served = trainer.backend.model.state_dict()
    for k, v in merged_state_dict(trainer.policy).items():
        torch.testing.assert_close(served[k], v)
    assert not torch.equal(
        served["model.layers.0.self_attn.q_proj.weight"],
        before["base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"],
    )
    # The checkpoint holds the adapters.
    ckpt = load_file(str(tmp_path / "run" / "checkpoints" / "step-1" / "model.safetensors"))
    assert any("lora_A" in k for k in ckpt) and any("lora_B" in k for k in ckpt)


def test_sglang_adapter_sync_protocol_against_a_stand_in(tmp_path):
    from harness.backends.base import SamplingParams
    from harness.backends.sglang import SGLangBackend
    from harness.tokenization import byte_tokenizer
    from tests.harness.conftest import ServerThread
    from tests.helpers.sglang_standin import SGLangStandIn

    standin = SGLangStandIn()
    with ServerThread(standin.app()) as server:
        backend = SGLangBackend(server.url, tokenizer=byte_tokenizer(), health_check=False, max_context=512)
        backend.update_lora_adapter(tmp_path / "adapter-v0", 0)
        backend.update_lora_adapter(tmp_path / "adapter-v1", 1)
        assert [p for p, _ in standin.calls] == [
            "/load_lora_adapter",
            "/flush_cache",
            "/load_lora_adapter",
            "/flush_cache",
            "/unload_lora_adapter",
        ]
        assert standin.of("/load_lora_adapter")[1] == {
            "lora_name": "policy-v1",
            "lora_path": str(tmp_path / "adapter-v1"),
        }
        assert standin.of("/unload_lora_adapter") == [{"lora_name": "policy-v0"}]
        assert backend.weight_version == "1" and standin.loaded == {"policy-v1"}
        assert backend.payload([1, 2], SamplingParams(max_new_tokens=4))["lora_path"] == "policy-v1"


@pytest.mark.slow
def test_lora_ppo_critic_trains_its_adapters_and_head(tmp_path):
    from tests.training.rl.test_trainer import make

    trainer = make(tmp_path, LORA, "algo.reward=test_length", "algo.advantage=gae", "trainer.save_every=0")
    critic = trainer.critic.module
    trainable = {k for k, p in critic.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k or k.startswith("head.") for k in trainable)
    before = {k: v.detach().clone() for k, v in critic.named_parameters()}
    m = trainer.step()
    assert "value_loss" in m
    after = dict(critic.named_parameters())
    assert not torch.equal(before["head.weight"], after["head.weight"])
    assert all(torch.equal(before[k], after[k]) for k in before if k not in trainable)
