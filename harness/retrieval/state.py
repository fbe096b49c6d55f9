"""History-aware retrieval state (HARR): what a retriever may know about the trajectory asking.

A retriever whose ``search`` takes a ``state`` keyword gets, per query, a :class:`RetrievalState`:
the original question and the trajectory's earlier retrieval calls (query + retrieved titles).
The agent loop builds it with :func:`state_for` and passes it only when :func:`accepts_state`
says the retriever takes it, so plain retrievers keep the two-argument protocol.

Kept free of torch/faiss imports: the agent loop imports it on every run.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

# How a history-aware state renders as the query tower's input text: HARR's stateful embedding
# query (llama_index_hacked/tool.py, build_stateful_embedding_query).
DEFAULT_STATE_TEMPLATE = "Original Question: {question}\nHistory: {history}\nQuery: {query}"


@dataclass(frozen=True)
class HistoryStep:
    """One earlier retrieval call of the trajectory."""

    query: str
    titles: tuple[str, ...] = ()


@dataclass(frozen=True)
class RetrievalState:
    """The structured state of one retrieval call; the retriever decides how to render it.

    ``key`` names the trajectory asking (``"<example id>#<sample index>"`` from the agent loop):
    a sampling retriever seeds each call from it, so samples do not depend on call order.
    """

    question: str
    history: tuple[HistoryStep, ...] = field(default_factory=tuple)
    key: str = ""


def accepts_state(retriever: Any) -> bool:
    """Whether ``retriever.search`` takes a ``state`` keyword (history-aware retrievers do)."""
    search = getattr(retriever, "search", None)
    if search is None:
        return False
    try:
        return "state" in inspect.signature(search).parameters
    except (TypeError, ValueError):  # builtins / C callables without a signature
        return False


def state_for(question: str, searches: list[Any], key: str = "") -> RetrievalState:
    """The state before a new call: the question and every earlier :class:`SearchRecord`'s query + titles."""
    steps = tuple(HistoryStep(s.query, tuple(d.title for d in s.docs)) for s in searches)
    return RetrievalState(question=question, history=steps, key=key)
