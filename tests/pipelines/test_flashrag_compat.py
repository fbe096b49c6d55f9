"""FlashRAG's generator and retriever interfaces over harness components."""

from __future__ import annotations

import asyncio
import threading

from harness.backends.base import SamplingParams
from harness.backends.scripted import ScriptedBackend
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc
from pipelines.flashrag_compat import FlashRAGChatPrompt, FlashRAGGenerator, FlashRAGRetriever


def test_generate_keeps_the_matched_stop_and_maps_option_names():
    b = ScriptedBackend([{"match": "Q1", "turns": ["<search>a</search> more"]}, {"match": "Q2", "turns": ["xyz"]}])
    g = FlashRAGGenerator(b)
    out = g.generate(["Q1", "Q2"], stop=["</search>"], max_tokens=50)
    assert out == ["<search>a</search>", "xyz"]
    assert g.generate("Q1", stop="</search>") == ["<search>a</search>"]  # a single prompt and stop
    assert g.generate(["Q2"], max_new_tokens=2) == ["xy"]
    assert g.generate(["Q2"], max_length=1, do_sample=False) == ["x"]
    p = g.sampling({"temperature": 0.7, "top_p": 0.9, "logprobs": True})
    assert (p.temperature, p.top_p, p.logprobs, p.max_new_tokens) == (0.7, 0.9, True, 64)


def test_generate_return_scores_gives_probabilities():
    g = FlashRAGGenerator(ScriptedBackend([{"match": "Q", "turns": ["abc"]}]))
    texts, scores = g.generate(["Q"], return_scores=True, stop=["c"])
    assert texts == ["abc"] and scores == [[1.0, 1.0, 1.0]]  # logprob 0.0 -> probability 1


def test_generate_works_inside_a_running_event_loop():
    g = FlashRAGGenerator(ScriptedBackend([{"match": "Q", "turns": ["ok"]}]))

    async def main():  # FlashRAG code called from async code: run_sync uses a helper thread
        return g.generate(["Q"])

    assert asyncio.run(main()) == ["ok"]


def test_method_defaults_never_touch_the_shared_backend_and_rollout_sampling_is_per_thread():
    b = ScriptedBackend([{"match": "Q", "turns": ["abcdef"]}])
    short, long = FlashRAGGenerator(b, SamplingParams(max_new_tokens=2)), FlashRAGGenerator(b)
    assert short.generate(["Q"]) == ["ab"] and long.generate(["Q"]) == ["abcdef"]
    assert not hasattr(b, "default_params")
    seen = {}

    def worker():
        with short.using(SamplingParams(temperature=1.0, seed=7, max_new_tokens=999)):
            seen["inside"] = short.sampling({})
        seen["after"] = short.sampling({})

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert (seen["inside"].temperature, seen["inside"].seed, seen["inside"].max_new_tokens) == (1.0, 7, 2)
    assert seen["after"] == short.params and short.sampling({}) == short.params


def test_worker_threads_send_requests_to_the_methods_loop():
    b = ScriptedBackend([{"match": "Q", "turns": ["ok"]}])
    g = FlashRAGGenerator(b)
    loops = set()
    original = b.agenerate

    async def spy(ids, params):
        loops.add(id(asyncio.get_running_loop()))
        return await original(ids, params)

    b.agenerate = spy

    async def main():
        g.loop = asyncio.get_running_loop()
        outs = await asyncio.gather(*(asyncio.to_thread(g.generate, ["Q"]) for _ in range(4)))
        return outs, id(g.loop)

    outs, main_loop = asyncio.run(main())
    assert outs == [["ok"]] * 4 and loops == {main_loop}


def test_retriever_records_each_threads_calls_with_docs_and_turns():
    docs = [Doc("1", "Paris", "capital of France"), Doc("2", "Berlin", "capital of Germany")]
    r = FlashRAGRetriever(InMemoryRetriever(docs), topk=1)
    r.search("France")  # outside a recording: nothing kept
    with r.recording() as calls:
        first = r.batch_search(["France", "Germany"])
        r.search("Germany", num=2, return_score=True)
    assert [d[0]["id"] for d in first] == ["1", "2"]
    assert [(c.turn, c.query, c.doc_ids) for c in calls] == [
        (0, "France", ["1"]),
        (0, "Germany", ["2"]),
        (1, "Germany", ["2", "1"]),
    ]
    assert calls[0].docs[0].title == "Paris" and all(c.latency_s >= 0 for c in calls)


def test_chat_prompt_fills_the_question_into_the_chat_template():
    class Tok:
        def apply_chat_template(self, messages, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"

    prompt = FlashRAGChatPrompt(Tok(), "Answer: {question}")
    assert prompt.get_string("Who?", retrieval_result=[]) == "<user>Answer: Who?<assistant>"
