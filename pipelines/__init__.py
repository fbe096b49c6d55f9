"""Pipelines: the reasoning-with-search agent (one loop, many dialects) and FlashRAG baselines.

``from pipelines import SearchAgent`` gives the agent, a FlashRAG ``BasicPipeline``:
``SearchAgent(backend, retriever, dialect="search_r1").run(flashrag_dataset)``. Exports are
loaded on first use, so importing the package does not import FlashRAG.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "SearchAgent": "pipelines.search_agent",
    "AgentConfig": "pipelines.search_agent",
    "FlashRAGBaseline": "pipelines.baselines.flashrag_methods",
    "BaselineConfig": "pipelines.baselines.flashrag_methods",
    "METHODS": "pipelines.methods",
    "Method": "pipelines.methods",
    "build_method": "pipelines.methods",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'pipelines' has no attribute {name!r}")

    return getattr(importlib.import_module(_EXPORTS[name]), name)
