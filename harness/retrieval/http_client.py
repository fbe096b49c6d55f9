"""A retriever that calls a retrieval server over HTTP, in any of the three APIs (REFERENCE §3):
``search_r1`` (``POST /retrieve``), ``flashrag`` (``POST /batch_search``) and ``r1_searcher``
(``POST /queries``). Connection errors and 5xx answers are retried with exponential backoff,
then raised as :class:`RetrievalError` naming the URL; a 4xx (our request is wrong) and an answer
of the wrong shape fail at once, since repeating them cannot help.

R1-Searcher's API returns bare contents strings, so documents from it get positional ids
(``r0``, ``r1``, ...) and score 0."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx

from harness.errors import redact_urls
from harness.retrieval.base import RetrievalError
from harness.types import Doc

logger = logging.getLogger(__name__)

APIS = ("search_r1", "flashrag", "r1_searcher")


def _doc(d: Any, i: int, score: float = 0.0) -> Doc:
    if isinstance(d, str):  # R1-Searcher answers are bare contents strings
        return Doc.from_contents(f"r{i}", d, score)
    contents = d.get("contents")
    if contents is None:
        contents = f"{d.get('title', '')}\n{d.get('text', '')}"
    return Doc.from_contents(str(d.get("id", f"r{i}")), contents, score)


class HTTPRetriever:
    """``search(queries, k)`` over a remote retrieval server speaking ``api``.

    ``timeout`` is per HTTP attempt (seconds); ``retries`` more attempts follow a connection
    error, a timeout or a 5xx, after ``backoff * 2**attempt`` seconds each.
    """

    def __init__(
        self, url: str, api: str = "search_r1", timeout: float = 30.0, retries: int = 3, backoff: float = 0.5
    ) -> None:
        if api not in APIS:
            raise ValueError(f"unknown retrieval API {api!r}; use one of {', '.join(APIS)}")
        self.url = url.rstrip("/")
        self.api = api
        self.retries = retries
        self.backoff = backoff
        self.index_id = f"http:{api}:{redact_urls(self.url)}"  # recorded in manifests: no credentials
        self._client = httpx.Client(timeout=timeout)

    @classmethod
    def from_config(cls, cfg: Any, corpus: str | None = None) -> HTTPRetriever:
        """From a :class:`~harness.eval_config.RetrieverConfig` (``url``, ``api``); ``corpus`` is unused."""
        if not cfg.url:
            raise ValueError("retriever 'http' needs a URL (--index URL or retriever.url=URL)")
        return cls(cfg.url, api=cfg.api, timeout=cfg.timeout, retries=cfg.retries)

    def check(self) -> None:
        """Preflight: one small search, no retries, so a dead server fails in about a second."""
        self._search(["preflight"], 1, retries=0)

    def _post(self, path: str, payload: dict[str, Any], retries: int | None = None) -> Any:
        last: str = ""
        retries = self.retries if retries is None else retries
        for attempt in range(retries + 1):
            try:
                r = self._client.post(self.url + path, json=payload)
                if r.status_code < 500:
                    if r.status_code >= 400:
                        raise RetrievalError(f"{self.url}{path} refused the request ({r.status_code}): {r.text[:300]}")
                    try:
                        return r.json()
                    except ValueError:
                        raise RetrievalError(f"{self.url}{path} answered non-JSON: {r.text[:200]!r}") from None
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except httpx.HTTPError as e:
                last = f"{type(e).__name__}: {e}"
            if attempt < retries:
                delay = self.backoff * (2**attempt)
                shown = redact_urls(f"{self.url}{path}")
                logger.warning("retrieval %s failed (%s); retrying in %.1f s", shown, redact_urls(last), delay)
                time.sleep(delay)
        raise RetrievalError(f"retrieval server {self.url}{path} failed after {retries + 1} attempts: {last}")

    def search(self, queries: list[str], k: int) -> list[list[Doc]]:
        """Top-``k`` documents per query from the server."""
        if not queries:
            return []
        try:
            out = self._search(queries, k)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise RetrievalError(f"{self.url} ({self.api} API) answered in an unexpected shape: {e!r}") from e
        if len(out) != len(queries):
            raise RetrievalError(f"{self.url} answered {len(out)} result lists for {len(queries)} queries")
        return out

    def _search(self, queries: list[str], k: int, retries: int | None = None) -> list[list[Doc]]:
        if self.api == "search_r1":
            data = self._post("/retrieve", {"queries": queries, "topk": k, "return_scores": True}, retries)
            return [
                [
                    _doc(x["document"], i, float(x.get("score", 0.0))) if "document" in x else _doc(x, i)
                    for i, x in enumerate(r)
                ]
                for r in data["result"]
            ]
        if self.api == "flashrag":
            data = self._post("/batch_search", {"query": queries, "top_n": k, "return_score": True}, retries)
            docs, scores = data if _is_scored(data) else (data, None)
            return [
                [_doc(d, i, float(scores[q][i]) if scores else 0.0) for i, d in enumerate(row)]
                for q, row in enumerate(docs)
            ]
        data = self._post("/queries", {"queries": queries, "k": k}, retries)
        return [[_doc(s, i) for i, s in enumerate(row)] for row in data["answers"]]

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_scored(data: Any) -> bool:
    """``[docs_lists, scores_lists]``: the second element holds lists of numbers."""
    return (
        isinstance(data, list)
        and len(data) == 2
        and isinstance(data[1], list)
        and all(isinstance(row, list) and all(isinstance(s, int | float) for s in row) for row in data[1])
    )
