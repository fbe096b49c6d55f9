"""Shared plumbing of the HTTP backends: a pooled async client per event loop, a concurrency
limit, retries with exponential backoff on connection errors / timeouts / 5xx, and a
fail-fast health check."""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any, Self

import httpx

from harness.backends.base import BackendBase, BackendError, SamplingParams
from harness.errors import redact_urls
from harness.models import load_tokenizer, resolve_model

logger = logging.getLogger(__name__)


def optional_sampling(params: SamplingParams, seed_key: str = "seed") -> dict[str, Any]:
    """The sampling fields a request carries only when set (else the server's default holds):
    ``top_k`` when > 0, ``stop`` and ``stop_token_ids`` when not empty, the seed (under
    ``seed_key``, the server's name for it) when not None."""
    out: dict[str, Any] = {}
    if params.top_k > 0:
        out["top_k"] = params.top_k
    if params.stop:
        out["stop"] = list(params.stop)
    if params.stop_token_ids:
        out["stop_token_ids"] = list(params.stop_token_ids)
    if params.seed is not None:
        out[seed_key] = params.seed
    return out


class HTTPBackendBase(BackendBase):
    """Round-robins requests over one or more server URLs (data-parallel servers or a router).

    ``max_concurrency`` bounds requests in flight (per event loop); ``timeout`` is per attempt;
    ``retries`` extra attempts follow connection errors, timeouts and 5xx answers, waiting
    ``backoff * 2**attempt`` seconds between them, each on the next URL. A 4xx is not retried.
    """

    def __init__(
        self,
        url: str | list[str],
        max_concurrency: int = 16,
        timeout: float = 120.0,
        retries: int = 3,
        backoff: float = 0.5,
        headers: dict[str, str] | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("no server URL given")
        self.urls = [u.rstrip("/") for u in urls]
        self._next_url = itertools.cycle(self.urls)
        self.max_concurrency = max_concurrency
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.headers = headers or {}
        # asyncio primitives belong to one event loop; FlashRAG's sync calls run their own loops.
        self._per_loop: dict[int, tuple[httpx.AsyncClient, asyncio.Semaphore]] = {}
        self._models: list[dict[str, Any]] | None = None  # /v1/models of the first server, asked once

    @classmethod
    def from_config(cls, cfg: Any, **extra: Any) -> Self:
        """From a :class:`~harness.eval_config.BackendConfig`: ``url`` (several: round-robin),
        ``model`` (the tokenizer), ``max_concurrency``, ``timeout``, ``retries``; ``extra``: a
        subclass's own constructor arguments."""
        if not cfg.url:
            raise ValueError(f"backend {cls.name!r} needs --url (the server's base URL)")
        url = cfg.url if len(cfg.url) > 1 else cfg.url[0]
        return cls(
            url=url,
            model=cfg.model,
            max_concurrency=cfg.max_concurrency,
            timeout=cfg.timeout,
            retries=cfg.retries,
            **extra,
        )

    def load_tokenizer(self, model: str | None, tokenizer: Any = None) -> Any:
        """The tokenizer of the served model: ``tokenizer`` if given, else loaded from ``model`` (a
        name, local directory or hub id; default the embedded model), recording ``model_path``."""
        self.model_path: str | None = None
        if tokenizer is not None:
            return tokenizer

        try:
            self.model_path = resolve_model(model or "smollm2-135m-instruct")
            return load_tokenizer(self.model_path)
        except OSError as e:
            raise BackendError(
                f"cannot load the tokenizer {model!r} for the server at {self.urls[0]} ({e}); "
                "pass model=<a local model directory or hub id> matching the served model"
            ) from e

    def context_limit(self, tokenizer: Any, max_context: int | None, ask_server: bool = True) -> int:
        """The context the agent may fill: ``max_context`` if given, else what the server serves
        (``max_model_len`` on ``/v1/models``, which vLLM and SGLang report: a vLLM started with
        ``--max-model-len 2048`` rejects longer prompts whatever the model supports), else the
        tokenizer's limit (tokenizers without one report a huge sentinel: 32768 then)."""
        if max_context:
            return int(max_context)
        served = self._served_max_len() if ask_server else None
        if served:
            return served
        limit = getattr(tokenizer, "model_max_length", None) or 32768
        return 32768 if limit > 1 << 20 else int(limit)

    def served_models(self) -> list[dict[str, Any]]:
        """The models the first server lists on ``/v1/models`` (asked once; empty if unreadable)."""
        if self._models is None:
            try:
                data = httpx.get(self.urls[0] + "/v1/models", timeout=5.0, headers=self.headers).json()["data"]
            except (httpx.HTTPError, ValueError, KeyError, TypeError):
                data = []
            self._models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        return self._models

    def _served_max_len(self) -> int | None:
        """``max_model_len`` of the first model the first server lists, if any."""
        models = self.served_models()
        value = models[0].get("max_model_len") if models else None
        return int(value) if isinstance(value, int) and value > 0 else None

    def _client(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        key = id(asyncio.get_running_loop())
        if key not in self._per_loop:
            limits = httpx.Limits(max_connections=self.max_concurrency * 2)
            client = httpx.AsyncClient(timeout=self.timeout, headers=self.headers, limits=limits)
            self._per_loop[key] = (client, asyncio.Semaphore(self.max_concurrency))
        return self._per_loop[key]

    async def post_json(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with the concurrency limit and retries; raises :class:`BackendError` at the end."""
        client, sem = self._client()
        last = ""
        async with sem:
            for attempt in range(self.retries + 1):
                url = next(self._next_url) + path
                try:
                    r = await client.post(url, json=payload)
                    if r.status_code < 500:
                        if r.status_code >= 400:
                            raise BackendError(f"{url} rejected the request ({r.status_code}): {r.text[:300]}")
                        try:
                            return r.json()
                        except ValueError:  # a 200 that is not JSON: a proxy page or a wrong port
                            raise BackendError(f"{url} answered non-JSON: {r.text[:200]!r}") from None
                    last = f"{url}: HTTP {r.status_code}: {r.text[:200]}"
                except httpx.TimeoutException as e:
                    last = f"{url}: timed out after {self.timeout} s ({type(e).__name__})"
                except httpx.TransportError as e:
                    last = f"{url}: {type(e).__name__}: {e}"
                if attempt < self.retries:
                    delay = self.backoff * (2**attempt)
                    logger.warning("%s; retry %d/%d in %.1f s", redact_urls(last), attempt + 1, self.retries, delay)
                    await asyncio.sleep(delay)
        raise BackendError(f"request failed after {self.retries + 1} attempts: {last}")

    health_path = "/health"

    def check(self) -> None:
        """Preflight: every server answers its health endpoint (raises :class:`BackendError`)."""
        self.check_health(self.health_path)

    def check_health(self, path: str = "/health", hint: str = "") -> None:
        """Fail fast, with a clear message, when a server is not there."""
        for u in self.urls:
            try:
                r = httpx.get(u + path, timeout=5.0, headers=self.headers)
                if r.status_code == 200:
                    continue
                problem = f"answered {r.status_code} on {path}"
            except httpx.HTTPError as e:
                problem = f"unreachable ({type(e).__name__})"
            raise BackendError(f"no healthy {self.name} server at {u}: {problem}. {hint}".strip())

    def close(self) -> None:
        for client, _ in self._per_loop.values():
            try:
                asyncio.run(client.aclose())
            except Exception:  # a client bound to a loop that is gone: its sockets close with it
                logger.debug("client close skipped", exc_info=True)
        self._per_loop.clear()
