"""RL weight sync into vLLM (``openai`` backend, :mod:`harness.backends.vllm_sync`) against a
stand-in that answers as vLLM 0.32 did when recorded (tests/helpers/vllm_standin.py). The real
server is exercised by tests/engines/test_served_model.py and tests/engines/test_lora_sync.py."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaConfig

from harness.backends.base import BackendError, SamplingParams, WeightUpdate
from harness.backends.openai import OpenAIBackend
from harness.tokenization import byte_tokenizer
from tests.harness.conftest import ServerThread
from tests.helpers.vllm_standin import VLLMStandin

TOK = byte_tokenizer()


def serve(**kw):
    standin = VLLMStandin(**kw)
    return standin, ServerThread(standin.app())


def tiny_update(version, scratch, tied=True):
    cfg = LlamaConfig(vocab_size=8, hidden_size=4, intermediate_size=8, num_hidden_layers=1, num_attention_heads=1)
    cfg.tie_word_embeddings = tied
    emb = torch.full((8, 4), float(version))
    weights = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "model.norm.weight": torch.ones(4)}
    return WeightUpdate(weights, version, cfg, None, scratch)


def names(standin):
    return [c[0] for c in standin.calls if c[0] != "/v1/completions"]


def complete(b):
    return asyncio.run(b.agenerate([1, 2], SamplingParams(max_new_tokens=1)))


def test_full_weights_reload_protocol_and_version(tmp_path):
    standin, server = serve()
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        assert complete(b).weight_version is None  # nothing pushed yet: no version claimed
        b.update_weights(tiny_update(1, tmp_path))
        b.update_weights(tiny_update(2, tmp_path))
        c = complete(b)
    one = ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
    assert names(standin) == one + one
    pause = next(body for name, body in standin.calls if name == "/pause")
    assert pause == {"mode": "wait"}  # in-flight requests finish; nothing is aborted
    rpc = [body for name, body in standin.calls if name == "/collective_rpc"]
    assert rpc[1] == {"method": "reload_weights", "kwargs": {"weights_path": str((tmp_path / "weights-v2").resolve())}}
    assert standin.version == "2" and not standin.paused
    assert c.weight_version == "2" and standin.calls[-1][1]["model"] == "base-model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights-v2"]  # the older copy is gone


def test_an_update_that_pauses_requests_in_flight_keeps_and_preempts_them(tmp_path):
    """``in_flight=pause``: ``/pause?mode=keep`` (requests stay where they are) and the cache reset
    preempts them (``reset_running_requests=true``) so they recompute their KV under the new
    weights after ``/resume``; ``drain`` is ``mode=wait`` and a plain reset."""
    standin, server = serve()
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        u = tiny_update(1, tmp_path)
        b.update_weights(WeightUpdate(u.weights, 1, u.model_config, None, tmp_path, in_flight="pause"))
    assert names(standin) == ["/pause", "/collective_rpc", "/reset_prefix_cache", "/update_weight_version", "/resume"]
    calls = dict(standin.calls)
    assert calls["/pause"] == {"mode": "keep"} and calls["/reset_prefix_cache"] == {"reset_running_requests": True}
    assert b.weight_version == "1" and not standin.paused


def test_tied_head_is_written_for_vllm(tmp_path):
    """vLLM's in-place reload keeps the old head when the file has none: the head is written."""
    standin, server = serve()
    with server:
        OpenAIBackend(server.url, tokenizer=TOK, retries=0).update_weights(tiny_update(3, tmp_path))
    saved = load_file(str(tmp_path / "weights-v3" / "model.safetensors"))
    assert torch.equal(saved["lm_head.weight"], saved["model.embed_tokens.weight"])
    assert json.loads((tmp_path / "weights-v3" / "config.json").read_text())["tie_word_embeddings"] is True


def test_busy_prefix_cache_is_retried(tmp_path):
    standin, server = serve(busy_resets=2)
    with server:
        OpenAIBackend(server.url, tokenizer=TOK, retries=0).update_weights(tiny_update(1, tmp_path))
    assert names(standin).count("/reset_prefix_cache") == 3


def test_server_without_dev_mode_says_how_to_start_it(tmp_path):
    standin, server = serve(dev_mode=False)
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        with pytest.raises(BackendError, match="VLLM_SERVER_DEV_MODE=1"):
            b.update_weights(tiny_update(1, tmp_path))
    assert b.weight_version is None


def test_failed_reload_resumes_the_server_and_keeps_the_version(tmp_path):
    standin, server = serve()
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        with pytest.raises(BackendError, match="collective_rpc failed \\(500\\)"):
            b.update_weights(WeightUpdate(str(tmp_path / "missing"), 1))
    assert names(standin) == ["/pause", "/collective_rpc", "/resume"]
    assert not standin.paused and b.weight_version is None


def test_lora_adapter_load_switch_and_unload(tmp_path):
    for v in (1, 2):
        (tmp_path / f"adapter-v{v}").mkdir()
        (tmp_path / f"adapter-v{v}" / "adapter_config.json").write_text("{}")
    standin, server = serve()
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        b.update_lora_adapter(tmp_path / "adapter-v1", 1)
        first = complete(b)
        b.update_lora_adapter(tmp_path / "adapter-v2", 2)
        second = complete(b)
        loaded_before_merge = dict(standin.adapters)
        b.update_weights(tiny_update(3, tmp_path / "sync"))  # merged full weights: back to the base name
        third = complete(b)
    models = [body["model"] for name, body in standin.calls if name == "/v1/completions"]
    assert models == ["policy-v1", "policy-v2", "base-model"]
    assert (first.weight_version, second.weight_version, third.weight_version) == ("1", "2", "3")
    assert loaded_before_merge == {"policy-v2": str((tmp_path / "adapter-v2").resolve())}  # v1 unloaded
    assert standin.adapters == {} and b.lora_name is None
    load = [body for name, body in standin.calls if name == "/v1/load_lora_adapter"]
    assert load[0] == {"lora_name": "policy-v1", "lora_path": str((tmp_path / "adapter-v1").resolve())}


def test_lora_adapter_errors_name_the_cause(tmp_path):
    standin, server = serve()
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        with pytest.raises(BackendError, match="No adapter found"):
            b.update_lora_adapter(tmp_path / "nothing-here", 1)
    assert b.lora_name is None
    standin, server = serve(lora=False)
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "adapter_config.json").write_text("{}")
    with server:
        b = OpenAIBackend(server.url, tokenizer=TOK, retries=0)
        with pytest.raises(BackendError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=1"):
            b.update_lora_adapter(tmp_path / "a", 1)
