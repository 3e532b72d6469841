"""Outcome prediction: how the budget B of cached outcomes is spread over positions, and which tokens fill them.

An outcome of a round is (k, t*): k drafted tokens accepted, t* the token the target appended. The fan-out F_k is
how many candidate tokens t the cache holds at position k (k = 0..K), with sum_k F_k = B. The candidates at
position k are the top-F_k tokens of the draft's distribution there, without the drafted token x_{k+1} for k < K
(a rejected token has zero residual mass, so it can never be the recovered token).

Strategies: ``uniform``; ``geometric`` (Theorem 12), F_k proportional to P(k)^(1/(1+r)) with P(k) = a_p^k (1 - a_p)
for k < K and P(K) = a_p^K; ``calibrated``: each candidate in turn goes to the position where it adds the most
expected hits, P(k) (miss_k(F_k) - miss_k(F_k + 1)), with a_p and the miss rates learnt online by ``Calibrator``.

The miss rate differs by kind of position (``KINDS``): at the bonus position (all K accepted) t* is the target's
next token after text the draft agreed with, and the draft's top few candidates nearly always hold it; at a
recovered position (a rejection) t* comes from the residual distribution, where the draft was wrong, and it ranks far
lower (on 32 HumanEval prompts: F = 1 misses 9% of bonus tokens but 53% of recovered ones). One law over both
over-serves the bonus position and starves the others (at B = 16 it lost to uniform in the first sweep);
calibrated keeps one estimate per kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..checks import check_budget, check_strategy

KINDS = ("recovered", "bonus")  # positions k < K, where a drafted token was rejected, and k = K, all accepted


def position_kind(k: int, draft_len: int) -> str:
    """The kind of position an outcome with k of draft_len tokens accepted sits at."""
    return "bonus" if k == draft_len else "recovered"


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


@dataclass(frozen=True)
class MissModel:
    """The miss rate at fan-out F = 0, 1, .. per kind of position: the chance that t* is not among the top F
    candidates (1 at F = 0; the last value holds beyond the table)."""

    recovered: tuple[float, ...]
    bonus: tuple[float, ...]

    def at(self, kind: str, f: int) -> float:
        table = getattr(self, kind)
        return table[min(f, len(table) - 1)]

    @classmethod
    def from_law(cls, law: "PowerLaw", max_f: int = 64) -> "MissModel":
        """The same power law at both kinds of position."""
        table = tuple(law.miss(f) for f in range(max_f + 1))
        return cls(recovered=table, bonus=table)


def marginal_fan_out(budget: int, k: int, a_p: float, model: MissModel) -> list[int]:
    """F_0..F_K built one candidate at a time, each where it adds the most expected hits: position j gains
    P(j) (miss_j(F_j) - miss_j(F_j + 1)) from one more (the earlier position on a tie). With miss rates that fall
    ever more slowly in F this greedy order is the allocation of the most expected hits."""
    if not 0.0 <= a_p <= 1.0:
        raise ValueError(f"a_p (the acceptance rate) must lie in [0, 1], got {a_p}")
    probs = outcome_probabilities(k, a_p)
    kinds = [position_kind(j, k) for j in range(k + 1)]
    f = [0] * (k + 1)
    for _ in range(check_budget(budget)):
        gains = [probs[j] * (model.at(kinds[j], f[j]) - model.at(kinds[j], f[j] + 1)) for j in range(k + 1)]
        f[max(range(k + 1), key=lambda j: (gains[j], -j))] += 1
    return f


@dataclass
class Calibrator:
    """Online estimates of a_p and of the miss rate at each kind of position, from the rounds seen so far, starting
    from a stated prior.

    a_p: the maximum-likelihood per-token acceptance rate of a truncated geometric, accepted / tested, where a round
    tests k + 1 drafted tokens if one was rejected and K if all were accepted (the drafted-token acceptance rate
    accepted / drafted is biased low: tokens after a rejection are never tested). The prior counts as
    `prior_weight` tested tokens. With memory < 1 each round first scales the counts before it by memory, so the
    estimate follows the text as it changes (0.9: about the last ten rounds weigh most); 1 weighs every round alike.

    The miss rates (``miss_model``): from the rank of each round's t* among the candidates at its position, kept per
    kind of position (``KINDS``). At each F the estimate is the fraction of that kind's ranks beyond F, shrunk toward
    the prior law c F^(-r) as if `prior_ranks` ranks had followed it: a few rounds move it a little, many rounds make
    it the empirical rate. The prior's r is prior_r at both kinds; its c is higher at a recovered position
    (prior_c_recovered), where the draft has just been wrong, than at the bonus one (prior_c_bonus). ``r`` is the
    power law fitted to all ranks (``fit_power_law``), the prior r until `min_rounds` ranks are seen: what the trace
    reports; the allocation reads the per-kind rates. With a `window` only the last that many ranks of each kind
    count, so that a calibrator kept over many answers (``ssd.core.tuning.Autotune.calibrator``) follows the text and
    its tables stay cheap to build.

    a_p is the draft model's: a round the fast backup drafted (an n-gram lookup, ``model_drafted=False``) teaches the
    ranks of its outcome but not a_p. What the fast backup would give after a miss is kept apart (``fast_tokens``),
    from how many tokens of an n-gram proposal at each miss the target went on to produce (``update_fast``).
    """

    prior_a_p: float = 0.6
    prior_r: float = 0.5
    prior_c_recovered: float = 0.5
    prior_c_bonus: float = 0.3
    prior_weight: float = 8.0
    prior_ranks: float = 8.0
    min_rounds: int = 8
    max_f: int = 32
    memory: float = 1.0
    window: int | None = None
    # The fast backup's prior: an n-gram proposal whose every token the target keeps with this chance, weighing as
    # much as this many misses (a stated guess, below the draft's prior a_p: the run's own misses soon outweigh it)
    prior_fast_a: float = 0.3
    prior_fast_weight: float = 4.0
    accepted: float = 0
    tested: float = 0
    ranks: dict = field(default_factory=lambda: {kind: [] for kind in KINDS})
    fast_matched: list = field(default_factory=list)  # per miss: tokens of the n-gram proposal the target produced

    def update(self, accepted: int, draft_len: int, rank: int | None, model_drafted: bool = True) -> None:
        if draft_len == 0:
            return
        if model_drafted:
            self.accepted, self.tested = self.accepted * self.memory, self.tested * self.memory
            self.accepted += accepted
            self.tested += accepted + (1 if accepted < draft_len else 0)
        if rank is not None:
            ranks = self.ranks[position_kind(accepted, draft_len)]
            ranks.append(rank)
            if self.window is not None and len(ranks) > self.window:
                del ranks[0]

    def update_fast(self, matched: int) -> None:
        """At a miss the fast backup's n-gram proposal would have had its first `matched` tokens accepted: the target's
        tokens there equal them (a one-hot draft is accepted exactly when the target's token is it, so this holds in
        distribution at any temperature, whichever backup drafted the round)."""
        self.fast_matched.append(matched)
        if self.window is not None and len(self.fast_matched) > self.window:
            del self.fast_matched[0]

    def fast_tokens(self, k: int) -> float:
        """Expected tokens of a round the fast backup drafts at draft length k: 1 + E[min(matched, k)] over the misses
        seen, shrunk toward the prior's sum of prior_fast_a^i for i = 1..k."""
        prior = sum(self.prior_fast_a**i for i in range(1, k + 1))
        seen = sum(min(m, k) for m in self.fast_matched)
        return 1.0 + (seen + self.prior_fast_weight * prior) / (len(self.fast_matched) + self.prior_fast_weight)

    @property
    def a_p(self) -> float:
        return (self.accepted + self.prior_a_p * self.prior_weight) / (self.tested + self.prior_weight)

    @property
    def r(self) -> float:
        ranks = [x for kind in KINDS for x in self.ranks[kind]]
        if len(ranks) < self.min_rounds:
            return self.prior_r
        fitted = fit_power_law(ranks, self.max_f)
        return fitted if fitted is not None else self.prior_r

    def miss_model(self) -> MissModel:
        """The miss rate at F = 0..max_f per kind of position: the empirical rate shrunk toward the prior law."""
        f = np.arange(self.max_f + 1)
        tables = {}
        for kind in KINDS:
            prior = PowerLaw(self.prior_c_recovered if kind == "recovered" else self.prior_c_bonus, self.prior_r)
            prior_miss = np.array([prior.miss(int(x)) for x in f])
            ranks = np.asarray(self.ranks[kind], dtype=int)
            beyond = (ranks[None, :] > f[:, None]).sum(axis=1)  # [max_f + 1] ranks beyond each F
            miss = (beyond + self.prior_ranks * prior_miss) / (len(ranks) + self.prior_ranks)
            miss[0] = 1.0
            tables[kind] = tuple(float(x) for x in miss)
        return MissModel(**tables)

    def allocate(self, budget: int, k: int) -> list[int]:
        return marginal_fan_out(budget, k, min(max(self.a_p, 0.0), 1.0), self.miss_model())


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

    def miss(self, f: int) -> float:
        """The law's miss rate at fan-out f: 1 with no candidate, never above 1."""
        return 1.0 if f <= 0 else min(1.0, self.c * f ** -self.r)


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
