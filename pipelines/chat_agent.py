"""The tool_call agent through an OpenAI-compatible chat API (``/v1/chat/completions`` with
``tools=``): a second way to evaluate it, on a server that applies the chat template itself.

The token path (:class:`~pipelines.search_agent.SearchAgent` with the ``tool_call`` dialect) keeps
the generated ids and appends the template's tool message; here the server receives the whole
conversation as messages every turn and renders it with its own template. The turn is read by the
same dialect functions: the message's ``tool_calls`` are written back as Hermes ``<tool_call>``
blocks (a server without a tool parser leaves them in ``content``, where the parser finds them
too), so a malformed call, an unknown tool, a missing query or several calls get the same
corrective, the same search runs, and the answer is read from the final message the same way.

Where the two paths can differ (docs/tool_calling.md): the server re-renders past turns (a
template that rewrites them, e.g. Qwen3's dropping earlier ``<think>`` blocks, shows the model a
different context than it generated; training on such turns would not match), its tool parser
may accept or reject calls the dialect's parser reads otherwise, a corrective after a turn
without a call goes as a user message (a tool message needs a call to answer), and it returns
no token ids (the trajectory's segments carry text only: nothing to train on).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from harness.backends.base import SamplingParams
from harness.errors import error_kind
from harness.retrieval.base import Retriever
from harness.types import Example, SearchRecord, Segment, Trajectory
from pipelines.dialects import resolve_dialect
from pipelines.method import Method
from pipelines.search_agent import AgentConfig, cap_doc

logger = logging.getLogger(__name__)


def turn_text(message: dict[str, Any]) -> str:
    """An assistant message as the dialect's parser reads a generated turn: its content, then each
    structured tool call as a Hermes block (arguments as the server sent them, so arguments that
    are not JSON stay malformed)."""
    text = message.get("content") or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments", "{}")
        args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        text += f'\n<tool_call>\n{{"name": {json.dumps(fn.get("name"))}, "arguments": {args}}}\n</tool_call>'
    return text


class ChatToolAgent(Method):
    """The ``tool_call`` agent over a chat-completions server (see the module docstring).

    ``backend``: an :class:`~harness.backends.openai.OpenAIBackend` (its URL, key, retries and
    served model name; its tokenizer caps documents as the token path does); ``config``: the same
    :class:`~pipelines.search_agent.AgentConfig` (``max_turns``, ``max_new_tokens``, ``topk``,
    ``max_doc_tokens``, ``template``, sampling)."""

    pauses_between_steps = False

    def __init__(self, backend: Any, retriever: Retriever | None, config: AgentConfig | None = None) -> None:
        self.config = config or AgentConfig()
        self.dialect = resolve_dialect("tool_call", "exact", self.config.template)
        self.backend = backend
        self.retriever = retriever
        self.method = "tool_call_chat"
        self.tokenizer = getattr(backend, "tokenizer", None)

    @property
    def max_concurrency(self) -> int:
        return self.config.max_concurrency

    def _payload(self, messages: list[dict[str, Any]], sampling: SamplingParams | None) -> dict[str, Any]:
        c = self.config
        return {
            "model": getattr(self.backend, "served_model", None) or "default",
            "messages": messages,
            "tools": self.dialect.tools(self.dialect) if self.dialect.tools else [],
            "max_tokens": sampling.max_new_tokens if sampling else c.max_new_tokens,
            "temperature": sampling.temperature if sampling else c.temperature,
            "top_p": sampling.top_p if sampling else c.top_p,
        }

    async def arun(
        self, example: Example, sample_index: int = 0, sampling: SamplingParams | None = None, policy_version: int = 0
    ) -> Trajectory:
        """One item, start to finish; never raises (an error is recorded on the trajectory)."""
        d = self.dialect
        traj = Trajectory.of(
            example,
            self.method,
            sample_index=sample_index,
            policy_version=policy_version,
            metadata={"dialect": d.name, "chat_api": True},
        )
        messages: list[dict[str, Any]] = list(d.messages(example.question) or [])
        traj.segments.append(Segment("prompt", [], json.dumps(messages, ensure_ascii=False)))
        start = time.perf_counter()
        try:
            await self._loop(messages, traj, sampling)
        except Exception as e:  # one item's fault stays on that item
            logger.warning("item %s failed: %s: %s", example.id, type(e).__name__, e)
            traj.finish_reason, traj.error, traj.error_kind = "error", f"{type(e).__name__}: {e}", error_kind(e)
        traj.wall_time_s = time.perf_counter() - start
        traj.response_text = "".join(s.text for s in traj.segments[1:])
        answered = traj.metadata.pop("answer", None)
        traj.prediction = answered if answered is not None else (d.extract_answer(traj.response_text) or "")
        return traj

    async def _loop(self, messages: list[dict[str, Any]], traj: Trajectory, sampling: SamplingParams | None) -> None:
        c, d = self.config, self.dialect
        searches = 0
        while True:
            if searches >= c.max_turns:  # as the token path: no turn after the last observation
                traj.finish_reason = "max_turns"
                return
            t0 = time.perf_counter()
            data = await self.backend.post_json("/v1/chat/completions", self._payload(messages, sampling))
            traj.generation_time_s += time.perf_counter() - t0
            choice = data["choices"][0]
            message = choice["message"]
            text = turn_text(message)
            traj.n_turns += 1
            traj.segments.append(Segment("model", [], text))
            length = choice.get("finish_reason") == "length"
            action = d.parse_action(text, eos=not length, length=length)
            messages.append({k: v for k, v in message.items() if k in ("role", "content", "tool_calls")})
            if action.kind == "answer":
                if action.answer is not None:
                    traj.metadata["answer"] = action.answer
                traj.finish_reason = "answer"
                return
            if length:
                traj.finish_reason = "max_tokens"
                return
            if action.kind == "search":
                content = await self._search(action.queries, searches, traj)
            else:
                content = d.corrective_text(action.reason or "no tool call or answer found") or ""
            searches += 1
            calls = message.get("tool_calls") or []
            if calls:  # every call gets its answer (the API refuses a call left unanswered)
                for call in calls:
                    messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
            else:  # a call written in the text (no tool parser) or none: no id to answer
                messages.append({"role": "tool" if action.kind == "search" else "user", "content": content})
            traj.segments.append(Segment("observation", [], content))

    async def _search(self, queries: tuple[str, ...], turn: int, traj: Trajectory) -> str:
        if self.retriever is None:
            raise RuntimeError("the agent asked for a search but no retriever is configured")
        t0 = time.perf_counter()
        results = await asyncio.to_thread(self.retriever.search, list(queries), self.config.topk)
        latency = time.perf_counter() - t0
        traj.retrieval_time_s += latency
        capped = [list(docs) for docs in results]
        if self.config.max_doc_tokens is not None and self.tokenizer is not None:  # as the token path caps them
            capped = [[cap_doc(self.tokenizer, doc, self.config.max_doc_tokens) for doc in docs] for docs in capped]
        for q, docs in zip(queries, capped, strict=True):
            traj.searches.append(SearchRecord.from_docs(turn, q, docs, latency / len(queries)))
        return self.dialect.observation_text(queries, capped)
