"""Real SGLang (through the ``sglang`` backend) and real vLLM (through ``openai``), CPU, float32:
the agent, stop semantics, logprobs, ``n``, greedy parity with ``hf``, and, for SGLang, RL weight
sync through ``/update_weights_from_disk``. Each engine is started once for all its tests."""

from __future__ import annotations

import pytest

from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def backend(request, model_dir, tmp_path_factory):
    """One engine at a time: its server lives while its tests run, then stops before the next."""
    with checks.serve(request.param, model_dir, tmp_path_factory.mktemp(f"{request.param}-logs")) as server:
        if request.param == "sglang":
            from harness.backends.sglang import SGLangBackend

            b = SGLangBackend(server.url)
            assert b.model_path == model_dir  # the tokenizer came from what the server reports on /model_info
        else:
            from harness.backends.openai import OpenAIBackend

            b = OpenAIBackend(server.url, model=model_dir)
        yield b
        b.close()


def test_agent_runs_on_demo(backend):
    checks.check_agent_on_demo(backend)


def test_length_finish(backend):
    checks.check_length_finish(backend)


def test_eos_finish(backend):
    checks.check_eos_finish(backend)


def test_stop_string_kept(backend, hf_backend):
    checks.check_stop_string_kept(backend, hf_backend)


def test_logprobs(backend):
    checks.check_logprobs(backend)


def test_n_samples_in_one_request(backend):
    checks.check_n_samples(backend)


def test_greedy_parity_with_hf(backend, hf_backend):
    checks.check_greedy_parity(backend, hf_backend)


def test_weight_sync_changes_outputs_and_version(backend, model_dir, tmp_path):
    """training.weight_sync pushes a changed checkpoint: outputs and weight version change;
    pushing the original weights back restores the original outputs exactly."""
    if backend.name != "sglang":
        pytest.skip("weight sync goes into SGLang only; vLLM serves evaluation")
    import torch
    from transformers import AutoModelForCausalLM

    from training.weight_sync import sync_weights

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    ids = checks.chat_ids(backend.tokenizer, "What is the capital of France?")
    before = checks.gen(backend, ids, max_new_tokens=16)

    g = torch.Generator().manual_seed(0)
    changed = {k: v + 0.05 * torch.randn(v.shape, generator=g) if v.ndim == 2 else v for k, v in original.items()}
    kw = dict(scratch=tmp_path / "sync", tokenizer=backend.tokenizer, model_config=model.config)
    try:
        sync_weights(backend, changed, 1, **kw)
        after = checks.gen(backend, ids, max_new_tokens=16)
        assert after.weight_version == "1" and backend.weight_version == "1"
        assert after.token_ids != before.token_ids
        assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["weights-v1"]
    finally:
        sync_weights(backend, original, 2, **kw)  # leave the server as the other tests expect it
    restored = checks.gen(backend, ids, max_new_tokens=16)
    assert restored.weight_version == "2"
    assert restored.token_ids == before.token_ids
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["weights-v2"]  # older copy removed
