"""The ``hf`` backend's decode KV cache layer: keys and values that grow in place.

transformers' :class:`~transformers.cache_utils.DynamicLayer` appends a decode step's key and
value with ``torch.cat``, which copies the whole cache every step: for 32 rows of 600 tokens of
SmolLM2-135M in fp32 (30 layers, 3 KV heads of 64) that is ~0.9 GB written per step, as much
time as the step's compute on a CPU. :class:`GrowingLayer` keeps each layer's keys and values
in a buffer with free columns on the right and hands the model views of the used columns: a
step writes its new column in place, and only a full buffer is copied (into one half as large
again, so the copies amortize to a few columns a step).

The layout stays the backend's: rows left-padded, every row's newest token in the last used
column. Anything outside the layer may still assign ``keys``/``values`` (the backend's prefill
compaction does): the layer notices that they are no longer its views and copies them into a new
buffer at its next update. Dropping leading columns (:meth:`GrowingLayer.drop_front`) and
selecting rows (``batch_select_indices``) keep the buffer. Joining rows (:func:`joined`) writes
the kept running rows and the new ones straight into one new buffer with free room: one copy of
the running cache per admission, where ``torch.cat`` of padded parts and the reallocation at the
next step made three.

Imported lazily (it subclasses a transformers class), like the rest of the backend's use of torch.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

# Free columns a (re)allocated buffer gets at least: a fresh buffer after prefill or a row join
# then runs this many decode steps before it is copied again.
MIN_ROOM = 64


class GrowingLayer(DynamicLayer):
    """A :class:`DynamicLayer` whose ``keys``/``values`` [B, H, T, D] are views of columns
    ``[start, end)`` of buffers [B, H, C, D]; ``update`` writes new columns at ``end``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._kbuf: torch.Tensor | None = None  # [B, H, C, D]
        self._vbuf: torch.Tensor | None = None  # [B, H, C, D]
        self._start = 0
        self._end = 0
        self._kview: torch.Tensor | None = None  # the views last handed out (to tell outside assignments)
        self._vview: torch.Tensor | None = None

    @classmethod
    def of(cls, layer: DynamicLayer) -> GrowingLayer:
        """A growing layer holding ``layer``'s keys and values (not copied until its first update)."""
        new = cls()
        new.is_initialized = layer.is_initialized
        if layer.is_initialized:
            new.device = layer.device
            new.keys, new.values = layer.keys, layer.values
        return new

    @property
    def capacity(self) -> int:
        """Columns the buffer holds (0 before the first update)."""
        return 0 if self._kbuf is None else int(self._kbuf.shape[2])

    @classmethod
    def holding(cls, kbuf: torch.Tensor, vbuf: torch.Tensor, used: int) -> GrowingLayer:
        """A layer whose buffers are ``kbuf``/``vbuf`` [B, H, C, D], columns ``[0, used)`` in use."""
        new = cls()
        new.is_initialized, new.device = True, kbuf.device
        new._kbuf, new._vbuf, new._start, new._end = kbuf, vbuf, 0, used
        new._publish()
        return new

    def _owns(self) -> bool:
        return self._kbuf is not None and self.keys is self._kview and self.values is self._vview

    def _publish(self) -> None:
        assert self._kbuf is not None and self._vbuf is not None
        self.keys = self._kview = self._kbuf[:, :, self._start : self._end]
        self.values = self._vview = self._vbuf[:, :, self._start : self._end]

    def _reallocate(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Copy the current keys/values into new buffers with room for ``key_states`` [B, H, q, D]
        and half as many columns again as they will then hold (at least ``MIN_ROOM``)."""
        k, v = self.keys, self.values
        used = int(k.shape[2]) if k is not None and k.dim() == 4 else 0  # 0: lazily initialized, empty
        b, h, q, _ = key_states.shape
        cap = used + q + max(MIN_ROOM, (used + q) // 2)
        self._kbuf = key_states.new_empty((b, h, cap, key_states.shape[3]))
        self._vbuf = value_states.new_empty((b, h, cap, value_states.shape[3]))
        if used:
            self._kbuf[:, :, :used] = k
            self._vbuf[:, :, :used] = v
        self._start, self._end = 0, used

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``key_states``/``value_states`` [B, H, q, D] in place; the views of all columns."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = int(key_states.shape[2])
        if (
            not self._owns() or self._end + q > self.capacity or self._kbuf.shape[0] != key_states.shape[0]  # type: ignore[union-attr]
        ):
            self._reallocate(key_states, value_states)
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf[:, :, self._end : self._end + q] = key_states
        self._vbuf[:, :, self._end : self._end + q] = value_states
        self._end += q
        self._publish()
        return self.keys, self.values

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` columns (no row owns them any more), without a copy."""
        if n <= 0:
            return
        if self._owns():
            self._start += n
            self._publish()
        else:
            self.keys, self.values = self.keys[:, :, n:], self.values[:, :, n:]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep rows ``indices``: one copy of their used columns and the free room after them."""
        if self.get_seq_length() == 0:
            return
        if not self._owns():
            super().batch_select_indices(indices)
            return
        assert self._kbuf is not None and self._vbuf is not None
        self._kbuf = self._kbuf[indices, :, self._start :]
        self._vbuf = self._vbuf[indices, :, self._start :]
        self._end -= self._start
        self._start = 0
        self._publish()

    def reset(self) -> None:
        self._kbuf = self._vbuf = self._kview = self._vview = None
        self._start = self._end = 0
        super().reset()


def grow_in_place(past: Any) -> None:
    """Make every plain :class:`DynamicLayer` of cache ``past`` a :class:`GrowingLayer`, keeping
    its keys and values (other layer types, e.g. sliding-window ones, are left as they are)."""
    layers = past.layers
    for i, layer in enumerate(layers):
        if type(layer) is DynamicLayer:
            layers[i] = GrowingLayer.of(layer)


def row_runs(rows: list[int]) -> list[tuple[int, int, int]]:
    """``rows`` (increasing batch indices) as runs ``(first, end, at)``: rows ``[first, end)``
    go to rows ``[at, at + end - first)`` of a batch holding ``rows`` in order (one slice copy a
    run instead of an indexed gather and a second copy)."""
    runs: list[tuple[int, int, int]] = []
    for at, j in enumerate(rows):
        if runs and runs[-1][1] == j:
            first, _, start = runs[-1]
            runs[-1] = (first, j + 1, start)
        else:
            runs.append((j, j + 1, at))
    return runs


def joined(mine: Any, first: int, runs: list[tuple[int, int, int]], theirs: Any, width: int) -> GrowingLayer:
    """One layer holding rows ``runs`` of layer ``mine`` (from column ``first`` on) and then every
    row of layer ``theirs``, each side right-aligned in ``width`` columns with zeros on its left,
    in new buffers with free room (``MIN_ROOM`` columns at least) for the next decode steps.

    Zeros, not whatever memory held: the pad columns are masked out, but a masked score times a
    NaN value would still be NaN."""
    a = sum(end - start for start, end, _ in runs)
    mk, mv, tk, tv = mine.keys, mine.values, theirs.keys, theirs.values  # [A0, H, Ta0, D], [N, H, Tn, D]
    n, heads, tn, dim = tk.shape
    ta = int(mk.shape[2]) - first
    cap = width + max(MIN_ROOM, width // 2)
    kbuf = tk.new_empty((a + n, heads, cap, dim))  # [A+N, H, C, D]
    vbuf = tv.new_empty((a + n, heads, cap, dim))
    for buf, src, new in ((kbuf, mk, tk), (vbuf, mv, tv)):
        if width > ta:
            buf[:a, :, : width - ta].zero_()
        if width > tn:
            buf[a:, :, : width - tn].zero_()
        for start, end, at in runs:
            buf[at : at + end - start, :, width - ta : width].copy_(src[start:end, :, first:])
        buf[a:, :, width - tn : width].copy_(new)
    return GrowingLayer.holding(kbuf, vbuf, width)
