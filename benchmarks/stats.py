"""Bootstrap statistics for leaderboards (pure numpy, fixed seeds, so reports are reproducible).

- :func:`bootstrap_ci`: percentile bootstrap of the mean over items. ``B`` resamples (default
  1000) of the N items with replacement, drawn as one ``[B, N]`` matrix of indices from
  ``numpy.random.default_rng(seed)`` (default seed 0); the 95% interval is the 2.5th and 97.5th
  percentiles of the B resampled means (numpy's default linear interpolation).
- :func:`paired_bootstrap`: the difference of two systems on the SAME items (the caller passes
  the values of the shared item ids, in the same order). Each resample draws item indices once
  and applies them to both systems (equivalently, to the per-item differences), so per-item
  correlation is kept and the interval is much tighter than two independent intervals. The
  difference is significant when its 95% interval excludes 0; ``p`` is a p-value-like fraction:
  twice the smaller share of resampled differences on either side of 0 (``<= 0`` and ``>= 0``),
  capped at 1. ``p_greater`` is the one-sided fraction for "A is higher than B": the share of
  resampled differences ``<= 0`` (what a claim that training improved a model is tested with).

Empty inputs give NaN intervals (and ``n == 0``) rather than raising: a run with no finished
items is shown as such in the report.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_B = 1000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class CI:
    """A mean over items and its bootstrap interval (same units as the values, e.g. 0..1)."""

    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class PairedDiff:
    """``mean(a) - mean(b)`` over the shared items, its bootstrap interval and p-like fraction."""

    diff: float
    low: float
    high: float
    p: float  # two-sided
    n: int  # shared items the difference is computed on
    p_greater: float = 1.0  # one-sided, for mean(a) > mean(b)

    @property
    def significant(self) -> bool:
        """The 95% interval of the difference excludes 0 (never with no shared items)."""
        return self.n > 0 and (self.low > 0 or self.high < 0)


def _resampled_means(x: np.ndarray, b: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(b, x.size))  # [B, N] item indices, with replacement
    return x[idx].mean(axis=1)  # [B]


def bootstrap_ci(values: Sequence[float], b: int = DEFAULT_B, seed: int = DEFAULT_SEED, alpha: float = 0.05) -> CI:
    """Percentile bootstrap interval of the mean of ``values`` (one value per item)."""
    x = np.asarray(values, dtype=float)  # [N]
    if x.size == 0:
        return CI(float("nan"), float("nan"), float("nan"))
    means = _resampled_means(x, b, seed)
    lo, hi = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return CI(float(x.mean()), float(lo), float(hi))


def paired_bootstrap(
    a: Sequence[float],
    b_values: Sequence[float],
    b: int = DEFAULT_B,
    seed: int = DEFAULT_SEED,
    alpha: float = 0.05,
) -> PairedDiff:
    """Paired bootstrap of ``mean(a) - mean(b_values)``; both hold the same items in the same order."""
    x = np.asarray(a, dtype=float)  # [N] system A on the shared items
    y = np.asarray(b_values, dtype=float)  # [N] system B on the same items, same order
    if x.shape != y.shape:
        raise ValueError(f"paired bootstrap needs the same items: {x.shape} vs {y.shape}")
    if x.size == 0:
        return PairedDiff(float("nan"), float("nan"), float("nan"), 1.0, 0)
    d = x - y  # [N]
    diffs = _resampled_means(d, b, seed)  # [B]
    lo, hi = np.percentile(diffs, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    at_most_0, at_least_0 = float((diffs <= 0).mean()), float((diffs >= 0).mean())
    p = min(1.0, 2 * min(at_most_0, at_least_0))
    return PairedDiff(float(d.mean()), float(lo), float(hi), p, int(d.size), p_greater=at_most_0)
