"""The demo world's vocabulary: name syllables, place endings and word pools (v1's; v2 extends
them), and :class:`World`, which draws unique names from them with a seeded random generator."""

from __future__ import annotations

import random

SEED = 7

ONSETS = ["b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "br", "dr", "gr", "kl", "st", "th"]
VOWELS = ["a", "e", "i", "o", "u", "ei", "au", "oa"]
CODAS = ["", "n", "r", "l", "s", "th", "nd", "rk", "v"]
TOWN_ENDS = ["vik", "holm", "stad", "ford", "by", "mere", "wick", "dal"]
RIVER_ENDS = ["a", "e", "is", "on", "ach"]
PROVINCES = ["Northmarch", "Lowvale", "Ostrand", "Westerfell", "Carrowdeep"]
OCCUPATIONS = ["clockmaker", "engineer", "glassblower", "chemist", "shipwright", "weaver", "astronomer"]
THINGS = [
    "harp-clock",
    "steam loom",
    "tide gauge",
    "lantern press",
    "copper sextant",
    "wind organ",
    "salt kiln",
    "rope ladder-lift",
    "ice plough",
    "signal drum",
    "paper kite-sail",
    "brass abacus",
    "fog horn-bell",
    "peat stove",
    "river dredge",
    "spring lock",
]
INDUSTRIES = ["shipbuilding", "textile", "glassworks", "printing", "brewing", "instrument-making"]
PRODUCT_KINDS = [
    "barometer",
    "rowing boat",
    "wool blanket",
    "pocket compass",
    "ink set",
    "lamp oil",
    "fishing reel",
    "tea kettle",
    "weather vane",
    "sewing frame",
    "map case",
    "candle mould",
]


class World:
    """Unique names from syllables. ``register_full``: also refuse a town or river name that is
    already a word (or a word that is already a town or river), so no name reads as two entities;
    v1 was drawn without it and keeps its draws."""

    def __init__(
        self,
        seed: int = SEED,
        onsets: list[str] = ONSETS,
        vowels: list[str] = VOWELS,
        codas: list[str] = CODAS,
        town_ends: list[str] = TOWN_ENDS,
        used: set[str] | None = None,
        register_full: bool = False,
    ) -> None:
        self.rng = random.Random(seed)
        self.used: set[str] = set() if used is None else used
        self.onsets, self.vowels, self.codas, self.town_ends = onsets, vowels, codas, town_ends
        self.register_full = register_full

    def word(self, syllables: int) -> str:
        while True:
            w = "".join(
                self.rng.choice(self.onsets) + self.rng.choice(self.vowels) + self.rng.choice(self.codas)
                for _ in range(syllables)
            )
            if w not in self.used and 4 <= len(w) <= 10:
                self.used.add(w)
                return w.capitalize()

    def _place(self, ends: list[str]) -> str:
        while True:
            name = self.word(1) + self.rng.choice(ends)
            if not self.register_full:
                return name
            if name.lower() not in self.used:
                self.used.add(name.lower())
                return name

    def town(self) -> str:
        return self._place(self.town_ends)

    def river(self) -> str:
        return self._place(RIVER_ENDS)

    def person(self) -> str:
        return f"{self.word(1)} {self.word(2)}"
