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
- Models whose cache is not a plain per-layer key/value cache (e.g. sliding-window layers) cannot
  have rows joined mid-decode: they fall back to batch-at-a-time (new rows wait for the batch),
  without prefix reuse.
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

import numpy as np

from harness.backends.base import BackendBase, BackendError, Completion, SamplingParams, WeightUpdate, find_stop
from harness.backends.dtype import choose_dtype
from harness.backends.hf_prefix import PrefixCache, common_prefix

logger = logging.getLogger(__name__)

# Requests admitted together are prefilled in a second round from another's KV only when that
# saves at least this many tokens each: a round costs a forward call (tens of ms on a CPU).
_MIN_SHARED = 16


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
    tokens: Any = None  # input_ids as a numpy int64 array [P] (prefix matching), set at admission
    cached: int = 0  # leading input tokens whose KV came from the prefix cache


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
        self._queue.put(_Request(list(input_ids), params, fut))
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
                closing = self._take_waiting(new, self.max_batch_size - state.live_count - len(new))
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
    yet in the cache). A finished row (``done``) may stay in the batch for a while, decoded but
    unread (see the module docstring); ``live_rows`` are the others.
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

    @property
    def live_rows(self) -> list[_Request]:
        """The rows still decoding."""
        return [r for r in self.rows if not r.done]

    @property
    def live_count(self) -> int:
        return sum(not r.done for r in self.rows)

    def _live(self) -> list[int]:
        """The batch indices of the rows still decoding."""
        return [j for j, r in enumerate(self.rows) if not r.done]

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
        for r in reqs:
            r.tokens = np.asarray(r.input_ids, dtype=np.int64)  # [P]
        for group in self._rounds(reqs):
            self._admit(group)

    def _rounds(self, reqs: list[_Request]) -> list[list[_Request]]:
        """Split an admission in two when requests in it share a prefix the cache does not hold:
        the first of each (the leaders) is prefilled first and its KV cached; the others follow
        from that KV in a second prefill. A GRPO group's identical prompts are prefilled once."""
        cache = self.b.prefix_cache
        if not self.b.reuses_prefixes or len(reqs) < 2:
            return [reqs] if reqs else []
        leaders: list[_Request] = []
        followers: list[_Request] = []
        for r in reqs:
            cap = len(r.input_ids) - 1  # the last input token is always run: its logits pick the first token
            _, hit = cache.match(r.tokens, touch=False)
            shared = max((common_prefix(lead.tokens, r.tokens) for lead in leaders), default=0)
            (followers if min(shared, cap) >= min(hit, cap) + _MIN_SHARED else leaders).append(r)
        return [leaders, followers] if followers else [leaders]

    def _admit(self, reqs: list[_Request]) -> None:
        """Prefill ``reqs`` together, pick their first tokens, and join the rows still going."""
        from harness.backends.hf_kv import grow_in_place

        torch, b = self.torch, self.b
        with torch.inference_mode():
            past, mask, next_pos, logits = self._prefill(reqs)
            b.continuous = b.continuous and _joinable(past)
            grow_in_place(past)  # decode steps then write their column in place, not torch.cat
            if b.reuses_prefixes:
                for i, r in enumerate(reqs):
                    if r.cached < len(r.input_ids):  # else the cache holds all of it already
                        b.prefix_cache.insert(r.tokens, _row_kv(past, i, len(r.input_ids)))
            self._pick(reqs, logits)
            keep = [j for j, r in enumerate(reqs) if not r.done]
            if not keep:
                return
            if len(keep) < len(reqs):
                sel = torch.tensor(keep, dtype=torch.long, device=mask.device)
                past.batch_select_indices(sel)
                mask, next_pos = mask[sel], next_pos[sel]
            reqs = [reqs[j] for j in keep]
            if not self.rows:
                self.rows, self.past, self.mask, self.next_pos = reqs, past, mask, next_pos
                return
            self._join(reqs, past, mask, next_pos)

    def _prefill(self, reqs: list[_Request]) -> tuple[Any, Any, Any, Any]:
        """Run the input of ``reqs`` through the model, each row from the longest prefix the
        cache holds of it. Returns the cache (rows right-aligned, left-padded), its mask [N, W],
        the next position ids [N, 1] and the last position's logits [N, V].

        A row with ``m`` cached tokens and ``s`` to compute sits as ``[pad | m cached | pad | s]``
        in the forward (cached prefixes right-aligned to the widest, M; suffixes to the longest,
        S); the columns are then gathered into ``[pad | m + s]`` so decoding never carries the
        holes."""
        torch, b = self.torch, self.b
        dev = b.device
        n = len(reqs)
        lens = [len(r.input_ids) for r in reqs]
        hits: list[Any] = []
        for r in reqs:
            entry, m = b.prefix_cache.match(r.tokens) if b.reuses_prefixes else (None, 0)
            r.cached = min(m, len(r.input_ids) - 1)
            hits.append(entry)
        ms = [r.cached for r in reqs]
        ss = [n_ - m for n_, m in zip(lens, ms, strict=True)]
        M, S = max(ms), max(ss)
        ids = torch.full((n, S), b.pad_id, dtype=torch.long)  # [N, S] suffixes, left-padded
        mask = torch.zeros((n, M + S), dtype=torch.long)  # [N, M+S]
        pos = torch.zeros((n, S), dtype=torch.long)  # [N, S] (pads: 0, masked out)
        for i, r in enumerate(reqs):
            m, s = ms[i], ss[i]
            ids[i, S - s :] = torch.from_numpy(r.tokens[m:])
            mask[i, M - m : M] = 1
            mask[i, M + S - s :] = 1
            pos[i, S - s :] = torch.arange(m, lens[i])
        kw: dict[str, Any] = {}
        if M:
            kw[_cache_kwarg(b.model)] = _prefix_past(hits, ms, M)
        keep_kw = _logits_kwarg(b.model)
        if keep_kw:
            kw[keep_kw] = 1  # only the last position's logits are read (the full [N, S, V] is large)
        out = b.model(
            input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=pos.to(dev), use_cache=True, **kw
        )
        past = _out_cache(out)
        mask = mask.to(dev)
        if M:
            mask = _compact(past, ms, ss, M, S, dev)
        b.prefill_computed += sum(ss)
        b.prefill_reused += sum(ms)
        next_pos = torch.tensor(lens, dtype=torch.long, device=dev).unsqueeze(1)  # [N, 1]
        return past, mask, next_pos, out.logits[:, -1, :]

    def recompute(self) -> None:
        """After a weight update that paused the running rows: run every row's cached tokens (its
        input and all it generated but the last pick, which the next step feeds) through the new
        weights, so no KV of the old weights is attended to. Positions and the pending token are
        unchanged; nothing is sampled. The update emptied the prefix cache, so nothing is reused."""
        from harness.backends.hf_kv import grow_in_place

        self._select(self._live())
        if not self.rows:
            return
        torch = self.torch
        again = []
        for r in self.rows:
            fed = [*r.input_ids, *r.out[:-1]]
            twin = _Request(input_ids=fed, params=r.params, future=r.future)  # r's own `cached` stays as reported
            twin.tokens = np.asarray(fed, dtype=np.int64)  # [P + G - 1]
            again.append(twin)
        with torch.inference_mode():
            past, mask, next_pos, _ = self._prefill(again)  # next_pos [A, 1]: P + G - 1, as before
            grow_in_place(past)
        self.past, self.mask, self.next_pos = past, mask, next_pos

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
            was_done = [r.done for r in self.rows]
            # A finished row's position stays put: it may already sit at the model's last one.
            grow: Any = 1
            if any(was_done):
                grow = torch.tensor([[0 if d else 1] for d in was_done], dtype=torch.long, device=dev)  # [A, 1]
            self.past, self.mask, self.next_pos = _out_cache(out), mask, self.next_pos + grow
            self._pick(self.rows, out.logits[:, -1, :])
            ended = [j for j, r in enumerate(self.rows) if r.done and not was_done[j]]
            if not ended:
                return
            if b.reuses_prefixes:
                for j in ended:
                    self._remember(j, self.rows[j])
            keep = self._live()
            if not keep:
                self.reset()
            elif not b.continuous or 2 * len(keep) <= len(self.rows):
                self._select(keep)  # no admission may come to rebuild the cache: compact it now
            else:
                self._trim()

    def _select(self, keep: list[int]) -> None:
        """Keep rows ``keep`` of the batch (and of its cache) and drop the others."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.reset()
            return
        sel = self.torch.tensor(keep, dtype=self.torch.long, device=self.mask.device)
        self.past.batch_select_indices(sel)
        self.mask, self.next_pos = self.mask[sel], self.next_pos[sel]
        self.rows = [self.rows[j] for j in keep]
        self._trim()

    def _remember(self, j: int, r: _Request) -> None:
        """Put finished row ``j``'s KV in the prefix cache: its input and generated tokens but the
        last pick (never fed back). Not a row a cancelled caller left, nor one that a paused weight
        update let run on (its KV was recomputed under the new weights, but a failed load leaves
        them unknown, so such rows are simply not kept)."""
        if r.future.cancelled() or r.versions != [self.b.weight_version] or len(r.out) < 2:
            return  # (one token generated: the cache holds its input already, from admission)
        n = len(r.input_ids) + len(r.out) - 1
        tokens = np.concatenate([r.tokens, np.asarray(r.out[:-1], dtype=np.int64)])  # [n]
        self.b.prefix_cache.insert(tokens, _row_kv(self.past, j, n))

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
            if r.done:  # finished earlier, still in the batch until it is rebuilt: its pick is not read
                continue
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
        """Rebuild the batch as the running rows still going, then the new rows (their cache,
        mask [N, Tn] and next positions [N, 1]): finished rows leave in the same copy."""
        from harness.backends.hf_kv import joined, row_runs

        torch, F = self.torch, self.torch.nn.functional
        keep = self._live()
        mine = self.mask[keep]  # [A, T0]
        owned = mine.any(0).nonzero()
        first = int(owned[0]) if len(owned) else mine.shape[1]  # leading columns no kept row owns go
        Ta, Tn = mine.shape[1] - first, mask.shape[1]
        T = max(Ta, Tn)
        runs = row_runs(keep)
        layers = self.past.layers
        for i, theirs in enumerate(past.layers):
            # keys/values [A0, H, T0, D] (rows `keep`, columns first:) and [N, H, Tn, D] → [A+N, H, T, D]
            layers[i] = joined(layers[i], first, runs, theirs, T)
        self.mask = torch.cat([F.pad(mine[:, first:], (T - Ta, 0)), F.pad(mask, (T - Tn, 0))])  # [A+N, T]
        self.next_pos = torch.cat([self.next_pos[keep], next_pos])  # [A+N, 1]
        self.rows = [self.rows[j] for j in keep] + reqs

    def _trim(self) -> None:
        """Drop leading cache columns no live row owns any more (left by rows that finished; a
        finished row still in the batch may lose its own: its output is not read)."""
        from harness.backends.hf_kv import GrowingLayer

        if not self.b.continuous:
            return
        live = self._live()
        owned = (self.mask[live] if len(live) < len(self.rows) else self.mask).any(0).nonzero()
        first = int(owned[0]) if len(owned) else 0
        if first == 0:
            return
        self.mask = self.mask[:, first:]
        for layer in self.past.layers:
            if isinstance(layer, GrowingLayer):
                layer.drop_front(first)  # keeps its buffer
            else:
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

    from harness.backends.hf_kv import GrowingLayer

    layers = getattr(past, "layers", None)
    return bool(layers) and all(type(layer) in (DynamicLayer, GrowingLayer) for layer in layers)


@functools.cache
def _logits_kwarg_of(cls: type) -> str | None:
    """The forward's name for "logits of the last n positions only": ``logits_to_keep``, before
    transformers 4.50 ``num_logits_to_keep``; None when it takes neither."""
    import inspect

    try:
        params = inspect.signature(cls.forward).parameters
    except (AttributeError, TypeError, ValueError):
        return None
    return next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in params), None)


def _logits_kwarg(model: Any) -> str | None:
    return _logits_kwarg_of(type(model))


def _joinable_config(config: Any) -> bool:
    """Whether the cache this config's model builds has plain per-layer key/value tensors (False
    for sliding-window layers); True when it cannot be told before a forward (``_joinable`` then)."""
    try:
        from transformers.cache_utils import DynamicCache

        return _joinable(DynamicCache(config=config))
    except Exception:  # older transformers, or a config the cache cannot read
        return True


def _prefix_past(entries: list[Any], ms: list[int], width: int) -> Any:
    """A cache of ``width`` columns holding, right-aligned in row ``i``, the first ``ms[i]``
    tokens of ``entries[i]``'s KV (the rest zeros, masked out)."""
    from transformers.cache_utils import DynamicCache

    ref = next(e.kv for e, m in zip(entries, ms, strict=True) if m)  # [layers, 2, H, P, D]
    n_layers, _, heads, _, dim = ref.shape
    kv = ref.new_zeros((n_layers, 2, len(ms), heads, width, dim))  # [layers, 2, N, H, width, D]
    for i, (e, m) in enumerate(zip(entries, ms, strict=True)):
        if m:
            kv[:, :, i, :, width - m :] = e.kv[:, :, :, :m]
    return DynamicCache(ddp_cache_data=[(kv[layer, 0], kv[layer, 1]) for layer in range(n_layers)])


