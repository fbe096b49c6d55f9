"""One retrieval server speaking the three APIs users already run (REFERENCE §3).

- Search-R1: ``POST /retrieve`` ``{"queries": [...], "topk": 3, "return_scores": true}`` →
  ``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}`` (without
  ``return_scores``: ``{"result": [[{"id", "contents"}, ...], ...]}``).
- FlashRAG / ReSearch: ``POST /search`` ``{"query", "top_n", "return_score"}`` → a list of
  ``{"id", "contents"}`` (``[docs, scores]`` with ``return_score``); ``POST /batch_search`` with
  a list of queries → a list of such lists (``[docs_lists, scores_lists]``); ``GET /health`` →
  ``{"status": "healthy", ...}``. ``top_n`` defaults to 10 as in FlashRAG's server.
- R1-Searcher: ``POST /queries`` ``{"queries": [...], "k": 3}`` →
  ``{"queries": [...], "answers": [[contents, ...], ...]}``.

A missing ``topk``/``k`` means ``default_k`` (Search-R1's server default, 3). Bad requests (empty
query, k out of 1..max_k, too many queries, oversized body, wrong types) get a 4xx with a message
naming the field; a failing retriever gets a 500 with the reason. Neither stops the server.
``GET /metrics`` reports request counts, queue depth, batch sizes and latency quantiles.
``POST /admin/reload_encoder`` ``{"path": DIR}`` (loopback clients only) swaps a dense index's query
encoder for a retrained one (retriever RL's sync); see :meth:`RetrievalApp.reload_encoder`.

Speed under many small concurrent requests (what an RL rollout sends): the app is a plain ASGI
callable (no framework routing), bodies are validated by pydantic straight from JSON bytes and
answers are written with orjson, and concurrent requests are answered together by one search call
(:class:`~harness.retrieval.batching.MicroBatcher`). A dense retriever's query embeddings are cached
(:class:`~harness.retrieval.batching.CachingEncoder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.ports import serve_app
from harness.retrieval.base import Retriever
from harness.retrieval.batching import CachingEncoder, Metrics, MicroBatcher
from harness.retrieval.encoders import Encoder
from harness.types import Doc

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
MAX_QUERIES = 1000
MAX_QUERY_CHARS = 4096
FLASHRAG_DEFAULT_TOP_N = 10
# A request whose body does not arrive within this many seconds (a Content-Length larger than
# what is sent) gets 408 instead of holding its connection until the client gives up.
BODY_TIMEOUT_S = 10.0


class _Answer:
    """A JSON response as a tiny ASGI app (orjson; no framework on the hot path)."""

    __slots__ = ("status", "body")

    def __init__(self, status: int, payload: Any) -> None:
        self.status, self.body = status, orjson.dumps(payload)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(self.body)).encode())]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


class BodyLimit:
    """ASGI middleware: refuse bodies over ``max_bytes`` with 413, by header or by counting.

    Counting matters because a chunked request has no ``content-length`` to check. (The retrieval
    app reads bodies with the same limit itself; this wraps other ASGI apps.)
    """

    def __init__(self, app: Any, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = _Answer(413, {"detail": f"request body larger than {self.max_bytes} bytes"})
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await too_large(scope, receive, send)
            return
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body, replayed = b"".join(chunks), False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _check_queries(queries: list[str]) -> list[str]:
    if not queries:
        raise ValueError("must hold at least one query")
    if len(queries) > MAX_QUERIES:
        raise ValueError(f"at most {MAX_QUERIES} queries per request, got {len(queries)}")
    for i, q in enumerate(queries):
        if not q.strip():
            raise ValueError(f"query {i} is empty")
        if len(q) > MAX_QUERY_CHARS:
            raise ValueError(f"query {i} is longer than {MAX_QUERY_CHARS} characters")
    return queries


class _Strict(BaseModel):
    # strict: "3" is not a k and "true" is not a bool; extra fields (clients add their own) are ignored.
    model_config = ConfigDict(extra="ignore", strict=True)


class RetrieveRequest(_Strict):
    """Search-R1 ``POST /retrieve``."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False

    _q = field_validator("queries")(classmethod(lambda cls, v: _check_queries(v)))


class SearchRequest(_Strict):
    """FlashRAG ``POST /search``."""

    query: str = Field(min_length=1, max_length=MAX_QUERY_CHARS)
    top_n: int | None = None
    return_score: bool = False

    @field_validator("query")
    @classmethod
    def _nonblank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("query is empty")
        return v


