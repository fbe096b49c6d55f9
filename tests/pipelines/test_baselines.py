"""FlashRAG's baseline pipelines on our backends and retrievers (scripted backend)."""

from __future__ import annotations

import os

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.types import Example
from pipelines.methods import METHODS, build_method, method_kind

EXAMPLES = [
    Example("q1", "Where was the inventor of the glass harp-clock born?", ("Eddavik",)),
    Example("q2", "Who built the first steam loom of Varnes?", ("Tomas Brekke",)),
]


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A model directory FlashRAG's PromptTemplate can read: a config plus the byte tokenizer."""
    from transformers import LlamaConfig

    from harness.tokenization import byte_tokenizer

    d = tmp_path_factory.mktemp("tiny-instruct")
    tok = byte_tokenizer()
    LlamaConfig(vocab_size=len(tok), hidden_size=16, num_hidden_layers=1, num_attention_heads=2).save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


def test_registry_lists_agents_and_baselines():
    assert set(METHODS.names()) == {
        "research",
        "search_r1",
        "r1_searcher",
        "rag_r1",
        "prorag",
        "naive",
        "standard",
        "iter_retgen",
        "ircot",
        "flare",
        "self_ask",
    }
    assert method_kind("ircot") == "baseline" and method_kind("rag_r1") == "agent"


@pytest.mark.parametrize("name", ["naive", "standard", "iter_retgen", "ircot", "flare", "self_ask"])
def test_baseline_runs_and_records(name, tiny_model_dir, toy_retriever):
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    backend = ScriptedBackend(
        [
            {"match": "glass harp-clock", "turns": ["So the final answer is: Eddavik"]},
            {"match": "steam loom", "turns": ["So the final answer is: Tomas Brekke"]},
        ],
        model_path=tiny_model_dir,
    )
    method = build_method(name, backend, toy_retriever, {"chunk_size": 1, "max_new_tokens": 64})
    seen = []
    trajs = method.run_examples(EXAMPLES, on_done=lambda t: seen.append(t.example_id))
    assert seen == ["q1", "q2"]  # streamed chunk by chunk
    assert all(t.error is None for t in trajs), [t.error for t in trajs]
    assert all(t.method == name for t in trajs)
    assert "Eddavik" in trajs[0].prediction
    assert trajs[0].metadata["token_exact"] is False
    if name == "standard":
        assert trajs[0].searches and trajs[0].searches[0].doc_ids[0] in {"d1", "d2"}
        assert any(s.role == "prompt" and "glass harp-clock" in s.text for s in trajs[0].segments)
    if name == "naive":
        assert trajs[0].searches == []
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def test_a_failing_chunk_is_recorded_and_the_next_runs(tiny_model_dir, toy_retriever):
    class Flaky(ScriptedBackend):
        async def agenerate(self, input_ids, params):
            if "glass" in self.tokenizer.decode(input_ids):
                raise TimeoutError("server timed out")
            return await super().agenerate(input_ids, params)

    method = build_method("naive", Flaky(default="x", model_path=tiny_model_dir), None, {"chunk_size": 1})
    trajs = method.run_examples(EXAMPLES)
    assert trajs[0].finish_reason == "error" and "TimeoutError" in trajs[0].error
    assert trajs[1].error is None and trajs[1].prediction == "x"


def test_baselines_need_a_model_dir_and_a_retriever(toy_retriever):
    with pytest.raises(ValueError, match="no local model directory"):
        build_method("standard", ScriptedBackend(), toy_retriever)
    with pytest.raises(ValueError, match="needs a retriever"):
        build_method("standard", ScriptedBackend(model_path="x"), None)