def _compact(past: Any, ms: list[int], ss: list[int], M: int, S: int, dev: Any) -> Any:
    """Gather each row's columns ``[M-m, M)`` (cached) and ``[M+S-s, M+S)`` (just computed) to
    the right of a cache ``max(m+s)`` wide, in place; returns its mask [N, W]."""
    import torch

    n, width = len(ms), max(m + s for m, s in zip(ms, ss, strict=True))
    idx = torch.zeros((n, width), dtype=torch.long)  # [N, W] source column of each column (pads: 0)
    mask = torch.zeros((n, width), dtype=torch.long)  # [N, W]
    for i, (m, s) in enumerate(zip(ms, ss, strict=True)):
        idx[i, width - m - s :] = torch.cat([torch.arange(M - m, M), torch.arange(M + S - s, M + S)])
        mask[i, width - m - s :] = 1
    idx = idx.to(dev)
    for layer in past.layers:
        heads, dim = layer.keys.shape[1], layer.keys.shape[3]
        g = idx[:, None, :, None].expand(n, heads, width, dim)  # [N, H, W, D]
        layer.keys, layer.values = layer.keys.gather(2, g), layer.values.gather(2, g)
    return mask.to(dev)


def _row_kv(past: Any, i: int, n: int) -> Any:
    """Row ``i``'s last ``n`` cache columns as one new tensor [layers, 2, H, n, D] (a copy, so
    it does not keep the batch's cache alive)."""
    import torch

    return torch.stack([torch.stack((layer.keys[i, :, -n:], layer.values[i, :, -n:])) for layer in past.layers])
