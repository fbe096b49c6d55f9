"""``memory``: a tiny in-memory retriever (word-overlap scoring), for tests and toy corpora.

It is a real, registered component so that the default test run is CPU-only and end to end; it
is not meant for benchmarks (use BM25 or dense indexes there).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from harness.retrieval.corpus import read_corpus
from harness.types import Doc

_WORD = re.compile(r"\w+", re.UNICODE)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


class InMemoryRetriever:
    """Scores each document by the number of distinct query words it contains (ties: corpus order)."""

    def __init__(self, docs: Iterable[Doc], index_id: str = "memory") -> None:
        self.docs = list(docs)
        self.index_id = index_id
        self._bags = [_words(d.title + " " + d.text) for d in self.docs]

    @classmethod
    def from_config(cls, cfg: Any, corpus: str | None = None) -> InMemoryRetriever:
        """Over ``retriever.corpus`` (or the dataset's ``corpus``) from a ``RetrieverConfig``."""
        path = cfg.corpus or corpus
        if path is None:
            raise ValueError("retriever 'memory' needs a corpus: retriever.corpus=FILE (a FlashRAG-format JSONL)")
        return cls(read_corpus(path), index_id=f"memory:{path}")

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        out = []
        for q in queries:
            qw = _words(q)
            scored = [(len(qw & bag), -i) for i, bag in enumerate(self._bags)]
            top = sorted(range(len(self.docs)), key=lambda i: scored[i], reverse=True)[:k]
            out.append([Doc(self.docs[i].id, self.docs[i].title, self.docs[i].text, float(scored[i][0])) for i in top])
        return out
