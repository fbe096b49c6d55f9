"""What a process reward model trains on (see :mod:`training.prm.prm`, which trains it): the MCTS
records read as training items (sibling pairs, or step records with their values) and the
registered ``prm.loss`` functions over them (:data:`PRM_LOSSES`). Light on purpose: a recipe's
``prm.loss`` is checked against this registry when the recipe loads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from harness.registry import Registry
from harness.textfiles import read_jsonl

logger = logging.getLogger(__name__)


# ---- data -------------------------------------------------------------------------------------
def _ids(segments: list[dict[str, Any]], where: str) -> list[int]:
    try:
        return [int(t) for s in segments for t in s["token_ids"]]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where}: segments need token_ids ({type(e).__name__}: {e})") from None


@dataclass(frozen=True)
class PairExample:
    chosen: list[int]  # prefix + chosen step (+ EOS)
    rejected: list[int]


@dataclass(frozen=True)
class PointExample:
    ids: list[int]
    value: float


def _records(paths: list[str], name: str) -> list[tuple[str, dict[str, Any]]]:
    """(``file:line``, record) of every line of ``name`` in each MCTS folder (or of each file)."""
    out = []
    for p in paths:
        path = Path(p) / name if Path(p).is_dir() else Path(p)
        if not path.exists():
            raise FileNotFoundError(f"prm.data: {path} does not exist (an MCTS output folder or its {name})")
        out += [(f"{path}:{i}", record) for i, record in read_jsonl(path)]
    return out


def load_pairs(paths: list[str], eos: int | None) -> list[PairExample]:
    """Contrastive pairs from MCTS ``pairs.jsonl`` files; errors name file and line."""
    tail = [eos] if eos is not None else []
    out = []
    for where, r in _records(paths, "pairs.jsonl"):
        try:
            prefix = _ids(r["prefix"], where)
            c, j = _ids(r["chosen"]["step"], where), _ids(r["rejected"]["step"], where)
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: not an MCTS pair record (missing {e})") from None
        out.append(PairExample(prefix + c + tail, prefix + j + tail))
    return out


def load_points(paths: list[str], eos: int | None) -> list[PointExample]:
    """Step records (value targets) from MCTS ``steps.jsonl`` files; errors name file and line."""
    tail = [eos] if eos is not None else []
    out = []
    for where, r in _records(paths, "steps.jsonl"):
        try:
            v = float(r["value"])
            ids = _ids(r["prefix"], where) + _ids(r["step"], where) + tail
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where}: not an MCTS step record ({type(e).__name__}: {e})") from None
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{where}: pointwise PRM targets must be in [0, 1], got value {v}")
        out.append(PointExample(ids, v))
    return out


def _lengths(item: Any) -> list[int]:
    return [len(item.chosen), len(item.rejected)] if isinstance(item, PairExample) else [len(item.ids)]


def fitting(items: list, max_len: int | None, too_long: str) -> list:
    """The items whose every sequence fits ``max_len`` when ``too_long`` is ``drop`` (TRL's
    RewardTrainer keeps a pair only if chosen and rejected both do); all of them for ``left`` (they
    are cut to their last ``max_len`` tokens when scored)."""
    if too_long == "left" or max_len is None:
        return items
    kept = [x for x in items if max(_lengths(x)) <= max_len]
    if len(kept) < len(items):
        logger.info(
            "prm.too_long=drop: %d of %d items longer than prm.max_len=%d left out",
            len(items) - len(kept),
            len(items),
            max_len,
        )
    return kept


def pairwise_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """Bradley–Terry: mean of −log σ(r_c − r_r) over pairs.  [P], [P] → []"""
    return -F.logsigmoid(chosen - rejected).mean()


def pointwise_loss(scores: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Binary cross-entropy of σ(r) against MCTS values in [0, 1].  [N], [N] → []"""
    return F.binary_cross_entropy_with_logits(scores, values)


@dataclass(frozen=True)
class PRMLoss:
    """A ``prm.loss``: what it trains on, and its loss on one micro-batch of those items.

    ``items(trainer, eos)``: the training items (eos: appended token id or None);
    ``batch(trainer, items)``: (mean loss [], pairs ranked right or None when it ranks none)."""

    what: str
    items: Callable[[Any, int | None], list]
    batch: Callable[[Any, list], tuple[torch.Tensor, float | None]]


def _pairwise_batch(trainer: Any, pairs: list[PairExample]) -> tuple[torch.Tensor, float | None]:
    s = trainer._scores([x.chosen for x in pairs] + [x.rejected for x in pairs])  # [2b]
    sc, sr = s[: len(pairs)], s[len(pairs) :]  # [b], [b]
    return pairwise_loss(sc, sr), float((sc > sr).sum())


def _pointwise_batch(trainer: Any, points: list[PointExample]) -> tuple[torch.Tensor, float | None]:
    s = trainer._scores([x.ids for x in points])  # [b]
    return pointwise_loss(s, torch.tensor([x.value for x in points], device=s.device)), None


# prm.loss → PRMLoss (ProRAG: pairwise, as TRL's RewardTrainer).
PRM_LOSSES: Registry[PRMLoss] = Registry("PRM loss")
PRM_LOSSES.register("pairwise", PRMLoss("training pairs", lambda t, eos: t.train_pairs, _pairwise_batch))
PRM_LOSSES.register(
    "pointwise", PRMLoss("step records", lambda t, eos: load_points(list(t.cfg.prm.data), eos), _pointwise_batch)
)
