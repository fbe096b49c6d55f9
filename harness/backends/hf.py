"""``hf``: in-process transformers, with dynamic batching of concurrent requests.

Callers ``await agenerate(...)`` from any number of asyncio tasks. A worker thread takes every
request that is waiting (up to ``max_batch_size``), left-pads them into one batch and runs its
own decode loop with a KV cache. Each row stops on its own stop strings, on EOS, or at its own
``max_new_tokens``; its caller is answered the moment its row finishes, while requests that
arrive meanwhile form the next batch. So a short request is not held by a long one beyond the
batch it shares.

- Stop strings are matched on the decoded generated text after every step; the token that
  completes a stop string is kept whole (so the text may run a few characters past the stop).
- Greedy when ``temperature == 0``; else temperature / top-k / top-p sampling with a per-request
  seeded generator, so a sample is reproducible whatever it is batched with (up to float noise).
- Logprobs are of the chosen token under the model's raw distribution (temperature 1, before
  top-k/top-p), the quantity RL losses need.
- Weights load from safetensors only; ``update_weights`` swaps in new weights for RL.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from harness.backends.base import BackendBase, BackendError, Completion, SamplingParams, WeightUpdate, find_stop

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    input_ids: list[int]
    params: SamplingParams
    future: Future
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    generator: Any = None
    done: bool = False


class HFBackend(BackendBase):
    """In-process transformers backend (see module docstring).

    ``model``: the embedded model name, a local safetensors directory or a hub id.
    ``dtype``: torch dtype name. ``max_batch_size``: most requests decoded together.
    ``max_context``: prompt + generation limit (default: the config's max_position_embeddings).
    ``threads``: ``torch.set_num_threads`` (process-wide; one thread is often fastest on 2-core
    machines). ``seed``: base seed for sampled requests that bring none.
    ``model_obj``/``tokenizer``: an already built model (e.g. the trainer's policy) instead of a path.
    """

    name = "hf"

    def __init__(
        self,
        model: str = "smollm2-135m-instruct",
        dtype: str = "float32",
        max_batch_size: int = 8,
        max_context: int | None = None,
        threads: int | None = None,
        seed: int = 0,
        model_obj: Any = None,
        tokenizer: Any = None,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from harness.models import hub_hint, load_tokenizer, resolve_model

        if threads:
            # Process-wide: left alone unless asked, since a trainer in the same process shares it.
            torch.set_num_threads(threads)
        self.torch = torch
        if model_obj is not None:
            self.model, self.model_path = model_obj, getattr(model_obj, "name_or_path", None)
            self.tokenizer = tokenizer
        else:
            self.model_path = resolve_model(model)
            self.tokenizer = tokenizer or load_tokenizer(self.model_path)
            try:
                # safetensors only: never unpickle a checkpoint (torch.load runs arbitrary code).
                self.model = AutoModelForCausalLM.from_pretrained(
                    self.model_path, dtype=getattr(torch, dtype), use_safetensors=True
                )
            except OSError as e:
                raise hub_hint(model, e) from e
        self.model.eval()
        self.max_batch_size = max_batch_size
        self.max_context = max_context or int(getattr(self.model.config, "max_position_embeddings", 2048))
        self.seed = seed
        self.weight_version = "0"
        self.eos_ids = self._eos_ids()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()  # held while a batch runs; update_weights waits for it
        self._worker = threading.Thread(target=self._run, name="hf-backend", daemon=True)
        self._worker.start()
        self.batches_run = 0

    def _eos_ids(self) -> list[int]:
        ids: list[int] = []
        for src in (getattr(self.model, "generation_config", None), self.model.config):
            eos = getattr(src, "eos_token_id", None) if src is not None else None
            ids += eos if isinstance(eos, list) else [eos] if eos is not None else []
        if self.tokenizer.eos_token_id is not None:
            ids.append(self.tokenizer.eos_token_id)
        return sorted(set(ids)) or [0]

    # ---- protocol ------------------------------------------------------------------------
    async def agenerate(self, input_ids: list[int], params: SamplingParams) -> Completion:
        if not input_ids:
            raise BackendError("empty prompt")
        if len(input_ids) >= self.max_context:
            raise BackendError(f"prompt of {len(input_ids)} tokens does not fit the context of {self.max_context}")
        fut: Future = Future()
        self._queue.put(_Request(list(input_ids), params, fut))
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join(timeout=30)

    @classmethod
    def from_config(cls, cfg: Any) -> HFBackend:
        """From a :class:`~harness.eval_config.BackendConfig` (model, dtype, max_batch_size, threads)."""
        return cls(model=cfg.model, dtype=cfg.dtype, max_batch_size=cfg.max_batch_size, threads=cfg.threads)

    @property
    def device(self) -> Any:
        """Where the model's weights live (inputs are moved there; sampling stays on the CPU)."""
        return next(self.model.parameters()).device

    def to(self, device: Any) -> HFBackend:
        """Move the in-process model to ``device`` between batches (a trainer puts it on its engine's)."""
        with self._lock:
            self.model.to(device)
        return self

    def update_weights(self, update: WeightUpdate) -> None:
        """Load new weights (a state dict, or a safetensors file or directory) between batches."""
        from pathlib import Path

        weights = update.weights
        if isinstance(weights, str | Path):
            from safetensors.torch import load_file

            p = Path(weights)
            files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
            state: dict[str, Any] = {}
            for f in files:
                state.update(load_file(str(f)))
        else:
            state = weights
        with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            real_missing = [k for k in missing if "lm_head" not in k]  # tied embeddings are saved once
            if real_missing or unexpected:
                raise BackendError(
                    f"weights do not fit the model: missing {real_missing[:5]}, unexpected {unexpected[:5]}"
                )
            self.model.tie_weights()
            self.weight_version = str(update.version)

    # ---- worker --------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self.max_batch_size:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    self._queue.put(None)
                    break
                batch.append(nxt)
            batch = [r for r in batch if not r.future.cancelled()]  # callers that gave up while queued
            if not batch:
                continue
            try:
                with self._lock:
                    # Counted before decoding: callers wake as soon as their futures are set.
                    self.batches_run += 1
                    self._decode(batch)
            except Exception as e:  # answer every waiting caller; the worker lives on
                logger.exception("hf batch of %d failed", len(batch))
                for r in batch:
                    if not r.future.done():
                        try:
                            r.future.set_exception(BackendError(f"hf generation failed: {type(e).__name__}: {e}"))
                        except InvalidStateError:
                            pass  # cancelled meanwhile

    def _decode(self, batch: list[_Request]) -> None:
        torch = self.torch
        B = len(batch)
        lens = [len(r.input_ids) for r in batch]
        L = max(lens)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)  # [B, L] left-padded
        mask = torch.zeros((B, L), dtype=torch.long)  # [B, L]
        for i, r in enumerate(batch):
            ids[i, L - lens[i] :] = torch.tensor(r.input_ids)
            mask[i, L - lens[i] :] = 1
            if r.params.temperature > 0:
                r.generator = torch.Generator().manual_seed(
                    r.params.seed if r.params.seed is not None else self.seed + i
                )
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, L]
        budget = [min(r.params.max_new_tokens, self.max_context - lens[i]) for i, r in enumerate(batch)]
        past = None
        # Rows of the batch still generating, in the order of the KV cache's batch dimension. A
        # finished row is dropped from the cache, so the rows left run at a smaller batch's cost.
        active = list(range(B))
        dev = self.device
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        step_ids, step_pos = ids, pos
        with torch.inference_mode():
            for _ in range(max(budget)):
                out = self.model(
                    input_ids=step_ids, attention_mask=mask, position_ids=step_pos, past_key_values=past, use_cache=True
                )
                past = out.past_key_values
                # Sampled on the CPU with each request's CPU generator: the same draws on any device.
                logits = out.logits[:, -1, :].float().cpu()  # [A, V]
                logp = torch.log_softmax(logits, dim=-1)  # [A, V]
                for j, i in enumerate(active):
                    r = batch[i]
                    if r.future.cancelled():  # its caller gave up (e.g. a timeout): stop spending on it
                        r.done = True
                        continue
                    tok = self._pick(logits[j], r)
                    r.out.append(tok)
                    r.logprobs.append(float(logp[j, tok]))
                    self._maybe_finish(r, tok, budget[i])
                keep = [j for j, i in enumerate(active) if not batch[i].done]
                if not keep:
                    break
                if len(keep) < len(active):
                    sel = torch.tensor(keep, dtype=torch.long, device=dev)
                    past.batch_select_indices(sel)
                    mask, step_pos = mask[sel], step_pos[sel]
                    active = [active[j] for j in keep]
                step_ids = torch.tensor([[batch[i].out[-1]] for i in active], dtype=torch.long, device=dev)  # [A, 1]
                step_pos = step_pos[:, -1:] + 1  # [A, 1]
                mask = torch.cat([mask, torch.ones((len(active), 1), dtype=mask.dtype, device=dev)], dim=1)  # [A, L+t]
        for r in batch:
            if not r.done:  # budget exhausted without a stop
                self._finish(r, "length", None)

    def _pick(self, logits: Any, r: _Request) -> int:
        torch = self.torch
        p = r.params
        if p.temperature <= 0:
            return int(torch.argmax(logits))
        scaled = logits / p.temperature  # [V]
        if p.top_k and p.top_k > 0:
            kth = torch.topk(scaled, min(p.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)  # [V]
        if p.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = sorted_p.cumsum(0) - sorted_p < p.top_p
            filtered = torch.zeros_like(probs)
            filtered[order[keep]] = probs[order[keep]]
            probs = filtered / filtered.sum()
        return int(torch.multinomial(probs, 1, generator=r.generator))

    def _maybe_finish(self, r: _Request, tok: int, budget: int) -> None:
        if tok in self.eos_ids or tok in r.params.stop_token_ids:
            self._finish(r, "stop", tok)
            return
        if r.params.stop:
            # Only the tail can hold a stop string that the last token completed.
            tail_tokens = max(len(s) for s in r.params.stop) + 4
            tail = self.tokenizer.decode(r.out[-tail_tokens:], skip_special_tokens=False)
            hit = find_stop(tail, r.params.stop)
            if hit is not None:
                self._finish(r, "stop", hit[1])
                return
        if len(r.out) >= budget:
            self._finish(r, "length", None)

    def _finish(self, r: _Request, reason: str, matched: str | int | None) -> None:
        r.done = True
        text = self.tokenizer.decode(r.out, skip_special_tokens=True)
        comp = Completion(
            token_ids=list(r.out),
            text=text,
            finish_reason=reason,  # type: ignore[arg-type]
            matched_stop=matched,
            logprobs=list(r.logprobs) if r.params.logprobs else None,
            prompt_tokens=len(r.input_ids),
            weight_version=self.weight_version,
        )
        try:
            r.future.set_result(comp)
        except InvalidStateError:  # cancelled by its caller meanwhile: nobody is waiting for it
            logger.debug("hf request cancelled before its result was ready")
