"""The ``hf`` backend's prefix KV cache: the keys and values of token sequences it has already
run, reused by a later request whose input ids start with the same tokens.

What it holds: the cache of every finished row (its input and generated tokens, all but the last
pick, which never entered the cache) and of every admitted prompt (so the other samples of a GRPO
group, admitted later or in the same batch, prefill only what differs). A sequence that extends
an entry replaces it: the next turn of a trajectory supersedes the turn before.

The KV of position ``t`` depends only on tokens ``0..t`` (causal attention, absolute RoPE
positions), so any prefix of an entry is the KV of that prefix: a request reuses the longest
common prefix it has with any entry, whatever came after it in the entry.

Bounded by a token budget (entries are evicted least recently used first; an entry larger than
the budget is not kept), and emptied by the backend when its weights change. Only the backend's
worker thread uses it, with the backend's lock held.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class PrefixEntry:
    """``tokens`` [P] (a numpy int64 array) and their ``kv`` [layers, 2 (key, value), heads, P, head_dim]."""

    tokens: Any
    kv: Any

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens two 1-D token arrays share (numpy: a few times faster than torch
    at these sizes, and every admission compares each request with every entry)."""
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class PrefixCache:
    """Token sequences and their KV, least recently used first out of ``budget`` tokens."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"prefix cache budget must be at least 0 tokens, got {budget}")
        self.budget = budget
        self._entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # oldest use first
        self._next_key = 0
        self.tokens = 0  # held now
        self.peak_tokens = 0  # most held at once (sizes the budget)
        self.evicted_tokens = 0  # dropped for room (not counting entries superseded by a longer one)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.tokens = 0

    def match(self, tokens: Any, touch: bool = True) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the most leading tokens with ``tokens`` [P], and how many it shares.

        ``touch``: count it as used (it moves to the back of the eviction order)."""
        best, best_n, best_key = None, 0, None
        for key, entry in self._entries.items():
            n = common_prefix(entry.tokens, tokens)
            if n > best_n:
                best, best_n, best_key = entry, n, key
        if touch and best_key is not None:
            self._entries.move_to_end(best_key)
        return best, best_n

    def insert(self, tokens: Any, kv: Any) -> None:
        """Keep ``kv`` [layers, 2, heads, P, head_dim] for ``tokens`` [P] (already a copy: not a
        view of a larger tensor, which it would keep alive)."""
        p = int(tokens.shape[0])
        if p == 0 or p > self.budget:
            return
        for key, entry in list(self._entries.items()):
            n = common_prefix(entry.tokens, tokens)
            if n == p:  # already held, within an entry as long or longer
                self._entries.move_to_end(key)
                return
            if n == len(entry):  # the new sequence extends this one: it takes its place
                self._drop(key)
        while self.tokens + p > self.budget:
            oldest = next(iter(self._entries))
            self.evicted_tokens += len(self._entries[oldest])
            self._drop(oldest)
        self._entries[self._next_key] = PrefixEntry(tokens, kv)
        self._next_key += 1
        self.tokens += p
        self.peak_tokens = max(self.peak_tokens, self.tokens)

    def _drop(self, key: int) -> None:
        self.tokens -= len(self._entries.pop(key))