class BatchSearchRequest(_Strict):
    """FlashRAG ``POST /batch_search``."""

    query: list[str]
    top_n: int | None = None
    return_score: bool = False

    _q = field_validator("query")(classmethod(lambda cls, v: _check_queries(v)))


class QueriesRequest(_Strict):
    """R1-Searcher ``POST /queries``."""

    queries: list[str]
    k: int | None = None

    _q = field_validator("queries")(classmethod(lambda cls, v: _check_queries(v)))


class _BadRequest(ValueError):
    """A request the models accept but the server settings do not (k out of range)."""


class _TooLarge(ValueError):
    pass


def _validation_detail(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg')}")
    return "; ".join(parts)


def _as_dict(d: Doc) -> dict[str, Any]:
    return {"id": d.id, "contents": d.contents}


_POST_MODELS: dict[str, type[_Strict]] = {
    "/retrieve": RetrieveRequest,
    "/search": SearchRequest,
    "/batch_search": BatchSearchRequest,
    "/queries": QueriesRequest,
}


# The admin route (retriever RL's encoder sync): loopback clients only.
RELOAD_ROUTE = "/admin/reload_encoder"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


class ReloadRequest(_Strict):
    """``POST /admin/reload_encoder`` ``{"path": DIR}``: a saved query encoder (HF dir with its sidecar)."""

    path: str = Field(min_length=1)


class RetrievalApp:
    """The retrieval server as a plain ASGI app over ``retriever`` (start it with uvicorn; see :func:`serve`).

    ``max_batch``/``max_wait_s`` tune the micro-batcher (see :class:`MicroBatcher`);
    ``embed_cache`` bounds the query-embedding cache of a dense retriever (0: none).
    ``pad_slack`` (off by default: no gain measured on CPU, see docs/performance.md)
    splits a batch into runs of similar-length queries for a padding encoder.
    """

    body_timeout_s = BODY_TIMEOUT_S  # a body not received within it is answered 408

    def __init__(
        self,
        retriever: Retriever,
        default_k: int = 3,
        max_k: int = 100,
        max_batch: int = 256,
        max_wait_s: float = 0.0,
        embed_cache: int = 50_000,
        max_body_bytes: int = MAX_BODY_BYTES,
        pad_slack: float | None = None,
    ) -> None:
        if not 1 <= default_k <= max_k:
            raise ValueError(f"default_k must be between 1 and max_k={max_k}, got {default_k}")
        self.retriever, self.default_k, self.max_k, self.max_body_bytes = retriever, default_k, max_k, max_body_bytes
        self.embed_cache = _install_embed_cache(retriever, embed_cache)
        self.metrics = Metrics()
        self.batcher = MicroBatcher(
            retriever, max_batch=max_batch, max_wait_s=max_wait_s, metrics=self.metrics, pad_slack=pad_slack
        )
        self._handlers = {
            "/retrieve": self._retrieve,
            "/search": self._search,
            "/batch_search": self._batch_search,
            "/queries": self._queries,
        }

    # --- ASGI -------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        t0 = time.perf_counter()
        answer = await self._answer(scope, receive)
        await answer(scope, receive, send)
        self.metrics.observe_latency(time.perf_counter() - t0)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.batcher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: dict, receive: Any) -> _Answer:
        path, method = scope["path"], scope["method"]
        if path == RELOAD_ROUTE:
            return await self._admin_reload(scope, receive)
        if path in ("/health", "/metrics"):
            if method not in ("GET", "HEAD"):
                return _Answer(405, {"detail": f"{path} takes GET"})
            return _Answer(200, self.health() if path == "/health" else self.metrics_snapshot())
        handler = self._handlers.get(path)
        if handler is None:
            return _Answer(404, {"detail": f"no route {path}"})
        if method != "POST":
            return _Answer(405, {"detail": f"{path} takes POST"})
        self.metrics.requests += 1
        try:
            body = await self._read_body(scope, receive)
            req = _POST_MODELS[path].model_validate_json(body)
            return _Answer(200, await handler(req))
        except _TooLarge as e:
            self.metrics.rejected += 1
            return _Answer(413, {"detail": str(e)})
        except ValidationError as e:
            self.metrics.rejected += 1
            return _Answer(422, {"detail": _validation_detail(e)})
        except _BadRequest as e:
            self.metrics.rejected += 1
            return _Answer(422, {"detail": str(e)})
        except ConnectionResetError:  # the client left mid-body: nobody to answer
            return _Answer(400, {"detail": "client disconnected"})
        except TimeoutError:
            self.metrics.rejected += 1
            return _Answer(408, {"detail": f"request body not received within {self.body_timeout_s:g} s"})
        except Exception as e:  # the retriever failed: say why, keep serving
            self.metrics.errors += 1
            logger.exception("retrieval failed")
            return _Answer(500, {"detail": f"retrieval failed: {type(e).__name__}: {e}"})

    async def _read_body(self, scope: dict, receive: Any) -> bytes:
        too_large = _TooLarge(f"request body larger than {self.max_body_bytes} bytes")
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_body_bytes:
                raise too_large
        chunks, size = [], 0
        while True:
            message = await asyncio.wait_for(receive(), self.body_timeout_s)  # TimeoutError: 408
            if message["type"] == "http.disconnect":
                raise ConnectionResetError("client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:  # counted: a chunked request has no content-length
                raise too_large
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # --- the APIs ---------------------------------------------------------------------------
    def k_of(self, value: int | None, field: str, default: int | None = None) -> int:
        if value is None:
            return min(self.default_k if default is None else default, self.max_k)
        if not 1 <= value <= self.max_k:
            raise _BadRequest(f"{field} must be between 1 and {self.max_k}, got {value}")
        return value

    async def _run(self, queries: list[str], k: int) -> list[list[Doc]]:
        self.metrics.queries += len(queries)
        return await self.batcher.search(queries, k)

    async def _retrieve(self, req: RetrieveRequest) -> dict[str, Any]:
        results = await self._run(req.queries, self.k_of(req.topk, "topk"))
        if req.return_scores:
            return {"result": [[{"document": _as_dict(d), "score": d.score} for d in docs] for docs in results]}
        return {"result": [[_as_dict(d) for d in docs] for docs in results]}

    async def _search(self, req: SearchRequest) -> Any:
        (docs,) = await self._run([req.query], self.k_of(req.top_n, "top_n", FLASHRAG_DEFAULT_TOP_N))
        if req.return_score:
            return [[_as_dict(d) for d in docs], [d.score for d in docs]]
        return [_as_dict(d) for d in docs]

    async def _batch_search(self, req: BatchSearchRequest) -> Any:
        results = await self._run(req.query, self.k_of(req.top_n, "top_n", FLASHRAG_DEFAULT_TOP_N))
        docs = [[_as_dict(d) for d in r] for r in results]
        if req.return_score:
            return [docs, [[d.score for d in r] for r in results]]
        return docs

    async def _queries(self, req: QueriesRequest) -> dict[str, Any]:
        results = await self._run(req.queries, self.k_of(req.k, "k"))
        return {"queries": req.queries, "answers": [[d.contents for d in r] for r in results]}

    def health(self) -> dict[str, Any]:
        # FlashRAG's shape ("healthy", retrievers), plus which index this is.
        return {"status": "healthy", "retrievers": {"total": 1, "available": 1}, "index_id": self.retriever.index_id}

    def metrics_snapshot(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"index_id": self.retriever.index_id}
        if getattr(self, "encoder_version", 0):  # the encoder was reloaded (/admin/reload_encoder)
            extra["encoder"] = {"version": self.encoder_version, "path": self.encoder_path}
        if self.embed_cache is not None:
            extra["embed_cache"] = self.embed_cache.stats()
        return self.metrics.snapshot(self.batcher.queue_depth, self.batcher.in_flight, extra)

    # --- admin: swap the query encoder (retriever RL's sync) ---------------------------------
    async def _admin_reload(self, scope: dict, receive: Any) -> _Answer:
        """Loopback clients only (the authentication is the socket): load ``path`` and swap it in."""
        client = (scope.get("client") or ("", 0))[0]
        if client not in LOOPBACK and not client.startswith("127."):
            return _Answer(403, {"detail": f"{RELOAD_ROUTE} is accepted from loopback clients only, not {client!r}"})
        if scope["method"] != "POST":
            return _Answer(405, {"detail": f"{RELOAD_ROUTE} takes POST"})
        try:
            req = ReloadRequest.model_validate_json(await self._read_body(scope, receive))
            return _Answer(200, await asyncio.to_thread(self.reload_encoder, req.path))
        except ValidationError as e:
            return _Answer(422, {"detail": _validation_detail(e)})
        except (_TooLarge, _BadRequest, ValueError, OSError, RuntimeError) as e:  # bad dir, wrong dim, no encoder
            return _Answer(422, {"detail": f"reload failed: {type(e).__name__}: {e}"})

    def reload_encoder(self, path: str) -> dict[str, Any]:
        """Load the query encoder at ``path`` and swap it in atomically; returns the new version.

        The swap takes the dense retriever's search lock, so a batch being encoded finishes on the old
        encoder and the next one starts on the new. The query-embedding cache starts empty, keyed by the
        new version (vectors of the old encoder are never served again). Document vectors stay as built.
        """
        target = getattr(self.retriever, "inner", self.retriever)
        old = getattr(target, "encoder", None)
        if old is None or not hasattr(target, "index"):
            raise _BadRequest("this server's retriever has no dense query encoder to reload")

        new = Encoder(path)  # loaded before taking the lock: searches go on meanwhile
        if new.dim != target.index.d:
            raise _BadRequest(f"encoder {path} gives {new.dim}-d vectors, the index holds {target.index.d}-d")
        version = getattr(self, "encoder_version", 0) + 1
        cache = None
        if self.embed_cache is not None:
            cache = CachingEncoder(new, f"{self.retriever.index_id}@enc{version}", self.embed_cache.max_entries)
        lock = getattr(target, "_lock", None)
        with lock if lock is not None else contextlib.nullcontext():
            target.encoder = cache or new
            self.embed_cache, self.encoder_version, self.encoder_path = cache, version, path
        logger.info("query encoder reloaded from %s (version %d)", path, version)
        return {"status": "ok", "encoder": path, "version": version}


def _install_embed_cache(retriever: Any, max_entries: int) -> CachingEncoder | None:
    """Put a query-embedding cache in front of a dense retriever's encoder (no-op for others)."""
    target = getattr(retriever, "inner", retriever)  # a CachedRetriever wraps the real one
    encoder = getattr(target, "encoder", None)
    if max_entries <= 0 or encoder is None or not hasattr(encoder, "encode"):
        return None
    if isinstance(encoder, CachingEncoder):
        return encoder
    target.encoder = CachingEncoder(encoder, index_id=retriever.index_id, max_entries=max_entries)
    return target.encoder


def _encoder_threads(retriever: Any) -> None:
    """One torch intra-op thread for a dense retriever's CPU query encoder in the server process,
    unless ``HARNESS_TORCH_THREADS=N`` says otherwise.

    Measured on the shared 2-core VM (docs/performance.md): with two OpenMP threads an encoder
    call waits at every barrier for a sibling the scheduler has descheduled; batches of 32
    queries cost 349 ms/query against 108 ms with one thread, single queries 3.2 s against 0.3 s,
    and the server used 0.1-0.2 cores while requests waited 9 s. On a quiet many-core machine
    more threads may pay (not measured): set ``HARNESS_TORCH_THREADS``."""
    target = getattr(retriever, "inner", retriever)
    if getattr(target, "encoder", None) is None or getattr(target, "on_gpu", False):
        return
    # deferred: torch costs ~1.4 s at import
    import torch

    n = int(os.environ.get("HARNESS_TORCH_THREADS", "1") or 1)
    torch.set_num_threads(n)
    logger.info("query encoder: %d torch thread(s) (HARNESS_TORCH_THREADS)", n)


def create_app(retriever: Retriever, default_k: int = 3, max_k: int = 100, **options: Any) -> RetrievalApp:
    """The ASGI app over ``retriever``; ``options`` go to :class:`RetrievalApp` (batching, cache)."""
    return RetrievalApp(retriever, default_k=default_k, max_k=max_k, **options)


def serve(
    retriever: Retriever,
    host: str = "127.0.0.1",
    port: int = 8000,
    max_k: int = 100,
    default_k: int = 3,
    access_log: bool = False,
    ready: Callable[[str], None] | None = None,
    **options: Any,
) -> None:
    """Run the server in the foreground with uvicorn (Ctrl-C stops it). Loopback unless told otherwise.

    uvloop and httptools are used when installed (uvicorn picks them). The access log is off by
    default: one log line per request costs ~5% of the server's time under load. ``ready(url)``
    is called once the socket listens (:func:`harness.ports.serve_app`); a port that cannot be
    listened on raises before it.
    """
    app = create_app(retriever, default_k=default_k, max_k=max_k, **options)  # checks settings before warming up
    _encoder_threads(retriever)
    retriever.search(["warm up"], 1)  # first use compiles (numba) or loads weights: not on a request
    serve_app(app, host, port, ready, log_level="info", access_log=access_log)
