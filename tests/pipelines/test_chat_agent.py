"""The tool_call agent through an OpenAI-compatible chat API (pipelines/chat_agent.py) against a
loopback replay server: the same searches and predictions as the token path replaying the same
turns, and the request carries the tool schema and answers each call with its id."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading

import pytest

from harness.backends.openai import OpenAIBackend
from harness.backends.scripted import ScriptedBackend
from harness.models import load_tokenizer
from harness.retrieval.memory import InMemoryRetriever
from harness.types import Doc, Example
from pipelines.chat_agent import ChatToolAgent, turn_text
from pipelines.search_agent import AgentConfig, SearchAgent

DOCS = [
    Doc("d1", "Eddavik", "Mira Solberg founded Eddavik, a fishing town on the river Lunne."),
    Doc("d2", "Mira Solberg", "Mira Solberg was born in 1840 and invented the glass harp-clock."),
]


def call(name, arguments, i=0):
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": args}}


# question → the assistant messages the replay server gives, turn by turn (as a server with a
# Hermes tool parser returns them: calls in tool_calls, the rest in content).
SCRIPT = {
    "who founded Eddavik": [
        {"content": "I will look it up.", "tool_calls": [call("search", {"query": "Eddavik founder"})]},
        {"content": "It says Mira Solberg.\nAnswer: Mira Solberg", "tool_calls": []},
    ],
    "when was the founder of Eddavik born": [
        {"content": "", "tool_calls": [call("search", '{"query": "Eddavik founder"')]},  # arguments not JSON
        {"content": "", "tool_calls": [call("lookup", {"query": "x"})]},  # unknown tool
        {"content": "", "tool_calls": [call("search", {"query": "a"}), call("search", {"query": "b"}, 1)]},
        {"content": "", "tool_calls": [call("search", {"query": "Mira Solberg born"})]},
        {"content": "Answer: 1840", "tool_calls": []},
    ],
    "what did Mira Solberg invent": [  # a server without a tool parser: the call stays in the text
        {"content": '<tool_call>\n{"name": "search", "arguments": {"query": "Mira Solberg"}}\n</tool_call>'},
        {"content": "Answer: the glass harp-clock"},
    ],
    "say something": [{"content": "No search needed. Answer: hello", "tool_calls": []}],
}


class Replay(http.server.BaseHTTPRequestHandler):
    requests: list[dict] = []

    def log_message(self, *args):  # quiet
        pass

    def _send(self, body):
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self):
        self._send({"data": [{"id": "replay"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Replay.requests.append(body)
        question = next(m["content"] for m in body["messages"] if m["role"] == "user")
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        message = {"role": "assistant", **SCRIPT[question][turn]}
        self._send({"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})


@pytest.fixture(scope="module")
def server():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Replay)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("smollm2-135m-instruct")


CFG = AgentConfig(max_turns=5, max_doc_tokens=16, chat_template="qwen2.5.jinja")
EXAMPLES = [Example(f"e{i}", q, []) for i, q in enumerate(SCRIPT)]


def test_the_chat_api_path_predicts_what_the_token_path_predicts(server, tok):
    backend = OpenAIBackend(server, tokenizer=tok, max_context=8192)
    chat = ChatToolAgent(backend, InMemoryRetriever(DOCS), CFG).run_examples(EXAMPLES)
    script = [{"match": q, "turns": [turn_text(m) for m in turns]} for q, turns in SCRIPT.items()]
    token_agent = SearchAgent(ScriptedBackend(script, tokenizer=tok), InMemoryRetriever(DOCS), "tool_call", CFG)
    tokens = token_agent.run_examples(EXAMPLES)
    for a, b in zip(chat, tokens, strict=True):
        assert a.error is None and b.error is None
        assert (a.prediction, a.finish_reason) == (b.prediction, b.finish_reason), a.question
        assert [(s.query, s.doc_ids) for s in a.searches] == [(s.query, s.doc_ids) for s in b.searches]
        # the same tool contents: the token path's observations are them inside the template's wrapping
        obs_a = [s.text for s in a.segments if s.role == "observation"]
        obs_b = [s.text for s in b.segments if s.role == "observation"]
        assert len(obs_a) == len(obs_b) and all(x in y for x, y in zip(obs_a, obs_b, strict=True))
    assert [t.prediction for t in chat] == ["Mira Solberg", "1840", "the glass harp-clock", "hello"]
    assert "several tool calls" in [s.text for s in chat[1].segments if s.role == "observation"][2]


def test_requests_carry_the_tools_and_answer_each_call_by_id(server, tok):
    Replay.requests.clear()
    backend = OpenAIBackend(server, tokenizer=tok, max_context=8192)
    asyncio.run(ChatToolAgent(backend, InMemoryRetriever(DOCS), CFG).arun(EXAMPLES[1]))
    first, last = Replay.requests[0], Replay.requests[-1]
    assert [t["function"]["name"] for t in first["tools"]] == ["search"] and first["model"] == "replay"
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    tool_msgs = [m for m in last["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_msgs] == ["call_0", "call_0", "call_0", "call_1", "call_0"]
    assert tool_msgs[0]["content"].startswith("Error: the tool call is not valid JSON")


def test_the_chat_agent_is_evaluated_into_a_run_directory(server, tok, tmp_path):
    from benchmarks.evaluate import evaluate

    backend = OpenAIBackend(server, tokenizer=tok, max_context=8192)
    agent = ChatToolAgent(backend, InMemoryRetriever(DOCS), CFG)
    examples = [Example("e0", "who founded Eddavik", ["Mira Solberg"]), Example("e3", "say something", ["bye"])]
    results = evaluate(agent, examples, tmp_path / "run", metrics=["em"])
    assert results.metrics["em"] == 0.5
    row = json.loads((tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()[0])
    assert row["method"] == "tool_call_chat" and row["metadata"]["chat_api"] is True


def test_harness_eval_runs_the_chat_api_path_as_a_method(server, tok, tmp_path):
    """``harness eval --method tool_call_chat`` (the registry's builder) evaluates the same agent
    into a run directory; over a backend with no chat server it is refused by name."""
    from benchmarks.build import build_eval, simple_evaluate
    from harness.config import ConfigError
    from harness.eval_config import DatasetConfig, EvalConfig

    examples = [Example("e0", "who founded Eddavik", ["Mira Solberg"]), Example("e1", EXAMPLES[1].question, ["1840"])]
    agent = {"max_turns": 5, "max_doc_tokens": 16, "chat_template": "qwen2.5.jinja"}
    from harness.eval_config import BackendConfig

    chat = BackendConfig(kind="openai", url=server)
    cfg = EvalConfig(
        method="tool_call_chat", dataset=DatasetConfig(name="demo"), agent=agent, backend=chat, out=str(tmp_path)
    )
    backend = OpenAIBackend(server, tokenizer=tok, max_context=8192)
    results = simple_evaluate(cfg, backend=backend, retriever=InMemoryRetriever(DOCS), examples=examples)
    assert results.metrics["em"] == 1.0
    refused = "tool_call_chat talks to an OpenAI-compatible chat server: backend.kind must be one of openai, sglang"
    with pytest.raises(ConfigError, match=refused + r".*not 'ScriptedBackend'"):  # a backend object given as is
        build_eval(
            cfg, backend=ScriptedBackend([], tokenizer=tok), retriever=InMemoryRetriever(DOCS), examples=examples
        )
    with pytest.raises(ConfigError, match=refused + r".*not 'hf'"):  # by the config, before anything is built
        build_eval(EvalConfig(method="tool_call_chat", dataset=DatasetConfig(name="demo"), out=str(tmp_path / "x")))
    assert not (tmp_path / "x").exists()
