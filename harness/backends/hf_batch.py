"""The hf backend's running decode batch: admission (prefill, in rounds that share a prefix),
the decode step, the join of new rows into the KV cache, and the cache helpers they use.

:class:`~harness.backends.hf.HFBackend` owns the request queue, the worker thread, sampling and
finishing; :class:`_Running` owns the rows being decoded together and their cache (layout in
:mod:`harness.backends.hf_kv`, reuse in :mod:`harness.backends.hf_prefix`). See the module
docstring of :mod:`harness.backends.hf` for the behaviour they give together.
"""

from __future__ import annotations

import functools
import time
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.backends.base import BackendError, SamplingParams
from harness.backends.hf_prefix import common_prefix

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
    client: Any = None  # the lockstep key of the coroutine that sent it (harness.backends.lockstep)


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

    def __init__(self, backend: Any) -> None:  # the HFBackend that owns it (hf imports this module)
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
