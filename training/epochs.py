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
