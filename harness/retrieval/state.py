"""History-aware retrieval state (HARR): what a retriever may know about the trajectory asking.

A retriever whose ``search`` takes a ``state`` keyword gets, per query, a :class:`RetrievalState`:
the original question and the trajectory's history: one step per earlier model turn, its
sub-query and its parsed sub-answer, as HARR's ``llama_index_hacked/tool.py`` and ``generator.py``
keep it (the retrieved titles are kept too, for the older ``titles`` rendering).
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
    """One earlier step of the trajectory: its sub-query (``None``: the turn searched nothing), the
    titles it retrieved, and its parsed sub-answer (HARR's ``answer``: the turn's last reasoning
    block; ``None`` when there is none or the caller has no model turns, e.g. a baseline)."""

    query: str | None
    titles: tuple[str, ...] = ()
    answer: str | None = None


@dataclass(frozen=True)
class RetrievalState:
    """The structured state of one retrieval call; the retriever decides how to render it.

    ``key`` names the trajectory asking (``"<example id>#<sample index>"`` from the agent loop):
    a sampling retriever seeds each call from it, so samples do not depend on call order.
    """

    question: str
    history: tuple[HistoryStep, ...] = field(default_factory=tuple)  # one per earlier retrieval call
    key: str = ""
    # One per earlier model turn (HARR's history: sub-query and sub-answer); empty when the caller
    # has no model turns (a baseline), and then ``history`` stands in.
    turns: tuple[HistoryStep, ...] = field(default_factory=tuple)


def accepts_state(retriever: Any) -> bool:
    """Whether ``retriever.search`` takes a ``state`` keyword (history-aware retrievers do)."""
    search = getattr(retriever, "search", None)
    if search is None:
        return False
    try:
        return "state" in inspect.signature(search).parameters
    except (TypeError, ValueError):  # builtins / C callables without a signature
        return False


def state_for(
    question: str, searches: list[Any], key: str = "", turns: list[tuple[str | None, str | None]] | None = None
) -> RetrievalState:
    """The state before a new call: the question, every earlier :class:`SearchRecord`'s query +
    titles (``history``), and, given the agent's earlier model turns as (sub-query, sub-answer)
    pairs parsed as HARR's ``generator.py`` does, one step per turn (``turns``)."""
    steps = tuple(HistoryStep(s.query, tuple(d.title for d in s.docs)) for s in searches)
    per_turn = tuple(HistoryStep(q, (), a) for q, a in turns or ())
    return RetrievalState(question=question, history=steps, key=key, turns=per_turn)
