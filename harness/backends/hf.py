"""``hf``: in-process transformers, with continuous batching of concurrent requests.

Callers ``await agenerate(...)`` from any number of asyncio tasks. A worker thread keeps one
running decode batch with a KV cache. At every step boundary it admits the requests that are
waiting (up to ``max_batch_size`` rows in all): their prompts are prefilled together, left-padded,
and their cache rows are joined to the running ones (the shorter side is padded on the left, with
the padding masked out). Each row stops on its own stop strings, on EOS, or at its own
``max_new_tokens``; its caller is answered the moment its row finishes. So a request never
waits for a batch to drain before it starts. A finished row stays in the batch, its output
unread, until the next admission rebuilds the cache with the rows still going and the new ones
(one copy of the cache), or until half the batch has finished: removing rows and joining rows
each copy the whole cache, and a step or two of a dead row costs less than a copy.

- Token-exact: every row has its own position ids and attention mask, so a row decodes as it
  would alone (greedy output is identical; logprobs agree up to float noise).
- Stop strings are matched on the decoded generated text after every step; the token that
  completes a stop string is kept whole (so the text may run a few characters past the stop).
- Greedy when ``temperature == 0``; else temperature / top-k / top-p sampling with a per-request
  seeded generator, so a sample is reproducible whatever it is batched with (up to float noise).
  A token is drawn by inverting the CDF at one uniform number (:func:`_draw`), not with
  ``torch.multinomial`` (one random number per vocabulary entry on the CPU).
- Logprobs are of the chosen token under the distribution it was sampled at: softmax(logits / T)
  for temperature T > 0, before top-k/top-p (SGLang's default, and what verl's trainer scores);
  the raw distribution for greedy requests. RL's behaviour-policy logprobs.
- Weights load from safetensors only; ``update_weights`` swaps in new weights for RL once the
  running rows have finished (admissions pause meanwhile), so a completion has one weight version;
  or, with ``WeightUpdate.in_flight == "pause"`` (asynchronous RL), at the next decode step: the
  running rows' KV is recomputed by the new weights from their input and the tokens they have
  generated, and they go on from there (AReaL's interruptible generation, which resubmits an
  interrupted request with its output so far to a server whose cache the update flushed; SGLang's
  ``retract`` and vLLM's ``keep`` pauses do the same). ``Completion.weight_version`` is then the
  newest; ``meta["weight_versions"]`` lists every version that sampled tokens of the row.
- Prefix reuse (:mod:`harness.backends.hf_prefix`): the KV of every admitted prompt and of every
  finished row is kept, within ``prefix_cache_tokens`` (least recently used out first), and a
  request whose input ids start with tokens already run prefills only the rest: the next turn of
  a trajectory (previous input + generated + observation tokens) or another sample of a GRPO
  group. Requests admitted together that share a long prefix (a group's identical prompts) are
  prefilled in two rounds: one of them first, then the others from its KV. A weight update
  empties the cache. ``prefill_computed`` / ``prefill_reused`` count the prompt tokens run
  through the model and taken from the cache; ``Completion.meta["cached_tokens"]`` says it per
  request.
- Prefill asks the model for the last position's logits only (``logits_to_keep=1``).
- Admission in lockstep (:mod:`harness.backends.lockstep`): while a collector holds
  :meth:`HFBackend.lockstep`, rows are admitted only at a boundary where every running client of
  it has its request waiting or decoding, in the order of the clients' keys, so which rows share
  a forward does not depend on timing and an RL run's rollouts reproduce run to run. Otherwise
  (evaluation, servers of many callers) whatever waits at the boundary is admitted, in arrival
  order.
- Models whose cache is not a plain per-layer key/value cache (e.g. sliding-window layers) cannot
  have rows joined mid-decode: they fall back to batch-at-a-time (new rows wait for the batch),
  without prefix reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, InvalidStateError
from typing import Any

from harness.backends.base import BackendBase, BackendError, Completion, SamplingParams, WeightUpdate, find_stop
from harness.backends.dtype import choose_dtype
from harness.backends.hf_batch import _fail, _joinable_config, _Request, _Running
from harness.backends.hf_prefix import PrefixCache
from harness.backends.lockstep import Lockstep, current_client

logger = logging.getLogger(__name__)

# How long a lockstep admission waits for a client between two requests before it admits what it
# has (and says so): only a client that never sends its request again (a bug) waits this long.
LOCKSTEP_PATIENCE_S = 120.0


class HFBackend(BackendBase):
    """In-process transformers backend (see module docstring).

    ``model``: the embedded model name, a local safetensors directory or a hub id.
    ``dtype``: torch dtype name, or ``auto`` (:func:`harness.backends.dtype.choose_dtype`).
    ``max_batch_size``: most requests decoded together.
    ``max_context``: prompt + generation limit (default: the config's max_position_embeddings).
    ``threads``: ``torch.set_num_threads`` (process-wide; one thread is often fastest on 2-core
    machines). ``seed``: base seed for sampled requests that bring none.
    ``model_obj``/``tokenizer``: an already built model (e.g. the trainer's policy) instead of a path.
    ``prefix_cache_tokens``: how many tokens of KV the prefix cache keeps (0: no reuse); see
    :class:`~harness.eval_config.BackendConfig` for the default's size.
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
        prefix_cache_tokens: int = 16384,
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
            dtype, why = choose_dtype(dtype)
            logger.info("hf backend generates in %s (%s)", dtype, why)
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
        # False when the model's cache does not support joining rows (known from its config, else
        # once a prefill shows it)
        self.continuous = _joinable_config(self.model.config)
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._gate: Lockstep | None = None  # set while a collector's clients run in lockstep
        self._held: list[_Request] = []  # taken from the queue, not admitted yet (lockstep: no room)
        self._worker = threading.Thread(target=self._run, name="hf-backend", daemon=True)
        self._worker.start()
        self.batches_run = 0  # admissions (prefills of the requests waiting at a step boundary)
        self.steps_run = 0  # decode steps of the running batch
        self.tokens_generated = 0  # tokens picked, over all rows (tokens_generated / steps_run ≈ rows a step)
        self.prefill_computed = 0  # prompt tokens run through the model at admission
        self.prefill_reused = 0  # prompt tokens whose KV came from the prefix cache instead

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
        self._queue.put(_Request(list(input_ids), params, fut, client=current_client()))
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join(timeout=30)
            if self.prefill_computed or self.prefill_reused:
                logger.info(
                    "hf prefill: %d prompt tokens computed, %d reused from the prefix cache (peak %d tokens held)",
                    self.prefill_computed,
                    self.prefill_reused,
                    self.prefix_cache.peak_tokens,
                )

    @contextlib.contextmanager
    def lockstep(self, clients: int, concurrency: int) -> Iterator[Lockstep]:
        """Admit the requests of ``clients`` coroutines (at most ``concurrency`` at once) in
        lockstep while the block runs: see :mod:`harness.backends.lockstep`. One collector at a time."""
        if self._gate is not None:
            raise BackendError("the hf backend is already running a collector in lockstep")
        gate = Lockstep(clients, concurrency)
        self._gate = gate
        try:
            yield gate
        finally:
            self._gate = None

    @classmethod
    def from_config(cls, cfg: Any) -> HFBackend:
        """From a :class:`~harness.eval_config.BackendConfig` (model, dtype, max_batch_size, threads,
        prefix_cache_tokens)."""
        return cls(
            model=cfg.model,
            dtype=cfg.dtype,
            max_batch_size=cfg.max_batch_size,
            threads=cfg.threads,
            prefix_cache_tokens=cfg.prefix_cache_tokens,
        )

    @property
    def reuses_prefixes(self) -> bool:
        """Whether the prefix cache is on (a budget, and a plain per-layer key/value cache)."""
        return self.prefix_cache.budget > 0 and self.continuous

    @property
    def device(self) -> Any:
        """Where the model's weights live (inputs are moved there; sampling stays on the CPU)."""
        return next(self.model.parameters()).device

    def to(self, device: Any) -> HFBackend:
        """Move the in-process model to ``device`` between batches (a trainer puts it on its engine's)."""
        with self._lock:
            self.model.to(device)
            self.prefix_cache.clear()  # its KV lives on the old device
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
            self.prefix_cache.clear()  # KV of the old weights (a failed load leaves the weights unknown too)
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
                    for r in self._held:  # taken before the close: answered, not left hanging
                        _fail(r, BackendError("the backend was closed"))
                    return
                new = []
                if not self._held:  # else requests wait already: the admission below takes them
                    first = self._queue.get()
                    if first is None:
                        return
                    new = [first]
                self._lock.acquire()  # held while any row runs (one weight version per completion)
                state = _Running(self)
            else:
                new = []
                if self._update_pending.is_set() and self._pause_rows:
                    self._yield_to_update(state.live_rows)
                    try:
                        state.recompute()
                    except Exception as e:
                        logger.exception("hf: recomputing %d paused rows failed", len(state.rows))
                        for r in state.rows:
                            _fail(r, e)
                        state.reset()
            joinable = self.continuous or not state.rows
            if joinable and not self._update_pending.is_set() and not closing:
                closing = self._take_waiting(new, self.max_batch_size - state.live_count - len(new), state.live_rows)
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
        lock, wait until the updater holds it, then wait for it back. Their KV is then stale:
        :meth:`_Running.recompute` runs it again."""
        self._paused_rows = list(rows)
        self._lock.release()
        while self._update_pending.is_set():  # cleared once the updater has the lock
            time.sleep(0.0005)
        self._lock.acquire()

    def _take_waiting(self, into: list[_Request], room: int, running: list[_Request]) -> bool:
        """Move up to ``room`` more waiting requests into ``into``; True when a close was asked for.
        In lockstep (``_gate``), first wait until every running client's request is waiting or
        among ``running``, then take them in the clients' order."""
        gate = self._gate
        if gate is None and not self._held:
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
        room += len(into)
        self._held += into
        into.clear()
        if room <= 0:  # a full batch admits nothing, whoever waits
            return False
        closing = self._hold_until_ready(gate, running)
        self._held.sort(key=lambda r: (r.client is None, r.client if r.client is not None else 0))
        into += self._held[:room]
        del self._held[:room]
        return closing

    def _hold_until_ready(self, gate: Lockstep | None, running: list[_Request]) -> bool:
        """Move queued requests to ``_held`` until, in lockstep, every running client has a
        request held or decoding (without a gate: until the queue is empty). True on close."""
        deadline = time.monotonic() + LOCKSTEP_PATIENCE_S
        while True:
            while True:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    return True
                self._held.append(nxt)
            if gate is None:
                return False
            ready = {r.client for r in self._held if r.client is not None}
            ready |= {r.client for r in running if r.client is not None}
            if len(ready) >= gate.running:
                return False
            if time.monotonic() > deadline:
                logger.warning(
                    "hf lockstep: %d of %d clients sent no request for %.0f s; admitting without them "
                    "(this step's batch depends on timing)",
                    gate.running - len(ready),
                    gate.running,
                    LOCKSTEP_PATIENCE_S,
                )
                return False
            try:  # a client between two requests: wait for it (or for a client to end)
                nxt = self._queue.get(timeout=0.002)
            except queue.Empty:
                continue
            if nxt is None:
                return True
            self._held.append(nxt)

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
        return _draw(torch, probs, r.generator)

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
            meta={
                "queue_s": r.queue_s,
                "cached_tokens": r.cached,
                **({"weight_versions": r.versions} if len(r.versions) > 1 else {}),
            },
        )
        try:
            r.future.set_result(comp)
        except InvalidStateError:  # cancelled by its caller meanwhile: nobody is waiting for it
            logger.debug("hf request cancelled before its result was ready")


def _draw(torch: Any, probs: Any, generator: Any) -> int:
    """One token drawn from ``probs`` [V] (non-negative, any positive sum) by inverting its CDF at
    one uniform number from ``generator``.

    Why not ``torch.multinomial``: on the CPU it draws one exponential number per vocabulary entry
    (49,152 for SmolLM2): 1.6 ms a draw against 0.07 ms here (one thread), and about a tenth of the
    decode thread's time in the demo's rollouts; this draws one. Same distribution; the CDF is
    summed in float64 so the rounding of 49k fp32 additions does not shift mass between tokens."""
    cdf = probs.double().cumsum(0)  # [V]
    u = torch.rand((), dtype=torch.float64, generator=generator)
    tok = int(torch.searchsorted(cdf, u * cdf[-1], right=True))  # first token whose CDF passes u * total
    if tok >= cdf.shape[0]:  # u * total rounded up to the total: the last token with mass
        tok = int(probs.nonzero()[-1])
    return tok
