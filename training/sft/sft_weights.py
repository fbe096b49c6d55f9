"""Per-token weights of the SFT cross-entropy by tag (``sft.tag_weights``), as ProRAG's SFT does.

ProRAG (``prorag/sft/trainer.py``) adds its tags as special tokens and gives ``CrossEntropyLoss``
a class weight per tag token: ``<answer>``/``</answer>`` 5, ``<subquery>``/``</subquery>`` and
``<subanswer>``/``</subanswer>`` 3, ``</step>`` 2, everything else 1. With ``reduction="mean"``
the loss is Σ w·nll / Σ w over the trained tokens. Harness keeps the tokenizer as it is, so a tag
is a few ordinary tokens: every token of an occurrence of the tag's token sequence carries the
tag's weight (the sequence as the tokenizer encodes the tag alone; an occurrence that the
context tokenizes differently is not found and keeps weight 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def tag_id_weights(
    tokenizer: PreTrainedTokenizerBase, tag_weights: Mapping[str, float]
) -> list[tuple[list[int], float]]:
    """Each tag's token ids (``tokenizer.encode(tag)``, no special tokens) with its weight,
    longest first so that a longer tag wins where tags overlap (``</answer>`` over ``answer>``)."""
    pairs = []
    for tag, w in tag_weights.items():
        if not float(w) > 0:
            raise ValueError(f"sft.tag_weights[{tag!r}] must be > 0, got {w}")
        ids = tokenizer.encode(tag, add_special_tokens=False)
        if not ids:
            raise ValueError(f"sft.tag_weights: {tag!r} encodes to no tokens")
        pairs.append((list(ids), float(w)))
    return sorted(pairs, key=lambda p: -len(p[0]))


def token_weights(targets: torch.Tensor, tags: list[tuple[list[int], float]]) -> torch.Tensor:
    """The weight of every target token: its tag's weight inside an occurrence of a tag's ids,
    else 1; where tags overlap the longer one (listed first) wins. targets [B, T] long → [B, T]"""
    B, T = targets.shape
    w = torch.ones(B, T, dtype=torch.float32)  # [B, T]
    taken = torch.zeros(B, T, dtype=torch.bool)  # [B, T] inside an earlier (longer) tag
    for ids, weight in tags:
        n = len(ids)
        if n > T:
            continue
        windows = targets.unfold(1, n, 1)  # [B, T − n + 1, n]
        starts = (windows == torch.tensor(ids, dtype=targets.dtype)).all(-1)  # [B, T − n + 1]
        inside = torch.zeros(B, T, dtype=torch.bool)  # [B, T] tokens of an occurrence
        for k in range(n):
            inside[:, k : k + starts.shape[1]] |= starts
        inside &= ~taken
        w[inside] = weight
        taken |= inside
    return w


def weighted_token_mean(nll: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor, total: float) -> torch.Tensor:
    """Σ w·nll over the valid tokens / ``total`` (Σ w·mask over the whole step, so micro-batches
    add up to CrossEntropyLoss(weight=...)'s weighted mean).  [b, T], [b, T], [b, T] → scalar"""
    return (nll * mask * weights).sum() / total
