"""Micro-batching of concurrent retrieval requests, and the server's own metrics.

Many small concurrent requests (an RL rollout issues exactly these) cost far more one by one than
together: each ``search`` call has a fixed cost (tokenizing, a kernel launch, an encoder forward)
that a batch pays once. :class:`MicroBatcher` queues the requests that arrive while a search is
running and answers them all with the next search call, one call per distinct ``k``. There is no
timer on the common path: the batch is whatever queued up during the previous search, so a lone
request waits for nothing. ``max_wait_s`` (0 by default) can hold the first request of a batch a
little longer to collect more; ``max_batch`` bounds the queries in one call. ``pad_slack`` (dense
retrievers) splits a batch into runs of similar-length queries, so an encoder that pads each call
to its longest row does not spend its time on padding.

A slow search (a dense encoder forward) runs on one worker thread, so the event loop keeps reading
requests (and answering ``/health`` and ``/metrics``) while it runs. A search predicted to take
less than ``inline_below_s`` (from the measured cost per query of earlier calls; BM25 batches) runs
on the event loop itself: handing it to a thread and back costs more than the search (GIL
hand-offs), and the requests that arrive meanwhile wait in the socket buffers and form the next
batch. Retrievers see one call at a time either way.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.retrieval.base import Retriever
from harness.types import Doc

LATENCY_WINDOW = 4096  # latencies kept for the quantiles: the most recent requests


@dataclass
class Metrics:
    """Counters a saturated server is judged by; :meth:`snapshot` is what ``/metrics`` returns."""

    started: float = field(default_factory=time.time)
    requests: int = 0
    queries: int = 0
    errors: int = 0  # 5xx: the retriever failed
    rejected: int = 0  # 4xx: bad requests
    batches: int = 0
    batch_queries_total: int = 0
    batch_size_max: int = 0
    # batch sizes in queries, by power-of-two bucket upper bound (1, 2, 4, ...)
    batch_hist: dict[int, int] = field(default_factory=dict)
    _lat: deque = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))

    def observe_batch(self, n: int) -> None:
        self.batches += 1
        self.batch_queries_total += n
        self.batch_size_max = max(self.batch_size_max, n)
        bucket = 1 << max(n - 1, 0).bit_length()
        self.batch_hist[bucket] = self.batch_hist.get(bucket, 0) + 1

    def observe_latency(self, seconds: float) -> None:
        self._lat.append(seconds)

    def snapshot(self, queue_depth: int, in_flight: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        lat = sorted(self._lat)

        def q(p: float) -> float | None:
            return round(lat[min(int(p * len(lat)), len(lat) - 1)] * 1e3, 3) if lat else None

        out = {
            "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests,
            "queries": self.queries,
            "errors": self.errors,
            "rejected": self.rejected,
            "queue_depth": queue_depth,
            "in_flight_batches": in_flight,
            "batches": self.batches,
            "batch_size_mean": round(self.batch_queries_total / self.batches, 3) if self.batches else None,
            "batch_size_max": self.batch_size_max,
            "batch_size_hist": {f"<={k}": v for k, v in sorted(self.batch_hist.items())},
            "latency_ms": {"p50": q(0.50), "p90": q(0.90), "p99": q(0.99), "window": len(lat)},
        }
        out.update(extra or {})
        return out


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future


class MicroBatcher:
    """Answers ``search(queries, k)`` calls from many coroutines with few retriever calls.

    Results are per request exactly what ``retriever.search(queries, k)`` returns: a batch holds
    requests of one ``k`` per retriever call, and each request gets its own rows back.
    """

    def __init__(
        self,
        retriever: Retriever,
        max_batch: int = 256,
        max_wait_s: float = 0.0,
        metrics: Metrics | None = None,
        inline_below_s: float = 0.005,
        pad_slack: float | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_wait_s < 0:
            raise ValueError(f"max_wait_s must be >= 0, got {max_wait_s}")
        if pad_slack is not None and pad_slack < 1:
            raise ValueError(f"pad_slack must be at least 1 (or None), got {pad_slack}")
        self.retriever, self.max_batch, self.max_wait_s = retriever, max_batch, max_wait_s
        self.pad_slack = pad_slack
        self.metrics = metrics or Metrics()
        self._queue: deque[_Pending] = deque()
        self._queued_queries = 0
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._in_flight = 0
        self.inline_below_s = inline_below_s
        self._cost_per_query: float | None = None  # seconds, moving average; None until measured
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieve")

    @property
    def queue_depth(self) -> int:
        """Queries waiting for a search call (not counting the batch being searched)."""
        return self._queued_queries

    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """The ``k`` best documents of each query. A request of more than ``max_batch`` queries is
        searched ``max_batch`` at a time, each piece queued after the one before has been
        answered, so it holds the search worker for one piece at a time and the requests that
        arrive meanwhile are searched between its pieces (one maximal request held a small one
        for 12.9 s on the dense server when it was searched whole)."""
        if len(queries) <= self.max_batch:
            return await self._search_one(queries, k)
        out: list[list[Doc]] = []
        for start in range(0, len(queries), self.max_batch):
            out += await self._search_one(queries[start : start + self.max_batch], k)
        return out

    async def _search_one(self, queries: list[str], k: int) -> list[list[Doc]]:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run())
        fut = loop.create_future()
        self._queue.append(_Pending(queries, k, fut))
        self._queued_queries += len(queries)
        self._wake.set()
        return await fut

    def _take(self) -> list[_Pending]:
        """Up to ``max_batch`` queries of queued requests (at least one request; none is larger)."""
        batch, n = [], 0
        while self._queue and (not batch or n + len(self._queue[0].queries) <= self.max_batch):
            p = self._queue.popleft()
            batch.append(p)
            n += len(p.queries)
        self._queued_queries -= n
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
            if self.max_wait_s > 0 and self._queued_queries < self.max_batch:
                await asyncio.sleep(self.max_wait_s)  # bounded: collect a few more before searching
            batch = self._take()
            by_k: dict[int, list[_Pending]] = {}
            for p in batch:
                by_k.setdefault(p.k, []).append(p)
            for k, group in by_k.items():
                flat = [q for p in group for q in p.queries]
                self._in_flight += 1
                inline = self._cost_per_query is not None and self._cost_per_query * len(flat) < self.inline_below_s
                try:
                    if inline:
                        results = self._search(flat, k)
                    else:
                        results = await loop.run_in_executor(self._pool, self._search, flat, k)
                except Exception as e:  # every request of the call gets the retriever's failure
                    for p in group:
                        if not p.future.done():
                            p.future.set_exception(e)
                    continue
                finally:
                    self._in_flight -= 1
                self.metrics.observe_batch(len(flat))
                start = 0
                for p in group:
                    if not p.future.done():  # a client that went away cancelled its future
                        p.future.set_result(results[start : start + len(p.queries)])
                    start += len(p.queries)
                if inline:  # let the loop read the requests that arrived during the search
                    for _ in range(3):
                        await asyncio.sleep(0)

    def _search(self, queries: list[str], k: int) -> list[list[Doc]]:
        t0 = time.perf_counter()
        if self.pad_slack is not None and len(queries) > 1:
            results = self._search_by_length(queries, k)
        else:
            results = self.retriever.search(queries, k)
        cost = (time.perf_counter() - t0) / max(len(queries), 1)
        self._cost_per_query = cost if self._cost_per_query is None else 0.8 * self._cost_per_query + 0.2 * cost
        if len(results) != len(queries):
            raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
        return results

    def _search_by_length(self, queries: list[str], k: int) -> list[list[Doc]]:
        """One search call per run of similar-length queries, results back in input order.

        A dense encoder pads every row of a call to its longest: on CPU, where compute grows with
        the padded tokens, one call over short and long queries together costs more than
        single-query calls would. Queries sorted by length are cut so that a call's padded size
        (longest × rows, in whitespace words + 1 as a token proxy) stays within ``pad_slack`` ×
        its real size."""
        size = [len(q.split()) + 1 for q in queries]
        order = sorted(range(len(queries)), key=size.__getitem__)
        chunks: list[list[int]] = [[]]
        real = 0
        for i in order:  # ascending: the query being added is the chunk's longest
            if chunks[-1] and size[i] * (len(chunks[-1]) + 1) > self.pad_slack * (real + size[i]):
                chunks.append([])
                real = 0
            chunks[-1].append(i)
            real += size[i]
        out: list[list[Doc] | None] = [None] * len(queries)
        for chunk in chunks:
            for i, docs in zip(chunk, self.retriever.search([queries[i] for i in chunk], k), strict=True):
                out[i] = docs
        return out  # type: ignore[return-value]

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)


class CachingEncoder:
    """A query-embedding cache in front of an encoder: RL rollouts ask the same queries again.

    Bounded LRU of ``max_entries`` vectors, keyed by (index id, encoder name, kind, text): one
    cache never serves vectors of another index or encoder. Passages are never cached. Thread-safe.
    Everything else (``spec``, ``dim``, ...) is the wrapped encoder's.
    """

    def __init__(self, inner: Any, index_id: str, max_entries: int = 50_000) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.inner, self.index_id, self.max_entries = inner, index_id, max_entries
        self._cache: OrderedDict[tuple[str, str, str, str], Any] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def __len__(self) -> int:
        return len(self._cache)

    def encode(self, texts: list[str], kind: str = "passage") -> Any:
        """``[len(texts), dim]`` as the wrapped encoder returns; query rows come from the cache when seen."""
        if kind != "query":
            return self.inner.encode(texts, kind=kind)
        name = getattr(getattr(self.inner, "spec", None), "name", type(self.inner).__name__)
        keys = [(self.index_id, name, kind, t) for t in texts]
        rows: list[Any] = [None] * len(texts)
        with self._lock:
            for i, key in enumerate(keys):
                vec = self._cache.get(key)
                if vec is not None:
                    self._cache.move_to_end(key)
                    rows[i] = vec
        missing = [i for i, r in enumerate(rows) if r is None]
        self.hits += len(texts) - len(missing)
        self.misses += len(missing)
        if missing:
            uniq = list(dict.fromkeys(texts[i] for i in missing))
            fresh = self.inner.encode(uniq, kind=kind)  # [U, dim]
            by_text = {t: fresh[j].copy() for j, t in enumerate(uniq)}  # a copy: a view would pin the batch
            with self._lock:
                for t, vec in by_text.items():
                    self._cache[(self.index_id, name, kind, t)] = vec
                    self._cache.move_to_end((self.index_id, name, kind, t))
                while len(self._cache) > self.max_entries:
                    self._cache.popitem(last=False)
            for i in missing:
                rows[i] = by_text[texts[i]]
        return np.stack(rows).astype(np.float32, copy=False)  # [N, dim]

    def stats(self) -> dict[str, int]:
        return {"entries": len(self._cache), "max_entries": self.max_entries, "hits": self.hits, "misses": self.misses}


__all__ = ["CachingEncoder", "Metrics", "MicroBatcher"]
