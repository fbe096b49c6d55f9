"""The method registry: every name ``harness eval --method`` accepts.

Agent methods are the one search agent with a dialect; baselines are FlashRAG's pipelines.
Each builder takes (backend, retriever, options dict) and returns an object with
``run_examples(examples, on_done=..., skip=...) -> list[Trajectory]``.
"""

from __future__ import annotations

from typing import Any

from harness.config import from_dict
from harness.registry import Registry

METHODS: Registry = Registry("method")

AGENT_METHODS = ("research", "search_r1", "r1_searcher", "rag_r1", "prorag")


def _agent_builder(dialect: str):
    def build(backend: Any, retriever: Any, options: dict[str, Any]) -> Any:
        from pipelines.search_agent import AgentConfig, SearchAgent

        cfg = from_dict(AgentConfig, options, where="agent")
        return SearchAgent(backend, retriever, dialect=dialect, config=cfg, method=dialect)

    return build


def _baseline_builder(name: str):
    def build(backend: Any, retriever: Any, options: dict[str, Any]) -> Any:
        from pipelines.baselines.flashrag_methods import BaselineConfig, FlashRAGBaseline

        cfg = from_dict(BaselineConfig, options, where="baseline")
        return FlashRAGBaseline(name, backend, retriever, cfg)

    return build


for _d in AGENT_METHODS:
    METHODS.register(_d, _agent_builder(_d), kind="agent", needs_retriever=True)
for _b in ("naive", "standard", "iter_retgen", "ircot", "flare", "self_ask"):
    METHODS.register(_b, _baseline_builder(_b), kind="baseline", needs_retriever=_b != "naive")


def build_method(name: str, backend: Any, retriever: Any, options: dict[str, Any] | None = None) -> Any:
    return METHODS.get(name)(backend, retriever, options or {})


def method_kind(name: str) -> str:
    METHODS.get(name)
    return METHODS.info(name)["kind"]
