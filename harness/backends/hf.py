"""``hf``: in-process transformers, with continuous batching of concurrent requests.

Callers ``await agenerate(...)`` from any number of asyncio tasks. A worker thread keeps one
running decode batch with a KV cache. At every step boundary it admits the requests that are
waiting (up to ``max_batch_size`` rows in all): their prompts are prefilled together, left-padded,
and their cache rows are joined to the running ones (the shorter side is padded on the left, with
the padding masked out). Each row stops on its own stop strings, on EOS, or at its own
``max_new_tokens``; its caller is answered the moment its row finishes, and the row leaves the
batch and its cache. So a request never waits for a batch to drain before it starts.

- Token-exact: every row has its own position ids and attention mask, so a row decodes as it
  would alone (greedy output is identical; logprobs agree up to float noise).
- Stop strings are matched on the decoded generated text after every step; the token that
  completes a stop string is kept whole (so the text may run a few characters past the stop).
- Greedy when ``temperature == 0``; else temperature / top-k / top-p sampling with a per-request
  seeded generator, so a sample is reproducible whatever it is batched with (up to float noise).
- Logprobs are of the chosen token under the distribution it was sampled at: softmax(logits / T)
  for temperature T > 0, before top-k/top-p (SGLang's default, and what verl's trainer scores);
  the raw distribution for greedy requests. RL's behaviour-policy logprobs.
- Weights load from safetensors only; ``update_weights`` swaps in new weights for RL once the
  running rows have finished (admissions pause meanwhile), so a completion has one weight version;
  or, with ``WeightUpdate.in_flight == "pause"`` (asynchronous RL), at the next decode step: the
  running rows keep their KV cache and go on under the new weights (``Completion.weight_version``
  is then the newest; ``meta["weight_versions"]`` lists every version that wrote the row).
- Models whose cache is not a plain per-layer key/value cache (e.g. sliding-window layers) cannot
  have rows joined mid-decode: they fall back to batch-at-a-time (new rows wait for the batch).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
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
    budget: int = 0  # most tokens this row may generate (max_new_tokens, cut to the context)
    queued_at: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # waited before its prefill (reported in Completion.meta["queue_s"])
    versions: list[str] = field(default_factory=list)  # weight versions that decoded this row


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
        self._lock = threading.Lock()  # held while any row runs; update_weights waits for it
        self._update_pending = threading.Event()  # set while update_weights waits: admit nothing new
        self._pause_rows = False  # the pending update lands at the next decode step (in_flight="pause")
        self._paused_rows: list[_Request] = []  # the rows a paused update lands under
        self.continuous = True  # False once a model's cache turns out not to support joining rows
        self._worker = threading.Thread(target=self._run, name="hf-backend", daemon=True)
        self._worker.start()
        self.batches_run = 0  # admissions (prefills of the requests waiting at a step boundary)
        self.steps_run = 0  # decode steps of the running batch
        self.tokens_generated = 0  # tokens picked, over all rows (tokens_generated / steps_run ≈ rows a step)

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
        self._pause_rows = update.in_flight == "pause"
        self._update_pending.set()
        try:
            self._lock.acquire()
        finally:
            self._update_pending.clear()
        try:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            real_missing = [k for k in missing if "lm_head" not in k]  # tied embeddings are saved once
            if real_missing or unexpected:
                raise BackendError(
                    f"weights do not fit the model: missing {real_missing[:5]}, unexpected {unexpected[:5]}"
                )
            self.model.tie_weights()
            self.weight_version = str(update.version)
            for r in self._paused_rows:
                r.versions.append(self.weight_version)
        finally:
            self._paused_rows = []
            self._lock.release()

    # ---- worker --------------------------------------------------------------------------
    def _run(self) -> None:
        """Continuous batching: admit waiting requests at every step boundary, decode one step."""
        state: _Running | None = None
        closing = False
        while True:
            if state is None or not state.rows:
                if state is not None:
                    state = None
                    self._lock.release()  # idle: a pending weight update may run now
                if closing:
                    return
                first = self._queue.get()
                if first is None:
                    return
                self._lock.acquire()  # held while any row runs (one weight version per completion)
                state = _Running(self)
                new = [first]
            else:
                new = []
                if self._update_pending.is_set() and self._pause_rows:
                    self._yield_to_update(state.rows)
            joinable = self.continuous or not state.rows
            if joinable and not self._update_pending.is_set() and not closing:
                closing = self._take_waiting(new, self.max_batch_size - len(state.rows) - len(new))
            try:
                new = [r for r in new if not r.future.cancelled()]  # callers that gave up while queued
                if new:
                    self.batches_run += 1  # counted before prefill: callers wake as soon as their rows finish
                    state.admit(new)
                if state.rows:
                    state.step()
            except Exception as e:  # answer every waiting caller; the worker lives on
                logger.exception("hf decode of %d rows failed", len(state.rows) + len(new))
                for r in [*state.rows, *new]:
                    _fail(r, e)
                state.reset()

    def _yield_to_update(self, rows: list[_Request]) -> None:
        """Between two decode steps, let a pending ``in_flight="pause"`` update load: release the
        lock, wait until the updater holds it, then wait for it back. The rows keep their cache."""
        self._paused_rows = list(rows)
        self._lock.release()
        while self._update_pending.is_set():  # cleared once the updater has the lock
            time.sleep(0.0005)
        self._lock.acquire()

    def _take_waiting(self, into: list[_Request], room: int) -> bool:
        """Move up to ``room`` waiting requests into ``into``; True when a close was asked for."""
        while room > 0:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                return False
            if nxt is None:
                return True
            into.append(nxt)
            room -= 1
        return False

    def _decode(self, batch: list[_Request]) -> None:
        """Run ``batch`` to completion with no admissions (the caller holds ``_lock``)."""
        state = _Running(self)
        state.admit(batch)
        while state.rows:
            state.step()

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
            meta={"queue_s": r.queue_s, **({"weight_versions": r.versions} if len(r.versions) > 1 else {})},
        )
        try:
            r.future.set_result(comp)
        except InvalidStateError:  # cancelled by its caller meanwhile: nobody is waiting for it
            logger.debug("hf request cancelled before its result was ready")


def _fail(r: _Request, e: Exception) -> None:
    if not r.future.done():
        try:
            r.future.set_exception(BackendError(f"hf generation failed: {type(e).__name__}: {e}"))
        except InvalidStateError:
            pass  # cancelled meanwhile


class _Running:
    """The rows being decoded together and their KV cache.

    ``rows`` is in the order of the cache's batch dimension. Every row's newest token sits in the
    last column (rows are left-padded); ``mask`` [A, T] marks the cache columns a row owns, and
    ``next_pos`` [A, 1] is the position id of the token each row feeds next (its last pick, not
    yet in the cache).
    """

    def __init__(self, backend: HFBackend) -> None:
        self.b = backend
        self.torch = backend.torch
        self.reset()

    def reset(self) -> None:
        self.rows: list[_Request] = []
        self.past: Any = None
        self.mask: Any = None
        self.next_pos: Any = None

    def admit(self, reqs: list[_Request]) -> None:
        """Prefill ``reqs`` together, pick their first tokens, and join the rows still going."""
        torch, b = self.torch, self.b
        now = time.perf_counter()
        for i, r in enumerate(reqs):
            r.queue_s = now - r.queued_at
            r.versions = [b.weight_version]
            r.budget = min(r.params.max_new_tokens, b.max_context - len(r.input_ids))
            if r.params.temperature > 0:
                r.generator = torch.Generator().manual_seed(r.params.seed if r.params.seed is not None else b.seed + i)
        empty = [r for r in reqs if r.budget <= 0]
        for r in empty:
            b._finish(r, "length", None)
        reqs = [r for r in reqs if r.budget > 0]
        if not reqs:
            return
        lens = [len(r.input_ids) for r in reqs]
        L = max(lens)
        ids = torch.full((len(reqs), L), b.pad_id, dtype=torch.long)  # [N, L] left-padded
        mask = torch.zeros((len(reqs), L), dtype=torch.long)  # [N, L]
        for i, r in enumerate(reqs):
            ids[i, L - lens[i] :] = torch.tensor(r.input_ids)
            mask[i, L - lens[i] :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # [N, L]
        dev = b.device
        ids, mask, pos = ids.to(dev), mask.to(dev), pos.to(dev)
        with torch.inference_mode():
            out = b.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
            self._pick(reqs, out.logits[:, -1, :])
            keep = [j for j, r in enumerate(reqs) if not r.done]
            if not keep:
                return
            past, next_pos = _out_cache(out), pos[:, -1:] + 1  # [N, 1]
            if len(keep) < len(reqs):
                sel = torch.tensor(keep, dtype=torch.long, device=dev)
                past.batch_select_indices(sel)
                mask, next_pos = mask[sel], next_pos[sel]
            reqs = [reqs[j] for j in keep]
            if not self.rows:
                self.rows, self.past, self.mask, self.next_pos = reqs, past, mask, next_pos
                b.continuous = b.continuous and _joinable(past)
                return
            self._join(reqs, past, mask, next_pos)

    def step(self) -> None:
        """One decode step of every running row; finished rows leave the batch and the cache."""
        torch, b = self.torch, self.b
        dev = self.mask.device
        with torch.inference_mode():
            step_ids = torch.tensor([[r.out[-1]] for r in self.rows], dtype=torch.long, device=dev)  # [A, 1]
            ones = torch.ones((len(self.rows), 1), dtype=self.mask.dtype, device=dev)  # [A, 1]
            mask = torch.cat([self.mask, ones], dim=1)  # [A, T+1]
            out = b.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=self.next_pos,
                use_cache=True,
                **{_cache_kwarg(b.model): self.past},
            )
            b.steps_run += 1
            self.past, self.mask, self.next_pos = _out_cache(out), mask, self.next_pos + 1
            self._pick(self.rows, out.logits[:, -1, :])
            keep = [j for j, r in enumerate(self.rows) if not r.done]
            if len(keep) == len(self.rows):
                return
            if not keep:
                self.reset()
                return
            sel = torch.tensor(keep, dtype=torch.long, device=dev)
            self.past.batch_select_indices(sel)
            self.mask, self.next_pos = self.mask[sel], self.next_pos[sel]
            self.rows = [self.rows[j] for j in keep]
            self._trim()

    def _pick(self, rows: list[_Request], logits: Any) -> None:
        """Choose each row's next token from its logits [A, V] and finish the rows that are done.

        Sampled on the CPU with each request's CPU generator: the same draws on any device."""
        logits = logits.float().cpu()  # [A, V]
        logp = None
        # Evaluation does not ask for logprobs: skip the [A, V] log-softmax when no row wants one.
        if any(r.params.logprobs for r in rows):
            temps = self.torch.tensor([r.params.temperature if r.params.temperature > 0 else 1.0 for r in rows])  # [A]
            logp = self.torch.log_softmax(logits / temps.unsqueeze(1), dim=-1)  # [A, V], at each row's temperature
        for j, r in enumerate(rows):
            if r.future.cancelled():  # its caller gave up (e.g. a timeout): stop spending on it
                r.done = True
                continue
            tok = self.b._pick(logits[j], r)
            self.b.tokens_generated += 1
            r.out.append(tok)
            if logp is not None and r.params.logprobs:
                r.logprobs.append(float(logp[j, tok]))
            self.b._maybe_finish(r, tok, r.budget)

    def _join(self, reqs: list[_Request], past: Any, mask: Any, next_pos: Any) -> None:
        """Append new rows (their cache, mask, next positions) to the running ones."""
        torch, F = self.torch, self.torch.nn.functional
        Ta, Tn = self.mask.shape[1], mask.shape[1]
        T = max(Ta, Tn)
        for mine, theirs in zip(self.past.layers, past.layers, strict=True):
            # keys/values [A, H, Ta, D] and [N, H, Tn, D] → [A+N, H, T, D], padded on the left
            mine.keys = torch.cat([F.pad(mine.keys, (0, 0, T - Ta, 0)), F.pad(theirs.keys, (0, 0, T - Tn, 0))])
            mine.values = torch.cat([F.pad(mine.values, (0, 0, T - Ta, 0)), F.pad(theirs.values, (0, 0, T - Tn, 0))])
        self.mask = torch.cat([F.pad(self.mask, (T - Ta, 0)), F.pad(mask, (T - Tn, 0))])  # [A+N, T]
        self.next_pos = torch.cat([self.next_pos, next_pos])  # [A+N, 1]
        self.rows = self.rows + reqs

    def _trim(self) -> None:
        """Drop leading cache columns no row owns any more (left by rows that left)."""
        if not self.b.continuous:
            return
        owned = self.mask.any(0).nonzero()
        first = int(owned[0]) if len(owned) else 0
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.past.layers:
            layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]


def _cache_kwarg(model: Any) -> str:
    """The forward's name for the KV cache: ``cache`` since transformers 5.x renamed it (the old
    ``past_key_values`` still works there but warns on every call), ``past_key_values`` before."""
    return _cache_kwarg_of(type(model))


@functools.cache
def _cache_kwarg_of(cls: type) -> str:  # once per model class: a decode step calls it
    import inspect

    try:
        params = inspect.signature(cls.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def _out_cache(out: Any) -> Any:
    """The KV cache a forward returned (``cache``, or ``past_key_values`` before transformers 5.x)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _joinable(past: Any) -> bool:
    """Whether rows can be joined to this cache (plain per-layer key/value tensors)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(past, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)
