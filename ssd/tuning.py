"""Choosing K (and B) for the machine: the draft length and budget that maximise predicted tokens per second.

The predictions combine the closed forms of ``ssd.theory`` with measured latencies, anything with the two curves of
a ``ssd.profile.Profile``: ``target_at(n)``, the ms of a verify pass over n tokens, and ``draft_at(n)``, the ms of a
draft forward over n rows (1: a one-token step; B: one depth of the pre-speculation tree).

- SD (Leviathan et al., Sec. 3): a round drafts K tokens and verifies K + 1 in one pass, and yields
  E = (1 - a^(K+1)) / (1 - a) tokens: K maximises E / (K draft_at(1) + target_at(K + 1)).
- SSD (Theorem 7): the hit rate a budget B buys follows from the outcome probabilities P(k) at acceptance rate a_p,
  the fan-out F_0..F_K a strategy gives B, and the miss rate's power law c F^(-r) (``ssd.outcomes.PowerLaw``);
  pre-speculation costs a glue step and K tree depths over B rows, a jit backup K one-token steps.

This is the choice logic alone: which K and B to run is still the caller's (issue 11 wires it into the loops).
"""
from __future__ import annotations

from dataclasses import dataclass

from .outcomes import PowerLaw, allocate, outcome_probabilities
from .theory import expected_tokens, theorem7_from_profile

SD_KS = (1, 2, 3, 4, 5, 6, 7, 8)
SSD_KS = (1, 2, 3, 4, 5, 6, 7, 8)
BUDGETS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Choice:
    """The best candidate and what it is predicted to give."""

    k: int
    budget: int | None  # None for SD
    tokens_per_s: float  # predicted decode tokens per second
    p_hit: float | None = None  # SSD: the predicted hit rate at this (K, B)


def _check_rate(value: float, name: str) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def _check_candidates(values, name: str) -> tuple[int, ...]:
    values = tuple(values)
    if not values or not all(isinstance(v, int) and v >= 1 for v in values):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
    return values


def sd_tokens_per_s(a: float, k: int, latencies) -> float:
    """SD's predicted decode tokens/s at draft length K and per-token acceptance rate a."""
    round_ms = k * latencies.draft_at(1) + latencies.target_at(k + 1)
    return expected_tokens(a, k) / round_ms * 1000


def choose_sd_k(a: float, latencies, ks=SD_KS) -> Choice:
    """The K of SD with the most predicted tokens per second (the smaller K on a tie)."""
    a, ks = _check_rate(a, "a (the acceptance rate)"), _check_candidates(ks, "ks")
    best = max(sorted(ks), key=lambda k: (sd_tokens_per_s(a, k, latencies), -k))
    return Choice(k=best, budget=None, tokens_per_s=sd_tokens_per_s(a, best, latencies))


def predicted_hit_rate(a_p: float, law: PowerLaw, k: int, budget: int, strategy: str = "geometric") -> float:
    """P(hit) = sum over outcomes k of P(k) (1 - miss(F_k)), with miss(F) = min(1, c F^(-r)) and miss(0) = 1."""
    fan_out = allocate(strategy, budget, k, a_p=a_p, r=law.r)
    return sum(p * (1.0 - min(1.0, law.c * f ** -law.r)) for p, f in zip(outcome_probabilities(k, a_p), fan_out)
               if f > 0)


def ssd_tokens_per_s(a_p: float, law: PowerLaw, k: int, budget: int, latencies, *, strategy: str = "geometric",
                     backup: str = "jit") -> tuple[float, float]:
    """SSD's predicted steady-state decode tokens/s at (K, B), and the hit rate behind it (Theorem 7)."""
    p_hit = predicted_hit_rate(a_p, law, k, budget, strategy)
    e = expected_tokens(a_p, k)  # a hit and a miss both yield a round of K drafted tokens
    predicted = theorem7_from_profile(latencies, k, budget, p_hit, e, e, backup)
    return predicted["profile_tokens_per_s"], p_hit


def choose_ssd_k_budget(a_p: float, law: PowerLaw, latencies, ks=SSD_KS, budgets=BUDGETS, *,
                        strategy: str = "geometric", backup: str = "jit") -> Choice:
    """The (K, B) of SSD with the most predicted tokens per second (the smaller K, then B, on a tie)."""
    a_p = _check_rate(a_p, "a_p (the acceptance rate)")
    ks, budgets = _check_candidates(ks, "ks"), _check_candidates(budgets, "budgets")
    scored = {(k, b): ssd_tokens_per_s(a_p, law, k, b, latencies, strategy=strategy, backup=backup)
              for k in sorted(ks) for b in sorted(budgets)}
    k, b = max(scored, key=lambda kb: (scored[kb][0], -kb[0], -kb[1]))
    return Choice(k=k, budget=b, tokens_per_s=scored[k, b][0], p_hit=scored[k, b][1])
