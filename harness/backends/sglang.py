"""``sglang``: SGLang's native ``/generate`` over HTTP, token ids in and out.

Observed on SGLang 0.5.23 (recordings in ``tests/fixtures/sglang_recorded``): ``output_ids``
include the tokens of a matched stop string and the EOS token; ``text`` has the stop string
trimmed unless ``no_stop_trim``, and with ``no_stop_trim`` it ends exactly at the stop string
even when that ends inside a token. ``finish_reason`` is ``{"type": "stop", "matched": str |
int}``, ``{"type": "length"}`` or ``{"type": "abort", "message"}``; logprobs come as
``meta_info.output_token_logprobs = [[logprob, token_id, null], ...]``.

We always send ``no_stop_trim: true`` and rebuild ``text`` by decoding ``output_ids`` (the
harness contract: text is the decoding of token ids, stop string kept). If a server trimmed the
stop tokens from ``output_ids`` too, the matched string's encoding is appended (likewise an int
``matched`` missing from the end of ``output_ids``); ``meta["restored_tokens"]`` counts such
tokens, whose logprobs are reported as 0.0.

Requests that become ready together (within ``batch_window_ms``, at most ``max_batch`` of them)
go out as ONE ``/generate`` whose ``input_ids`` is a list of id lists, with one
``sampling_params`` / ``return_logprob`` / ``lora_path`` per entry; SGLang answers with a list in
the same order. That saves the server's per-request HTTP and tokenizer-manager work (the cost a
turn-synchronous loop that sends one batch per turn does not pay) without waiting for stragglers:
only requests that were ready within the window share a POST. The price: a POST returns when its
slowest entry is done, so a short generation in a batch waits for a long one of the same POST
(the engine still schedules them as separate sequences). ``batch_window_ms=0`` (the default
until the batched form is checked against a real SGLang server: tested on a stand-in only) turns it off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from harness.backends.base import (
    BackendError,
    Completion,
    SamplingParams,
    WeightUpdate,
    export_model_dir,
    prune_exports,
    run_sync,
)
from harness.backends.http_common import HTTPBackendBase, optional_sampling

logger = logging.getLogger(__name__)


class SGLangBackend(HTTPBackendBase):
    """Client of SGLang's native ``/generate`` (see module docstring).

    ``url``: one server or a list (round-robin over data-parallel servers). ``model``: the
    tokenizer's name or directory; by default what the server reports on ``/model_info``, else the
    embedded model. ``tokenizer``: an already loaded tokenizer instead. Retries and the
    concurrency limit (a batched POST counts once): :class:`~harness.backends.http_common.HTTPBackendBase`,
    whose ``max_concurrency``, ``timeout``, ``retries`` and ``backoff`` are passed on (``http``).
    ``batch_window_ms`` / ``max_batch``: the client-side micro-batching (module docstring; 0 ms: off).
    """

    name = "sglang"
    # The weight-sync routes' own timeout, not the generation's per-attempt one: with ``drain`` the
    # server's model-update lock waits for every request in flight, however long they run, and
    # a 7B load from disk takes minutes (as vLLM's ``sync_timeout``). Every sync route uses it.
    sync_timeout: float = 600.0

    def __init__(
        self,
        url: str | list[str],
        model: str | None = None,
        health_check: bool = True,
        tokenizer: Any = None,
        max_context: int | None = None,
        batch_window_ms: float = 0.0,
        max_batch: int = 8,
        **http: Any,
    ) -> None:
        super().__init__(url, **http)
        if batch_window_ms < 0 or max_batch < 1:
            raise ValueError(f"batch_window_ms must be >= 0 and max_batch >= 1, got {batch_window_ms}, {max_batch}")
        self.batch_window_s = batch_window_ms / 1000.0
        self.max_batch = max_batch
        self._batchers: dict[int, _MicroBatcher] = {}  # one per event loop (its futures and timer)
        self.posts = 0  # /generate requests sent (a batched one counts once)
        if health_check:
            self.check_health(
                "/health",
                hint="Start one with `python -m sglang.launch_server --model-path M --port N` "
                "or `harness serve model --engine sglang`.",
            )
        if model is None and health_check and tokenizer is None:
            model = self._server_model()
        self.tokenizer = self.load_tokenizer(model, tokenizer)
        self.max_context = self.context_limit(self.tokenizer, max_context, ask_server=health_check)
        self.lora_name: str | None = None  # the LoRA adapter rollouts use (update_lora_adapter), if any

    @classmethod
    def from_config(cls, cfg: Any, **extra: Any) -> SGLangBackend:
        """As :meth:`HTTPBackendBase.from_config`, plus the micro-batch window (``batch_window_ms``)
        and size (``max_batch_size``)."""
        return super().from_config(cfg, batch_window_ms=cfg.batch_window_ms, max_batch=cfg.max_batch_size, **extra)

    def sync_urls(self) -> list[str]:
        """Where weight updates go: each configured URL, or, for an sglang-router, every worker it
        lists (``GET /list_workers`` → ``{"urls": [...]}``). The router balances ``/generate`` but
        does not forward weight updates, so they are posted to its workers directly. Asked once."""
        if getattr(self, "_sync_urls", None) is None:
            targets: list[str] = []
            for url in self.urls:
                workers = self._router_workers(url)
                targets += workers if workers else [url]
            self._sync_urls = list(dict.fromkeys(targets))
        return self._sync_urls

    @staticmethod
    def _router_workers(url: str) -> list[str]:
        try:
            r = httpx.get(url + "/list_workers", timeout=5.0)
            urls = r.json().get("urls") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return []
        return [str(u).rstrip("/") for u in urls] if isinstance(urls, list) else []

    def _server_model(self) -> str | None:
        """The tokenizer (else model) path the first server reports on ``/model_info``, if any."""
        try:
            info = httpx.get(self.urls[0] + "/model_info", timeout=5.0).json()
            return info.get("tokenizer_path") or info.get("model_path")
        except (httpx.HTTPError, ValueError, AttributeError):
            return None

    def payload(self, input_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "no_stop_trim": True,
            **optional_sampling(params, seed_key="sampling_seed"),
        }
        body = {"input_ids": list(input_ids), "sampling_params": sp, "return_logprob": params.logprobs}
        if self.lora_name is not None:
            body["lora_path"] = self.lora_name  # SGLang takes the loaded adapter's NAME here
        return body

    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        if self.batch_window_s > 0 and self.max_batch > 1:
            key = id(asyncio.get_running_loop())
            if key not in self._batchers:
                self._batchers[key] = _MicroBatcher(self._generate_batch, self.max_batch, self.batch_window_s)
            return await self._batchers[key].submit(list(input_ids), params)
        self.posts += 1
        data = await self.post_json("/generate", self.payload(input_ids, params))
        return self.parse(data, len(input_ids), params)

    async def _generate_batch(self, items: list[tuple[list[int], SamplingParams]]) -> list[Completion]:
        """One ``/generate`` for several requests (see module docstring); one request goes as is."""
        self.posts += 1
        if len(items) == 1:
            ((ids, params),) = items
            return [self.parse(await self.post_json("/generate", self.payload(ids, params)), len(ids), params)]
        bodies = [self.payload(ids, params) for ids, params in items]
        batch: dict[str, Any] = {
            "input_ids": [b["input_ids"] for b in bodies],
            "sampling_params": [b["sampling_params"] for b in bodies],
            "return_logprob": [b["return_logprob"] for b in bodies],
        }
        if self.lora_name is not None:
            batch["lora_path"] = [self.lora_name] * len(items)
        data = await self.post_json("/generate", batch)
        if not isinstance(data, list) or len(data) != len(items):
            got = len(data) if isinstance(data, list) else type(data).__name__
            raise BackendError(f"a batched /generate of {len(items)} requests got {got} answers")
        return [self.parse(d, len(ids), params) for d, (ids, params) in zip(data, items, strict=True)]

    async def _sample_n(self, input_ids: list[int], params: SamplingParams, n: int) -> list[Completion]:
        """``n`` samples in one request (``sampling_params.n``); SGLang answers with a list."""
        payload = self.payload(input_ids, params)
        payload["sampling_params"]["n"] = n
        data = await self.post_json("/generate", payload)
        items = data if isinstance(data, list) else [data]
        if len(items) != n:
            raise BackendError(f"asked SGLang for n={n} samples, got {len(items)}")
        return [self.parse(item, len(input_ids), params) for item in items]

    def parse(self, data: dict[str, Any], n_prompt: int, params: SamplingParams) -> Completion:
        """One ``/generate`` response to a :class:`Completion` (see module docstring)."""
        if isinstance(data, list):
            data = data[0]
        meta = data.get("meta_info", {})
        fr = meta.get("finish_reason") or {}
        kind = fr.get("type")
        ids = list(data.get("output_ids") or [])
        matched = fr.get("matched")
        n_server = len(ids)
        if kind == "stop":
            reason = "stop"
            if isinstance(matched, str) and matched not in self.tokenizer.decode(ids):
                ids += self.tokenizer.encode(matched, add_special_tokens=False)
            elif isinstance(matched, int) and (not ids or ids[-1] != matched):
                ids.append(matched)  # 0.5.23 keeps the EOS / stop token in output_ids; older may not
        elif kind in ("length", "abort"):  # cut short: no stop matched
            reason, matched = kind, None
        else:
            raise BackendError(f"unexpected SGLang finish_reason {fr!r}")
        logprobs = None
        if params.logprobs and meta.get("output_token_logprobs"):
            logprobs = [float(x[0]) for x in meta["output_token_logprobs"]]
            logprobs += [0.0] * (len(ids) - len(logprobs))  # tokens we appended have no logprob
        return Completion(
            token_ids=ids,
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason=reason,  # type: ignore[arg-type]
            matched_stop=matched,
            logprobs=logprobs,
            prompt_tokens=int(meta.get("prompt_tokens", n_prompt)),
            weight_version=meta.get("weight_version"),
            meta={
                "message": fr.get("message", ""),
                "cached_tokens": meta.get("cached_tokens"),
                "restored_tokens": len(ids) - n_server,  # tokens added because the server dropped them
            },
        )

    def close(self) -> None:
        self._batchers.clear()
        super().close()

    def update_weights(self, update: WeightUpdate) -> None:
        """RL weight sync from disk: save the weights as a model directory under ``update.scratch``,
        ``POST /update_weights_from_disk {model_path, weight_version, flush_cache}`` on every server,
        then ``POST /flush_cache`` so no KV computed by the old weights is reused (the update's own
        ``flush_cache`` flag does the same; the explicit call also covers servers that ignore it).
        Only the newest copy is kept on disk.

        ``update.in_flight``: ``drain`` — SGLang's own behaviour: the update takes the server's
        model-update write lock, so it waits for the requests in flight and new ones wait for it;
        ``pause`` — ``POST /pause_generation {"mode": "retract"}`` first (running requests go back
        to the waiting queue with what they generated; nothing waits for them), then the update
        and the flush, then ``POST /continue_generation``: they go on from where they were, their
        KV recomputed by the new weights (SGLang's pause modes, ``PauseGenerationReqInput``)."""
        path = export_model_dir(update, self.name)
        with self.generation_paused(update.in_flight == "pause"):
            run_sync(self.update_weights_from_disk(str(path), str(update.version), flush_cache=True))
            for url in self.sync_urls():
                r = httpx.post(url + "/flush_cache", timeout=60.0)
                if r.status_code != 200:
                    raise BackendError(f"{url}/flush_cache failed ({r.status_code}): {r.text[:200]}")
        self.weight_version = str(update.version)
        prune_exports(update, path)

    @contextlib.contextmanager
    def generation_paused(self, pause: bool = True) -> Iterator[None]:
        """``pause``: every server's running requests are retracted to its queue, with what they
        generated, for the duration (``/pause_generation {"mode": "retract"}``), then continue
        (``/continue_generation``), their KV recomputed by whatever weights the server then has.
        Never leaves a server paused, even when the body fails. ``pause=False``: nothing."""
        if not pause:
            yield
            return
        paused: list[str] = []
        try:
            for url in self.sync_urls():
                self._post_ok(url, "/pause_generation", {"mode": "retract"})
                paused.append(url)
            yield
        finally:
            for url in paused:  # no CUDA call on resume: CPU servers have none
                self._post_ok(url, "/continue_generation", {"torch_empty_cache": False})

    def update_lora_adapter(self, path: str | Path, version: int) -> None:
        """RL weight sync for LoRA without merging: ``POST /load_lora_adapter {lora_name, lora_path}``
        (a peft adapter directory) on every server, switch rollouts to it (``/generate``'s
        ``lora_path``), flush the cache, then ``/unload_lora_adapter`` the previous one. The server
        must run with ``--enable-lora`` (and ``--max-lora-rank``/``--lora-target-modules`` to load
        adapters it did not start with)."""
        name = f"policy-v{version}"
        for url in self.sync_urls():
            self._post_ok(url, "/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        old, self.lora_name = self.lora_name, name
        for url in self.sync_urls():
            self._post_ok(url, "/flush_cache", None)
            if old is not None and old != name:
                self._post_ok(url, "/unload_lora_adapter", {"lora_name": old})
        self.weight_version = str(version)

    def init_weights_update_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> dict[str, Any]:
        """``POST /init_weights_update_group``: the server's workers join a process group with the
        trainer (ranks ``rank_offset`` + tp_rank of ``world_size``) at ``master_address:master_port``.
        Blocks until the trainer joins too, so call it from a thread. One server only."""
        if len(self.sync_urls()) != 1:
            raise NotImplementedError("distributed weight sync is implemented for one SGLang server (its TP ranks)")
        payload = {
            "master_address": master_address,
            "master_port": master_port,
            "rank_offset": rank_offset,
            "world_size": world_size,
            "group_name": group_name,
            "backend": backend,
        }
        return self._post_ok(self.sync_urls()[0], "/init_weights_update_group", payload)

    def update_weights_from_distributed(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], group_name: str, version: int
    ) -> dict[str, Any]:
        """``POST /update_weights_from_distributed``: the server receives each named tensor by a
        broadcast from the trainer (rank 0 of the group), in order. Blocks until every tensor has
        arrived, so call it from a thread while broadcasting."""
        payload = {
            "names": names,
            "dtypes": dtypes,
            "shapes": shapes,
            "group_name": group_name,
            "flush_cache": True,
            "weight_version": str(version),
        }
        return self._post_ok(self.sync_urls()[0], "/update_weights_from_distributed", payload)

    def begin_weight_update(self) -> None:
        """``POST /begin_weight_update``: SGLang 0.5.23 receives distributed weights only inside such a
        session ("must run between begin_weight_update() and end_weight_update()"); older servers
        lack the route (404) and need none."""
        self._post_session("/begin_weight_update")

    def end_weight_update(self) -> None:
        """``POST /end_weight_update``: close the session (post-load processing of the new weights)."""
        self._post_session("/end_weight_update")

    def _post_session(self, path: str) -> None:
        for url in self.sync_urls():
            r = self._sync_post(url, path, {})
            if r.status_code == 404:
                logger.debug("%s%s: not on this server; no weight-update session needed", url, path)
                continue
            if r.status_code != 200:
                raise BackendError(f"{url}{path} failed ({r.status_code}): {r.text[:300]}")

    def _post_ok(self, url: str, path: str, payload: dict[str, Any] | None) -> dict[str, Any]:
        r = self._sync_post(url, path, payload)
        ok_json = r.headers.get("content-type", "").startswith("application/json")
        body = r.json() if ok_json else {"text": r.text}
        if r.status_code != 200 or (isinstance(body, dict) and body.get("success") is False):
            raise BackendError(f"{url}{path} failed ({r.status_code}): {str(body)[:300]}")
        return body

    def _sync_post(self, url: str, path: str, payload: dict[str, Any] | None) -> httpx.Response:
        """A weight-sync route (pause, LoRA, session, distributed update): each waits up to
        ``sync_timeout`` (a pause or a session waits for the server's scheduler, a distributed
        update for every tensor); a transport failure is a BackendError naming the route."""
        try:
            return httpx.post(url + path, json=payload, timeout=self.sync_timeout)
        except httpx.HTTPError as e:
            raise BackendError(f"{url}{path}: {type(e).__name__} (sync_timeout {self.sync_timeout:g} s): {e}") from e

    async def update_weights_from_disk(self, model_path: str, weight_version: str, flush_cache: bool = True) -> dict:
        """RL weight sync: load a saved checkpoint into every server, tagged with a version. Waits
        up to ``sync_timeout`` seconds a server (a drain waits for the requests in flight)."""
        results = {}
        for u in self.sync_urls():
            payload = {"model_path": model_path, "weight_version": weight_version, "flush_cache": flush_cache}
            client, _ = self._client()
            try:
                r = await client.post(u + "/update_weights_from_disk", json=payload, timeout=self.sync_timeout)
            except httpx.HTTPError as e:
                raise BackendError(
                    f"{u}/update_weights_from_disk: {type(e).__name__} (sync_timeout {self.sync_timeout:g} s): {e}"
                ) from e
            body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {"text": r.text}
            if r.status_code != 200 or not body.get("success", False):
                raise BackendError(f"{u}/update_weights_from_disk failed ({r.status_code}): {body}")
            results[u] = body
        return results


class _MicroBatcher:
    """Collects requests on one event loop and sends them in batches through ``send``.

    A batch goes out when it holds ``max_batch`` requests, or ``window_s`` after its first request
    arrived, whichever comes first. Each caller gets its own completion; a failed POST fails every
    request of that batch with the same error (each item records it; the run goes on)."""

    def __init__(self, send: Any, max_batch: int, window_s: float) -> None:
        self.send = send
        self.max_batch = max_batch
        self.window_s = window_s
        self.pending: list[tuple[list[int], SamplingParams, asyncio.Future[Completion]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task[None]] = set()  # in flight (a reference, so none is collected)
        self.sizes: list[int] = []  # the size of every batch sent (tests, diagnostics)

    async def submit(self, input_ids: list[int], params: SamplingParams) -> Completion:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Completion] = loop.create_future()
        self.pending.append((input_ids, params, future))
        if len(self.pending) >= self.max_batch:
            self._flush()
        elif self.timer is None:
            self.timer = loop.call_later(self.window_s, self._flush)
        return await future

    def _flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        while self.pending:
            batch, self.pending = self.pending[: self.max_batch], self.pending[self.max_batch :]
            live = [b for b in batch if not b[2].done()]  # callers that gave up are not sent
            if live:
                self.sizes.append(len(live))
                task = asyncio.get_running_loop().create_task(self._send(live))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _send(self, batch: list[tuple[list[int], SamplingParams, asyncio.Future[Completion]]]) -> None:
        try:
            completions = await self.send([(ids, params) for ids, params, _ in batch])
        except Exception as e:  # every caller of this batch sees the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(e)
            return
        for (_, _, future), completion in zip(batch, completions, strict=True):
            if not future.done():
                future.set_result(completion)
