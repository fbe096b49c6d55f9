"""Real SGLang (CPU, float32) through the ``sglang`` backend: the agent, stop semantics, logprobs,
``n``, greedy parity with ``hf``, and RL weight sync through ``/update_weights_from_disk``."""

from __future__ import annotations

import pytest

from tests.engines import checks

pytestmark = [pytest.mark.engines, pytest.mark.slow]


@pytest.fixture(scope="module")
def backend(sglang_server, model_dir):
    from harness.backends.sglang import SGLangBackend

    b = SGLangBackend(sglang_server.url)
    assert b.model_path == model_dir  # the tokenizer came from what the server reports on /model_info
    yield b
    b.close()


def test_agent_runs_on_demo(backend):
    trajs = checks.check_agent_on_demo(backend)
    assert all(t.metadata.get("backend", "sglang") == "sglang" for t in trajs)


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
