"""The retriever protocol and the retrieval cache.

A retriever answers a batch of queries with the top-k documents of each:
``search(queries, k) -> list[list[Doc]]``. ``index_id`` names the index it searches (a hash of
the manifest for built indexes, the URL for HTTP retrievers) and keys the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Protocol, runtime_checkable

from harness.errors import InfrastructureError
from harness.types import Doc


class RetrievalError(InfrastructureError):
    """A retrieval call failed for good (bad index, server unreachable after retries, ...)."""

    kind = "retrieval"


@runtime_checkable
class Retriever(Protocol):
    index_id: str

    def search(self, queries: list[str], k: int) -> list[list[Doc]]: ...


class CachedRetriever:
    """Wraps a retriever with an LRU cache keyed by (index id, query, k). Thread-safe."""

    def __init__(self, inner: Retriever, max_entries: int = 100_000) -> None:
        self.inner = inner
        self.index_id = inner.index_id
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, str, int], list[Doc]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        results: list[list[Doc] | None] = [None] * len(queries)
        missing: list[int] = []
        with self._lock:
            for i, q in enumerate(queries):
                key = (self.index_id, q, k)
                if key in self._cache:
                    self._cache.move_to_end(key)
                    results[i] = self._cache[key]
                    self.hits += 1
                else:
                    missing.append(i)
                    self.misses += 1
        if missing:
            # Deduplicate within the batch so one query is searched once.
            uniq = list(dict.fromkeys(queries[i] for i in missing))
            found = dict(zip(uniq, self.inner.search(uniq, k), strict=True))
            with self._lock:
                for q, docs in found.items():
                    self._cache[(self.index_id, q, k)] = docs
                    self._cache.move_to_end((self.index_id, q, k))
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            for i in missing:
                results[i] = found[queries[i]]
        return [r if r is not None else [] for r in results]

    def __getattr__(self, name: str):  # expose the inner retriever's extras (manifest, ...)
        return getattr(self.inner, name)
