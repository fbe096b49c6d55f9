"""RL weight sync into a vLLM server (read from vLLM 0.32's own API server source).

What vLLM 0.32 offers an OpenAI-compatible server for RLHF, and what the harness uses:

- Full weights from disk (used): with ``VLLM_SERVER_DEV_MODE=1`` the server has ``/collective_rpc``,
  which calls a method on every worker. The workers (the CPU worker included: it subclasses the
  GPU one) have ``reload_weights(weights_path=...)``: it points the model config at the directory
  and loads its safetensors into the live parameters in place. Around it: ``/pause?mode=wait``
  (in-flight requests finish, new ones queue), ``/reset_prefix_cache`` (no KV computed by the old
  weights is reused; it answers ``success: false`` while blocks are held, so it is retried),
  ``/update_weight_version {new_version}`` (what ``/weight_info`` reports), ``/resume``.
- LoRA adapters (used): with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`` and ``--enable-lora
  --max-lora-rank R``, ``/v1/load_lora_adapter {lora_name, lora_path}`` loads a peft adapter
  directory and ``/v1/unload_lora_adapter {lora_name}`` drops one; a completions request names the
  adapter as its ``model``. Each version gets a new name (``policy-v<N>``), so vLLM's prefix cache,
  which keys blocks by adapter, cannot serve KV of an older adapter.
- In-memory transfer (NOT used): ``/init_weight_transfer_engine`` + ``/start_weight_update`` +
  ``/update_weights`` + ``/finish_weight_update`` with ``--weight-transfer-config`` (engines
  ``nccl``, ``ipc``, ...). These need CUDA (NCCL communicators, CUDA IPC handles), so nothing here
  can run them on this CPU machine; the disk path is the one implemented.

The completions API does not report the weight version per response (SGLang does), so the
client tags each completion with the version it last pushed: exact as long as rollouts do not
overlap a sync, which the trainer guarantees (it syncs between rollout batches).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.backends.base import BackendError, WeightUpdate, export_model_dir, prune_exports

logger = logging.getLogger(__name__)

DEV_MODE_HINT = (
    "start vLLM with VLLM_SERVER_DEV_MODE=1 in its environment (harness launches set it for training: "
    "backend.engine.env)"
)
LORA_HINT = "start vLLM with VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 in its environment and --enable-lora --max-lora-rank R"

# What a vLLM server that serves RL rollouts is started with (training.build.rollout_engine).
# The dev mode opens the weight-sync endpoints above. vLLM's default ``logprobs_mode`` is
# ``raw_logprobs``: the log-probs of the model's logits at temperature 1, whatever the request's
# temperature. The trainer scores softmax(logits / T), so the rollout correction's ratios
# and the logged ``mismatch/*`` need ``processed_logprobs``: the distribution each token was sampled
# from, after temperature and top-k/top-p (vllm/v1/sample/sampler.py). At T = 1 with no top-k/top-p,
# both modes give the same numbers. Greedy requests report the raw logits' log-probs in both.
RL_ENV = {"VLLM_SERVER_DEV_MODE": "1"}
RL_ARGS = ["--logprobs-mode", "processed_logprobs"]


class VLLMWeightSync:
    """Mixin for the ``openai`` backend: :meth:`update_weights` and :meth:`update_lora_adapter`
    against vLLM's RL endpoints (see the module docstring). Needs ``urls`` and ``headers``."""

    urls: list[str]
    headers: dict[str, str]
    weight_version: str | None = None
    lora_name: str | None = None  # the adapter rollouts name as their model, if any
    sync_timeout: float = 600.0  # a 7B reload from disk takes minutes

    def _vllm_post(
        self, url: str, path: str, body: dict[str, Any] | None = None, hint: str = "", params: dict | None = None
    ) -> Any:
        try:
            r = httpx.post(url + path, json=body, params=params, headers=self.headers, timeout=self.sync_timeout)
        except httpx.HTTPError as e:
            raise BackendError(f"{url}{path}: {type(e).__name__}: {e}") from e
        if r.status_code == 404 and hint and r.text.strip() == '{"detail":"Not Found"}':
            # FastAPI's answer for a route the server does not have (a 404 from the route itself,
            # e.g. "No adapter found for <path>", falls through to the general error below).
            raise BackendError(f"{url}{path} does not exist on this server: {hint}")
        if r.status_code != 200:
            raise BackendError(f"{url}{path} failed ({r.status_code}): {r.text[:300]}")
        if not r.content:
            return None
        try:
            return r.json()
        except ValueError:
            return r.text

    @contextmanager
    def _paused(self, url: str, mode: str = "wait"):
        """``/pause?mode=wait``: requests in flight finish, new ones wait until ``/resume``;
        ``mode=keep``: requests in flight stop where they are and continue after ``/resume``."""
        self._vllm_post(url, "/pause", hint=DEV_MODE_HINT, params={"mode": mode})
        try:
            yield
        finally:
            self._vllm_post(url, "/resume")

    def _reset_prefix_cache(self, url: str, tries: int = 20, running: bool = False) -> None:
        """``/reset_prefix_cache`` until it succeeds: it refuses while KV blocks are still held.
        ``running``: with requests frozen in place (``/pause?mode=keep``), preempt them too
        (``reset_running_requests=true``): they go back to the queue and recompute their KV
        under the new weights when resumed, as SGLang's retract does."""
        params = {"reset_running_requests": "true"} if running else None
        for i in range(tries):
            out = self._vllm_post(url, "/reset_prefix_cache", hint=DEV_MODE_HINT, params=params)
            if not isinstance(out, dict) or out.get("success", True):
                return
            time.sleep(min(0.1 * 2**i, 2.0))
        raise BackendError(f"{url}/reset_prefix_cache kept answering success=false ({tries} tries)")

    def update_weights(self, update: WeightUpdate) -> None:
        """Full weights from disk: save the model directory under ``update.scratch`` (or use
        ``update.weights`` when it is one), then on every server, paused: ``/collective_rpc``
        ``reload_weights(weights_path)``, ``/reset_prefix_cache``, ``/update_weight_version``.
        Rollouts go to the base model from now on (a LoRA adapter in use is dropped). Only the
        newest copy is kept on disk. ``update.in_flight``: ``drain`` pauses with ``mode=wait``
        (requests in flight finish on the old weights), ``pause`` with ``mode=keep`` and the
        running requests preempted at the cache reset (they go on from where they were, their KV
        recomputed by the new weights; the client tags them with the new version)."""
        path = export_model_dir(update, "vllm", explicit_head=True)
        version = str(update.version)
        mode = "keep" if update.in_flight == "pause" else "wait"
        for url in self.urls:
            with self._paused(url, mode):
                body = {"method": "reload_weights", "kwargs": {"weights_path": str(path.resolve())}}
                self._vllm_post(url, "/collective_rpc", body, hint=DEV_MODE_HINT)
                self._reset_prefix_cache(url, running=mode == "keep")
                self._vllm_post(url, "/update_weight_version", {"new_version": version}, hint=DEV_MODE_HINT)
        old, self.lora_name = self.lora_name, None
        if old is not None:
            for url in self.urls:
                self._vllm_post(url, "/v1/unload_lora_adapter", {"lora_name": old}, hint=LORA_HINT)
        self.weight_version = version
        prune_exports(update, path)
        logger.info("vLLM serves weights v%s from %s", version, path)

    def update_lora_adapter(self, path: str | Path, version: int) -> None:
        """Load the peft adapter directory ``path`` as ``policy-v<version>`` on every server, send
        rollouts to it, then unload the previous one. The base weights stay as they are."""
        name = f"policy-v{version}"
        for url in self.urls:
            body = {"lora_name": name, "lora_path": str(Path(path).resolve())}
            self._vllm_post(url, "/v1/load_lora_adapter", body, hint=LORA_HINT)
        old, self.lora_name = self.lora_name, name
        for url in self.urls:
            if old is not None and old != name:
                self._vllm_post(url, "/v1/unload_lora_adapter", {"lora_name": old}, hint=LORA_HINT)
            self._tag_version(url, str(version))
        self.weight_version = str(version)

    def _tag_version(self, url: str, version: str) -> None:
        """``/update_weight_version`` where the dev endpoints exist; adapters load without them."""
        try:
            self._vllm_post(url, "/update_weight_version", {"new_version": version})
        except BackendError as e:
            logger.debug("weight version not set on %s (%s); the client still tags completions", url, e)

    def server_weight_version(self, url: str | None = None) -> str | None:
        """What ``GET /weight_info`` reports (dev mode), else None."""
        try:
            r = httpx.get((url or self.urls[0]) + "/weight_info", headers=self.headers, timeout=10.0)
            return r.json().get("weight_version") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
