"""Micro-batching, /metrics and the query-embedding cache of the retrieval server."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from harness.retrieval.batching import CachingEncoder, MicroBatcher
from harness.retrieval.server import create_app
from harness.types import Doc
from tests.harness.conftest import ServerThread

QUERIES = ["capital of France", "cat sleeps", "Paris", "dog barks", "the", "France capital city", "sleeping cats"]


class SlowRecorder:
    """Answers each query with k docs named after it; sleeps per call so that requests queue up."""

    index_id = "slow"

    def __init__(self, delay: float = 0.02) -> None:
        self.delay, self.calls, self._lock = delay, [], threading.Lock()

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        with self._lock:
            self.calls.append((list(queries), k))
        time.sleep(self.delay)
        return [[Doc(f"{q}#{i}", q, f"k={k}", float(k - i)) for i in range(k)] for q in queries]


@pytest.mark.slow  # the BM25 fixture compiles numba kernels (seconds; shared with the HTTP tests)
def test_micro_batched_results_equal_unbatched(bm25_retriever):
    calls = [([q], 1 + i % 3) for i, q in enumerate(QUERIES * 4)] + [(QUERIES[:3], 2), (QUERIES, 5)]

    async def go():
        b = MicroBatcher(bm25_retriever, max_batch=16)
        try:
            return await asyncio.gather(*(b.search(qs, k) for qs, k in calls)), b.metrics
        finally:
            b.close()

    got, metrics = asyncio.run(go())
    for (qs, k), res in zip(calls, got, strict=True):
        assert res == bm25_retriever.search(qs, k), (qs, k)
    assert metrics.batches < len(calls)  # concurrent calls did share search calls
    assert metrics.batch_size_max <= 16 or metrics.batch_size_max == len(QUERIES)


def test_batches_group_by_k_and_respect_max_batch():
    rec = SlowRecorder(delay=0.01)

    async def go():
        b = MicroBatcher(rec, max_batch=4)
        try:
            return await asyncio.gather(*(b.search([f"q{i}"], 1 + i % 2) for i in range(20)))
        finally:
            b.close()

    got = asyncio.run(go())
    assert [r[0][0].id for r in got] == [f"q{i}#0" for i in range(20)]
    assert [len(r[0]) for r in got] == [1 + i % 2 for i in range(20)]
    assert all(len(qs) <= 4 for qs, _ in rec.calls) and len(rec.calls) < 20
    assert all(all(int(q[1:]) % 2 == k - 1 for q in qs) for qs, k in rec.calls)  # one k per call


def test_each_concurrent_http_request_gets_its_own_answer():
    rec = SlowRecorder(delay=0.02)
    with ServerThread(create_app(rec, max_k=10)) as s:

        def ask(i: int):
            qs = [f"q{i}-{j}" for j in range(1 + i % 3)]
            r = httpx.post(s.url + "/retrieve", json={"queries": qs, "topk": 1 + i % 4}, timeout=30)
            return i, qs, r.json()["result"]

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(48)))
        metrics = httpx.get(s.url + "/metrics").json()
    for i, qs, result in answers:
        assert [[d["id"] for d in row] for row in result] == [[f"{q}#{j}" for j in range(1 + i % 4)] for q in qs]
    assert len(rec.calls) < 48  # batched
    assert metrics["requests"] == 48 and metrics["errors"] == 0
    assert metrics["queries"] == sum(1 + i % 3 for i in range(48))
    assert metrics["batches"] == len(rec.calls) and metrics["batch_size_max"] > 1
    assert sum(metrics["batch_size_hist"].values()) == metrics["batches"]


def test_metrics_content_and_failures():
    class Failing(SlowRecorder):
        def search(self, queries, k):
            if "boom" in queries:
                raise RuntimeError("index exploded")
            return super().search(queries, k)

    with ServerThread(create_app(Failing(delay=0), max_k=5)) as s:
        m0 = httpx.get(s.url + "/metrics").json()
        assert m0["requests"] == 0 and m0["latency_ms"]["p50"] is None and m0["queue_depth"] == 0
        for q in ("a", "b", "c"):
            assert httpx.post(s.url + "/search", json={"query": q, "top_n": 2}).status_code == 200
        assert httpx.post(s.url + "/retrieve", json={"queries": ["boom"]}).status_code == 500
        assert httpx.post(s.url + "/retrieve", json={"queries": ["x"], "topk": 9}).status_code == 422
        assert httpx.post(s.url + "/metrics").status_code == 405
        assert httpx.get(s.url + "/nope").status_code == 404
        m = httpx.get(s.url + "/metrics").json()
    assert m["requests"] == 5 and m["queries"] == 4 and m["errors"] == 1 and m["rejected"] == 1
    assert m["batches"] == 3 and m["batch_size_hist"] == {"<=1": 3}
    lat = m["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] and lat["window"] >= 7
    assert m["index_id"] == "slow" and "embed_cache" not in m


class CountingEncoder:
    """A deterministic stand-in encoder that counts the texts it was asked to encode."""

    class spec:  # noqa: N801 - mirrors Encoder.spec
        name = "counting"

    dim = 4

    def __init__(self) -> None:
        self.encoded: list[str] = []

    def encode(self, texts, kind="passage"):
        self.encoded += list(texts)
        return np.array([[len(t), hash(t) % 97, ord(t[0]), 1.0] for t in texts], dtype=np.float32)


def test_embedding_cache_is_exact_bounded_and_index_keyed():
    inner = CountingEncoder()
    cache = CachingEncoder(inner, index_id="idx-a", max_entries=3)
    first = cache.encode(["a", "bb", "a"], kind="query")
    assert np.array_equal(first, inner.encode(["a", "bb", "a"])) and first.shape == (3, 4)
    inner.encoded.clear()
    assert np.array_equal(cache.encode(["bb", "a"], kind="query"), inner.encode(["bb", "a"]))
    assert inner.encoded == ["bb", "a"]  # only the check call above encoded: both came from the cache
    inner.encoded.clear()
    cache.encode(["c", "d", "e"], kind="query")  # evicts the least recent entries
    assert len(cache) == 3 and cache.stats()["max_entries"] == 3
    cache.encode(["a"], kind="query")
    assert inner.encoded == ["c", "d", "e", "a"]  # "a" had been evicted: encoded again
    cache.encode(["p"], kind="passage")
    cache.encode(["p"], kind="passage")
    assert inner.encoded[-2:] == ["p", "p"]  # passages are not cached
    other = CachingEncoder(inner, index_id="idx-b", max_entries=3)
    other.encode(["e"], kind="query")
    assert inner.encoded[-1] == "e"  # another index: its own cache
    assert cache.stats()["hits"] == 2 and cache.dim == 4
    with pytest.raises(ValueError, match="max_entries"):
        CachingEncoder(inner, "x", max_entries=0)


def test_server_installs_the_cache_on_a_dense_retriever():
    class FakeDense(SlowRecorder):
        def __init__(self):
            super().__init__(delay=0)
            self.encoder = CountingEncoder()

        def search(self, queries, k):
            vecs = self.encoder.encode(queries, kind="query")
            return [[Doc(q, q, str(v[0]), 1.0)] for q, v in zip(queries, vecs, strict=True)]

    r = FakeDense()
    app = create_app(r, embed_cache=10)
    assert isinstance(r.encoder, CachingEncoder) and app.embed_cache is r.encoder
    with ServerThread(app) as s:
        for _ in range(3):
            httpx.post(s.url + "/retrieve", json={"queries": ["same query"]})
        m = httpx.get(s.url + "/metrics").json()
    assert m["embed_cache"] == {"entries": 1, "max_entries": 10, "hits": 2, "misses": 1}
    assert create_app(SlowRecorder(), embed_cache=10).embed_cache is None  # nothing to cache for BM25


def test_pad_slack_splits_by_length_and_keeps_order():
    rec = SlowRecorder(delay=0.0)
    short = [f"q{i}" for i in range(6)]  # 1 word each
    long = [" ".join(f"w{j}" for j in range(20)) + f" {i}" for i in range(3)]  # 21 words each
    queries = [short[0], long[0], short[1], short[2], long[1], short[3], short[4], long[2], short[5]]

    async def go(slack):
        b = MicroBatcher(rec, pad_slack=slack)
        try:
            return await b.search(queries, 2)
        finally:
            b.close()

    got = asyncio.run(go(1.25))
    assert got == rec.search(queries, 2)  # every query gets its own rows, in input order
    rec.calls.clear()
    asyncio.run(go(1.25))
    # short and long queries never share a call: padding a 1-word query to 21 words is waste
    assert sorted(len(c) for c, _ in rec.calls) == [3, 6]
    for call, _ in rec.calls:
        sizes = [len(q.split()) + 1 for q in call]
        assert max(sizes) * len(sizes) <= 1.25 * sum(sizes)
    rec.calls.clear()
    asyncio.run(go(None))
    assert len(rec.calls) == 1  # off: one call for the whole batch
    with pytest.raises(ValueError, match="pad_slack"):
        MicroBatcher(rec, pad_slack=0.5)


def test_server_sets_encoder_threads_for_a_cpu_dense_retriever(monkeypatch):
    import torch

    from harness.retrieval.server import _encoder_threads

    class Dense:
        encoder, on_gpu = object(), False

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _encoder_threads(object())  # no encoder (BM25): left alone
        assert torch.get_num_threads() == 2
        _encoder_threads(Dense())  # default: one thread
        assert torch.get_num_threads() == 1
        monkeypatch.setenv("HARNESS_TORCH_THREADS", "2")
        _encoder_threads(Dense())
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_a_body_shorter_than_its_content_length_gets_408_not_a_held_connection():
    """Issue 31 defect 11: a request whose Content-Length exceeds its body was held open until
    the client gave up; its body read now times out (``body_timeout_s``) with 408."""
    from harness.retrieval.memory import InMemoryRetriever

    app = create_app(InMemoryRetriever([Doc.from_contents("d1", "t\nx", 0.0)]))
    app.body_timeout_s = 0.2
    sent: list[dict] = []
    first = [{"type": "http.request", "body": b'{"queries": ["x"', "more_body": True}]

    async def receive():  # the rest of the body never comes (the client still holds the socket)
        if first:
            return first.pop()
        await asyncio.Event().wait()

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "path": "/retrieve", "method": "POST", "headers": [(b"content-length", b"100")]}
    t0 = time.perf_counter()
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 408 and time.perf_counter() - t0 < 2
    assert b"request body not received within 0.2 s" in sent[1]["body"]


def test_a_large_request_is_searched_in_pieces_that_let_a_later_request_in_between():
    """Issue 31: one maximal request held a small concurrent one until all of it was searched."""
    rec = SlowRecorder(delay=0.05)
    big = [f"q{i}" for i in range(10)]

    async def go():
        b = MicroBatcher(rec, max_batch=4)
        try:
            large = asyncio.ensure_future(b.search(big, 2))
            await asyncio.sleep(0.02)  # the first piece is being searched
            small = await b.search(["late"], 2)
            return await large, small
        finally:
            b.close()

    large, small = asyncio.run(go())
    assert large == rec.search(big, 2) and small == rec.search(["late"], 2)  # same answers as one call
    pieces = [qs for qs, _ in rec.calls[:-2]]  # (the last two calls are the checks above)
    assert [len(p) for p in pieces] == [4, 1, 4, 2]  # the late request went in after the first piece
    assert pieces[1] == ["late"]
