"""Goodness-of-fit helpers shared by the statistical tests."""
from __future__ import annotations

import itertools

import numpy as np
import torch
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


def exact_target_distribution(pair, prompt, n_new, temperature):
    """P(x_1..x_n | prompt) under the target for every one of V^n continuations, by brute force (tiny V only)."""
    V = pair.vocab_size
    continuations = torch.tensor(list(itertools.product(range(V), repeat=n_new)))
    ids = torch.cat([torch.tensor(prompt).expand(len(continuations), -1), continuations], dim=1)
    with torch.inference_mode():
        logits = pair.target(input_ids=ids).logits[:, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, continuations[..., None]).squeeze(-1)
    return logp.sum(-1).exp()


def sequence_index(tokens, vocab_size) -> int:
    """The index of a continuation in exact_target_distribution's order."""
    index = 0
    for t in tokens:
        index = index * vocab_size + t
    return index
