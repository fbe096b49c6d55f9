"""Deterministic epochs over a data set: the order every trainer draws its examples in.

Epoch ``e`` visits the indices ``0..n-1`` in the order ``random.Random(seed + e)`` shuffles them
to (or in order, without shuffling); the position is two integers, saved in checkpoints.
"""

from __future__ import annotations

import random


class EpochSampler:
    """Batches of indices into ``n`` items, reshuffled each epoch; its position is checkpointed."""

    def __init__(self, n: int, seed: int, shuffle: bool) -> None:
        self.n, self.seed, self.shuffle = n, seed, shuffle
        self.epoch, self.pos = 0, 0
        self.order = self._order()

    def _order(self) -> list[int]:
        idx = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        return idx

    def next(self, k: int) -> list[int]:
        """The next ``k`` indices, running into the next epoch when this one ends."""
        out: list[int] = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self.order = self._order()
            take = self.order[self.pos : self.pos + k - len(out)]
            out += take
            self.pos += len(take)
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, s: dict[str, int]) -> None:
        self.epoch, self.pos = s["epoch"], s["pos"]
        self.order = self._order()


def split_held_out(items: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, held-out): a seeded ``fraction`` held out, at least one item when there are two."""
    idx = list(range(len(items)))
    random.Random(seed).shuffle(idx)
    n_val = min(len(items) - 1, max(1, round(fraction * len(items)))) if fraction > 0 and len(items) > 1 else 0
    val = set(idx[:n_val])
    return [x for i, x in enumerate(items) if i not in val], [x for i, x in enumerate(items) if i in val]
