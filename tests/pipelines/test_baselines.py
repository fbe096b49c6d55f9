"""FlashRAG's baseline pipelines on our backends and retrievers (scripted backend)."""

from __future__ import annotations

import os

import pytest

from harness.backends.scripted import ScriptedBackend
from harness.types import Example
from pipelines.dialects import SYSTEMS
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
    assert set(METHODS.names()) == set(SYSTEMS.names()) | {  # an agent per seed system, and the baselines
        "tool_call_chat",  # and the tool_call agent through a chat server
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
    queries: list[str] = []

    class Counting:  # every query that reaches the real retriever
        index_id = toy_retriever.index_id

        def search(self, qs, k):
            queries.extend(qs)
            return toy_retriever.search(qs, k)

    method = build_method(name, backend, Counting(), {"max_new_tokens": 64})
    seen = []
    trajs = method.run_examples(EXAMPLES, on_done=lambda t: seen.append(t.example_id))
    assert sorted(seen) == ["q1", "q2"]  # streamed item by item
    assert all(t.error is None for t in trajs), [t.error for t in trajs]
    assert all(t.method == name for t in trajs)
    assert "Eddavik" in trajs[0].prediction
    assert trajs[0].metadata["token_exact"] is False
    # Every search a baseline made is on its item's trajectory: the queries, documents and scores.
    recorded = [s.query for t in trajs for s in t.searches]
    assert sorted(recorded) == sorted(queries)
    if name not in ("naive", "flare"):  # FLARE searches only when unsure (scripted logprobs are 0: sure)
        assert all(t.searches and all(s.docs and s.latency_s >= 0 for s in t.searches) for t in trajs)
        assert [s.turn for s in trajs[0].searches] == sorted(s.turn for s in trajs[0].searches)
    if name == "standard":
        assert trajs[0].searches[0].query == EXAMPLES[0].question
        assert trajs[0].searches[0].doc_ids[0] in {"d1", "d2"}
        assert any(s.role == "prompt" and "glass harp-clock" in s.text for s in trajs[0].segments)
    if name == "iter_retgen":  # one retrieval per iteration
        assert len({s.turn for s in trajs[0].searches}) == 3
    if name == "naive":
        assert trajs[0].searches == []
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before


def test_a_failing_item_is_recorded_and_the_next_runs(tiny_model_dir, toy_retriever):
    class Flaky(ScriptedBackend):
        async def agenerate(self, input_ids, params):
            if "glass" in self.tokenizer.decode(input_ids):
                raise TimeoutError("server timed out")
            return await super().agenerate(input_ids, params)

    method = build_method("naive", Flaky(default="x", model_path=tiny_model_dir), None)
    trajs = method.run_examples(EXAMPLES)
    assert trajs[0].finish_reason == "error" and "TimeoutError" in trajs[0].error
    assert trajs[0].error_kind == "timeout"
    assert trajs[1].error is None and trajs[1].prediction == "x"


def test_items_run_concurrently_up_to_the_methods_concurrency(tiny_model_dir):
    import asyncio

    state = {"now": 0, "most": 0}

    class Slow(ScriptedBackend):
        async def agenerate(self, input_ids, params):
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            await asyncio.sleep(0.2)
            state["now"] -= 1
            return await super().agenerate(input_ids, params)

    many = [Example(f"q{i}", f"question {i}?", ("a",)) for i in range(6)]
    method = build_method("naive", Slow(default="a", model_path=tiny_model_dir), None, {"max_concurrency": 3})
    trajs = method.run_examples(many)
    assert [t.example_id for t in trajs] == [e.id for e in many] and all(t.error is None for t in trajs)
    assert state["most"] == 3  # three items in flight at once, never more


def test_baselines_need_a_model_dir_and_a_retriever(toy_retriever):
    with pytest.raises(ValueError, match="no local model directory"):
        build_method("standard", ScriptedBackend(), toy_retriever)
    with pytest.raises(ValueError, match="needs a retriever"):
        build_method("standard", ScriptedBackend(model_path="x"), None)
