"""Goodness-of-fit helpers shared by the statistical tests."""
from __future__ import annotations

import numpy as np
from scipy.stats import chisquare

# A test fails when its p-value falls below this: with a handful of fixed-seed tests the chance of a false alarm is
# negligible, while a wrong residual or an off-by-one in acceptance moves p-values to ~1e-50 (see test_verify.py).
ALPHA = 1e-4


def chi_square_p(observed_counts, expected_probs, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test; cells expected below min_expected are pooled into one."""
    observed = np.asarray(observed_counts, dtype=float)
    expected = np.asarray(expected_probs, dtype=float)
    expected = expected / expected.sum() * observed.sum()
    if observed[expected == 0].any():
        return 0.0  # a token the target never emits was emitted: no statistics needed
    small = expected < min_expected
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue)
