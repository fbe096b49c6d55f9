"""What a process reward model scores of a prefix + step (shared by :mod:`training.prm.prm` and its
server, :mod:`training.prm.prm_server`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ScoringWindow:
    """What a PRM scores of a prefix + step: the EOS id appended (``append_eos``), then at most
    ``max_len`` tokens, the ``first`` (a tokenizer's right truncation: ProRAG's RL scoring,
    ``prorag/rl/trainer.py`` ``get_prm_score``, ``truncation=True, max_length=4096``, no EOS) or
    the ``last`` (the end, where the head reads)."""

    append_eos: bool = True
    max_len: int | None = None
    keep: Literal["first", "last"] = "last"

    def apply(self, seq: list[int], eos_id: int) -> list[int]:
        s = list(seq) + ([eos_id] if self.append_eos else [])
        if self.max_len is not None and len(s) > self.max_len:
            s = s[: self.max_len] if self.keep == "first" else s[-self.max_len :]
        return s
