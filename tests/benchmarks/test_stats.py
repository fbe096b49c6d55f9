"""Bootstrap statistics checked against hand-computed values and an independent loop."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.stats import bootstrap_ci, paired_bootstrap


def test_constant_scores_have_zero_width_intervals():
    ci = bootstrap_ci([1.0, 1.0, 1.0, 1.0])
    assert (ci.mean, ci.low, ci.high) == (1.0, 1.0, 1.0)
    d = paired_bootstrap([1, 0, 1], [1, 0, 1])
    assert (d.diff, d.low, d.high, d.n) == (0.0, 0.0, 0.0, 3) and not d.significant and d.p == 1.0


def test_bootstrap_matches_an_independent_loop():
    values = [1, 0, 0, 1, 1, 0, 1, 1]
    ci = bootstrap_ci(values, b=200, seed=3)
    rng = np.random.default_rng(3)
    idx = rng.integers(0, len(values), size=(200, len(values)))
    means = sorted(sum(values[j] for j in row) / len(values) for row in idx)

    # numpy's default percentile: linear interpolation at rank q*(B-1)
    def perc(q):
        r = q * (len(means) - 1)
        lo = int(np.floor(r))
        return means[lo] + (means[min(lo + 1, len(means) - 1)] - means[lo]) * (r - lo)

    assert ci.mean == pytest.approx(5 / 8)
    assert ci.low == pytest.approx(perc(0.025)) and ci.high == pytest.approx(perc(0.975))


def test_two_items_by_hand():
    # Items {0, 1}: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4; with many
    # resamples the 2.5th percentile is 0 and the 97.5th is 1.
    ci = bootstrap_ci([0.0, 1.0], b=4000, seed=0)
    assert ci.mean == 0.5 and ci.low == 0.0 and ci.high == 1.0


def test_paired_difference_is_significant_when_one_system_always_wins():
    a = [1.0] * 30
    b = [0.0] * 10 + [1.0] * 20
    d = paired_bootstrap(a, b, b=500, seed=1)
    assert d.diff == pytest.approx(1 / 3) and d.low > 0 and d.significant and d.p == 0.0 and d.n == 30


def test_paired_needs_the_same_items():
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap([1, 0], [1])
    empty = paired_bootstrap([], [])
    assert empty.n == 0 and not empty.significant


def test_paired_bootstrap_matches_an_independent_loop():
    a = [1, 1, 0, 1, 0, 1, 1, 0]
    b = [0, 1, 0, 0, 1, 0, 1, 0]
    d = paired_bootstrap(a, b, b=300, seed=7)
    # Same generator, same call: one [B, N] matrix of item indices applied to both systems.
    idx = np.random.default_rng(7).integers(0, len(a), size=(300, len(a)))
    diffs = [sum(a[j] for j in row) / len(a) - sum(b[j] for j in row) / len(b) for row in idx]
    below = sum(x <= 0 for x in diffs) / 300
    above = sum(x >= 0 for x in diffs) / 300
    assert d.diff == pytest.approx((5 - 3) / 8) and d.n == 8
    assert d.low == pytest.approx(np.percentile(diffs, 2.5)) and d.high == pytest.approx(np.percentile(diffs, 97.5))
    assert d.p == pytest.approx(min(1.0, 2 * min(below, above)))
    assert d.p_greater == pytest.approx(below)  # one-sided: a higher than b
    assert not d.significant  # 3 wins and 1 loss among 8 items: the interval still reaches 0


def test_fixed_seed_is_reproducible_and_seed_matters():
    values = np.random.default_rng(123).random(50)
    assert bootstrap_ci(values, seed=0) == bootstrap_ci(values, seed=0)
    assert bootstrap_ci(values, seed=0) != bootstrap_ci(values, seed=1)
    empty = bootstrap_ci([])
    assert np.isnan(empty.mean) and np.isnan(empty.low)
