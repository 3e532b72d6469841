"""Outcome prediction: how the budget B of cached outcomes is spread over positions, and which tokens fill them.

An outcome of a round is (k, t*): k drafted tokens accepted, t* the token the target appended. The fan-out F_k is
how many candidate tokens t the cache holds at position k (k = 0..K), with sum_k F_k = B. The candidates at
position k are the top-F_k tokens of the draft's distribution there, without the drafted token x_{k+1} for k < K
(a rejected token has zero residual mass, so it can never be the recovered token).

Strategies: ``uniform``; ``geometric`` (Theorem 12), F_k proportional to P(k)^(1/(1+r)) with P(k) = a_p^k (1 - a_p)
for k < K and P(K) = a_p^K; ``calibrated``: geometric with a_p and r estimated online by ``Calibrator``.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

STRATEGIES = ("uniform", "geometric", "calibrated")


def check_budget(budget: int) -> int:
    if not (isinstance(budget, int) and budget >= 0):
        raise ValueError(f"budget (B, the number of cached outcomes) must be an integer >= 0, got {budget!r}")
    return budget


def check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"fan_out_strategy must be one of {', '.join(STRATEGIES)}; got {strategy!r}")
    return strategy


def largest_remainder(total: int, weights) -> list[int]:
    """Integers proportional to weights that sum exactly to total (Hamilton's method; ties go to earlier positions)."""
    w = np.asarray(weights, dtype=float)
    if total == 0 or w.sum() <= 0:
        out = [0] * len(w)
        if total and len(w):
            out[0] = total  # no information at all: everything on position 0
        return out
    exact = total * w / w.sum()
    counts = np.floor(exact).astype(int)
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def uniform_fan_out(budget: int, k: int) -> list[int]:
    """B spread evenly over positions 0..K."""
    return largest_remainder(check_budget(budget), [1.0] * (k + 1))


def outcome_probabilities(k: int, a_p: float) -> list[float]:
    """P(k accepted) under a per-token acceptance rate a_p: a_p^k (1 - a_p) for k < K, a_p^K for k = K."""
    return [a_p**i * (1 - a_p) for i in range(k)] + [a_p**k]


def geometric_fan_out(budget: int, k: int, a_p: float, r: float) -> list[int]:
    """Theorem 12: F_k proportional to P(k)^(1/(1+r)), rounded so the sum is exactly B."""
    if not 0.0 <= a_p <= 1.0:
        raise ValueError(f"a_p (the acceptance rate) must lie in [0, 1], got {a_p}")
    if not r > 0:
        raise ValueError(f"r (the power-law exponent of the miss rate) must be > 0, got {r}")
    weights = [p ** (1 / (1 + r)) for p in outcome_probabilities(k, a_p)]
    return largest_remainder(check_budget(budget), weights)


@dataclass
class Calibrator:
    """Online estimates of a_p and r from the rounds seen so far, starting from a stated prior.

    a_p: the maximum-likelihood per-token acceptance rate of a truncated geometric, accepted / tested, where a round
    tests k + 1 drafted tokens if one was rejected and K if all were accepted (the drafted-token acceptance rate
    accepted / drafted is biased low: tokens after a rejection are never tested). The prior counts as
    `prior_weight` tested tokens.

    r: from the rank of each round's appended token t* among the candidates at its position. The miss rate at fan-out
    F is the fraction of ranks above F; a least-squares line of log miss rate against log F (F = 1..max_f) gives
    miss ~ c * F^(-r). Until `min_rounds` ranks are seen, r is the prior.
    """

    prior_a_p: float = 0.6
    prior_r: float = 0.5
    prior_weight: float = 8.0
    min_rounds: int = 8
    max_f: int = 32
    accepted: int = 0
    tested: int = 0
    ranks: list[int] = field(default_factory=list)

    def update(self, accepted: int, draft_len: int, rank: int | None) -> None:
        if draft_len == 0:
            return
        self.accepted += accepted
        self.tested += accepted + (1 if accepted < draft_len else 0)
        if rank is not None:
            self.ranks.append(rank)

    @property
    def a_p(self) -> float:
        return (self.accepted + self.prior_a_p * self.prior_weight) / (self.tested + self.prior_weight)

    @property
    def r(self) -> float:
        if len(self.ranks) < self.min_rounds:
            return self.prior_r
        fitted = fit_power_law(self.ranks, self.max_f)
        return fitted if fitted is not None else self.prior_r

    def allocate(self, budget: int, k: int) -> list[int]:
        return geometric_fan_out(budget, k, min(max(self.a_p, 0.0), 1.0), self.r)


def miss_rates(ranks, max_f: int) -> tuple[np.ndarray, np.ndarray]:
    """(F, miss rate at F) for F = 1..max_f: the fraction of outcomes whose token ranked beyond F."""
    ranks = np.asarray(ranks)
    f = np.arange(1, max_f + 1)
    return f, (ranks[None, :] > f[:, None]).mean(axis=1)


@dataclass(frozen=True)
class PowerLaw:
    """miss(F) ~ c F^(-r): the fraction of outcomes whose t* ranks beyond the fan-out F."""

    c: float
    r: float


def fit_miss_rate(ranks, max_f: int = 32) -> PowerLaw | None:
    """The power law of the miss rate, by least squares in log-log over the F in 1..max_f whose miss rate is still
    positive; None where fewer than two such F leave nothing to fit. ranks: 1-based; None or NaN (unranked) dropped."""
    ranks = [int(x) for x in ranks if x is not None and x == x]
    if not ranks:
        return None
    f, miss = miss_rates(ranks, max_f)
    keep = miss > 0
    if keep.sum() < 2:
        return None
    log_f, log_miss = np.log(f[keep]), np.log(miss[keep])
    slope, _ = np.polyfit(log_f, log_miss, 1)
    r = max(-float(slope), 1e-3)  # r must stay positive for Theorem 12
    return PowerLaw(c=float(np.exp(np.mean(log_miss + r * log_f))), r=r)  # c: the least-squares intercept for r


def fit_power_law(ranks, max_f: int = 32) -> float | None:
    """r of the miss rate's power law (``fit_miss_rate``), or None where there is nothing to fit."""
    fitted = fit_miss_rate(ranks, max_f)
    return fitted.r if fitted is not None else None


def allocate(strategy: str, budget: int, k: int, *, a_p: float = 0.6, r: float = 0.5, calibrator=None) -> list[int]:
    """The fan-out F_0..F_K of one round under a strategy."""
    check_strategy(strategy)
    if strategy == "uniform":
        return uniform_fan_out(budget, k)
    if strategy == "geometric":
        return geometric_fan_out(budget, k, a_p, r)
    return (calibrator or Calibrator(prior_a_p=a_p, prior_r=r)).allocate(budget, k)


def ranked(logits: torch.Tensor, exclude: int | None = None) -> torch.Tensor:
    """Token ids from most to least likely under the draft (ties by lower id), without `exclude`. Sorts the whole
    vocabulary: for analyses; the decoding loop needs only `candidates` and `rank_of`, which do not."""
    order = torch.sort(logits, descending=True, stable=True).indices
    return order[order != exclude] if exclude is not None else order


def candidates(logits: torch.Tensor, f: int, exclude: int | None = None) -> list[int]:
    """The top-f tokens at a position (ties by lower id, `exclude` left out): the t* values the cache prepares for.

    The first f of ``ranked(logits, exclude)``, found without sorting the vocabulary: every token at least as likely
    as the (f + 1)-th best is gathered (ascending ids), and only those are sorted, stably.
    """
    if f <= 0:
        return []
    n = min(f + (exclude is not None), logits.shape[-1])
    kth = torch.topk(logits, n).values[-1]
    ids = (logits >= kth).nonzero().squeeze(-1)  # [M] ascending ids, M >= n (more where the boundary value ties)
    ids = ids[torch.sort(logits[ids], descending=True, stable=True).indices]
    if exclude is not None:
        ids = ids[ids != exclude]
    return ids[:f].tolist()


def rank_of(token: int, logits: torch.Tensor, exclude: int | None = None) -> int:
    """1-based rank of token among the candidates: the outcome is a hit at fan-out F iff rank <= F.

    Its position in ``ranked(logits, exclude)``, counted without a sort: the tokens ahead of it are the more likely
    ones and the equally likely ones of lower id, less `exclude` if it is among them.
    """
    value = logits[token]
    ids = torch.arange(logits.shape[-1], device=logits.device)
    ahead = (logits > value) | ((logits == value) & (ids < token))
    if exclude is not None:
        ahead[exclude] = False
    return int(ahead.sum()) + 1
