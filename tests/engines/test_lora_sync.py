"""LoRA weight sync into real engines (CPU, float32), both ways ``model.lora.sync`` offers:
``adapter`` (the engine loads the peft adapter and rollouts name it) and ``merged`` (W + ΔW pushed as
full weights). Both must serve the same model, so their greedy outputs must agree with each other
and with hf+peft's, and differ from the base model's.

- vLLM 0.32: runs (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1``, ``/v1/load_lora_adapter``;
  merged through ``/collective_rpc reload_weights`` in dev mode).
- SGLang 0.5.23 on CPU: cannot start with ``--enable-lora`` on a machine without an NVIDIA driver.
  Every LoRA layer allocates a pinned-memory tensor (``pin_memory=True`` in sglang/srt/lora/layers.py),
  which fails with "RuntimeError: Found no NVIDIA driver on your system". The test tries to start it
  and skips with the error the engine printed, so it runs by itself once SGLang fixes that.
  SGLang's merged path is the full-weight sync of test_served_model.py.
"""

from __future__ import annotations

import pytest

from harness.engines import EngineError
from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]

RANK = 8
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_ARGS = {
    "vllm": ["--enable-lora", "--max-lora-rank", str(RANK), "--max-loras", "2"],
    "sglang": [
        "--enable-lora",
        "--max-lora-rank",
        str(RANK),
        "--lora-target-modules",
        *TARGETS,
        "--lora-backend",
        "torch_native",
        "--max-loras-per-batch",
        "2",
    ],
}
LORA_ENV = {"vllm": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}, "sglang": {}}


def _start_error(log_dir) -> str:
    """The engine's own error line from its log (what the skip reason quotes)."""
    lines = [ln for p in log_dir.glob("*.log") for ln in p.read_text(errors="replace").splitlines()]
    errors = [ln for ln in lines if "Error:" in ln]
    return errors[-1].strip() if errors else (lines[-1] if lines else "no log")


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def backend(request, model_dir, tmp_path_factory):
    engine = request.param
    log_dir = tmp_path_factory.mktemp(f"{engine}-lora-logs")
    try:
        with checks.serve(engine, model_dir, log_dir, args=LORA_ARGS[engine], env=LORA_ENV[engine]) as server:
            if engine == "sglang":
                from harness.backends.sglang import SGLangBackend

                b = SGLangBackend(server.url, model=model_dir)
            else:
                from harness.backends.openai import OpenAIBackend

                b = OpenAIBackend(server.url, model=model_dir)
            yield b
            b.close()
    except EngineError:
        if engine != "sglang":
            raise  # vLLM's CPU build starts with LoRA: a failure here is a real one
        pytest.skip(f"{engine} on CPU cannot start with --enable-lora: {_start_error(log_dir)}")


def _gen_each(backend, prompts):
    """One request at a time. vLLM 0.32's CPU worker, given two LoRA requests in one batch on this
    loaded 2-core machine, did not finish the step within its 300 s execute_model timeout and the
    engine died ("RPC call to execute_model timed out"); one at a time they take seconds. Whether
    that was load or a hang in the batched CPU LoRA path was not separated."""
    return [checks.gen(backend, ids, max_new_tokens=16) for ids in prompts]


def test_adapter_and_merged_sync_serve_the_same_model(backend, model_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from training.config import LoraConfig
    from training.lora import apply_lora, merged_state_dict, save_adapter
    from training.weight_sync import sync_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    prompts = [checks.chat_ids(backend.tokenizer, q) for q in ("What is the capital of France?", "Name a fruit.")]
    base = _gen_each(backend, prompts)

    # A trained-looking adapter, the same every run. peft draws A at random (Kaiming) from the global
    # generator and sets B to zero, so both are seeded here. An unseeded A made this test flaky: with
    # B ~ 0.05·N(0, 1), some draws left both greedy answers unchanged (CI, 2026-11-27). With seed 0
    # and 0.2, the hf model answers differently from the base model by the second token.
    with torch.random.fork_rng():  # seeded here without touching the other tests' generator
        torch.manual_seed(0)
        policy = apply_lora(model, LoraConfig(r=RANK, alpha=2 * RANK, target_modules=TARGETS))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
        reference = [
            policy.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)[0, len(ids) :].tolist()
            for ids in prompts
        ]
    kw = dict(scratch=tmp_path / "sync", tokenizer=backend.tokenizer, model_config=model.config)
    try:
        backend.update_lora_adapter(save_adapter(policy, tmp_path / "adapter-v1"), 1)
        adapted = _gen_each(backend, prompts)
        assert backend.lora_name == "policy-v1" and {c.weight_version for c in adapted} == {"1"}
        sync_weights(backend, merged_state_dict(policy), 2, **kw)  # merged: full weights, base name again
        merged = _gen_each(backend, prompts)
        assert backend.lora_name is None and {c.weight_version for c in merged} == {"2"}
    finally:
        sync_weights(backend, original, 3, **kw)  # leave the engine serving the base model
    assert [c.token_ids for c in adapted] != [c.token_ids for c in base]
    # Same model two ways, and the model hf+peft runs; near-ties may flip late tokens (see
    # checks.py), never the start.
    for a, m, ref in zip(adapted, merged, reference, strict=True):
        assert a.token_ids[: checks.PARITY_PREFIX] == m.token_ids[: checks.PARITY_PREFIX], (a.text, m.text)
        assert a.token_ids[: checks.PARITY_PREFIX] == ref[: checks.PARITY_PREFIX], (
            a.text,
            backend.tokenizer.decode(ref),
        )
    restored = _gen_each(backend, prompts)
    assert [c.token_ids for c in restored] == [c.token_ids for c in base]
