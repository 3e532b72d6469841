"""Fan-out allocation (uniform, Theorem 12 geometric, calibrated) and candidate outcomes."""
import itertools
import math

import numpy as np
import pytest
import torch

from ssd.core.fan_out import (
    Calibrator,
    MissModel,
    PowerLaw,
    allocate,
    candidates,
    fit_power_law,
    geometric_fan_out,
    largest_remainder,
    marginal_fan_out,
    outcome_probabilities,
    position_kind,
    rank_of,
    uniform_fan_out,
)


def test_uniform_spreads_evenly_and_sums_to_the_budget():
    assert uniform_fan_out(10, 4) == [2, 2, 2, 2, 2]
    assert uniform_fan_out(7, 4) == [2, 2, 1, 1, 1]
    assert uniform_fan_out(0, 4) == [0] * 5


@pytest.mark.parametrize("budget", [0, 1, 4, 7, 16, 33, 64])
@pytest.mark.parametrize("k", [1, 4, 7])
@pytest.mark.parametrize("a_p", [0.05, 0.35, 0.7, 0.95])
@pytest.mark.parametrize("r", [0.3, 1.0, 3.0])
def test_geometric_sums_to_budget_and_is_non_increasing_before_k(budget, k, a_p, r):
    f = geometric_fan_out(budget, k, a_p, r)
    assert len(f) == k + 1 and sum(f) == budget and min(f) >= 0
    assert all(f[i] >= f[i + 1] for i in range(k - 1))


def test_geometric_matches_theorem_12_before_rounding():
    a_p, r, k, budget = 0.7, 0.5, 4, 1000
    f = geometric_fan_out(budget, k, a_p, r)
    f0 = f[0]
    for i in range(k):
        assert f[i] == pytest.approx(f0 * a_p ** (i / (1 + r)), abs=1)
    assert f[k] == pytest.approx(f0 * a_p ** (k / (1 + r)) * (1 - a_p) ** (-1 / (1 + r)), abs=1)


def test_geometric_limits():
    assert geometric_fan_out(16, 4, 0.0, 0.5) == [16, 0, 0, 0, 0]  # nothing is ever accepted
    assert geometric_fan_out(16, 4, 1.0, 0.5) == [0, 0, 0, 0, 16]  # everything is: only the bonus is uncertain
    assert geometric_fan_out(16, 4, 1e-9, 0.5)[0] == 16
    assert geometric_fan_out(16, 4, 1 - 1e-12, 0.5)[4] >= 15


def test_largest_remainder_is_exact_and_proportional():
    assert largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
    assert largest_remainder(5, [0, 3, 1]) == [0, 4, 1]
    assert sum(largest_remainder(101, np.random.default_rng(0).random(9))) == 101


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: uniform_fan_out(-1, 4), "budget \\(B, the number of cached outcomes\\) must be an integer >= 0"),
        (lambda: allocate("triangular", 8, 4), "fan_out_strategy must be one of uniform, geometric, calibrated"),
        (lambda: geometric_fan_out(8, 4, 1.5, 0.5), "a_p \\(the acceptance rate\\) must lie in \\[0, 1\\]"),
        (lambda: geometric_fan_out(8, 4, 0.5, 0.0), "r \\(the power-law exponent of the miss rate\\) must be > 0"),
    ],
)
def test_bad_fan_out_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def synthetic_rounds(n, k, a_p, r, seed=0):
    """Rounds drawn with known values: k from a truncated geometric, ranks with P(rank > F) = F^(-r)."""
    rng = np.random.default_rng(seed)
    rounds = []
    for _ in range(n):
        accepted = 0
        while accepted < k and rng.random() < a_p:
            accepted += 1
        rank = math.ceil((1 - rng.random()) ** (-1 / r))
        rounds.append((accepted, k, rank))
    return rounds


@pytest.mark.parametrize("a_p,r", [(0.35, 0.5), (0.8, 1.2)])
def test_calibration_recovers_a_p_and_r(a_p, r):
    calibrator = Calibrator(prior_a_p=0.5, prior_r=2.0, max_f=16)
    assert (calibrator.a_p, calibrator.r) == (0.5, 2.0)  # before any round: the stated prior
    for accepted, k, rank in synthetic_rounds(4000, 4, a_p, r):
        calibrator.update(accepted, k, rank)
    assert calibrator.a_p == pytest.approx(a_p, abs=0.02)
    assert calibrator.r == pytest.approx(r, rel=0.1)


def test_calibrated_fan_out_follows_the_estimates():
    calibrator = Calibrator(prior_a_p=0.5, prior_r=1.0)
    for accepted, k, rank in synthetic_rounds(500, 4, 0.9, 1.0):
        calibrator.update(accepted, k, rank)
    f = allocate("calibrated", 32, 4, calibrator=calibrator)
    assert f == marginal_fan_out(32, 4, calibrator.a_p, calibrator.miss_model()) and sum(f) == 32
    assert f[4] == max(f)  # a good draft: the bonus position deserves the most candidates


def expected_hits(f, a_p, model):
    probs = outcome_probabilities(len(f) - 1, a_p)
    return sum(p * (1 - model.at(position_kind(j, len(f) - 1), fj)) for j, (p, fj) in enumerate(zip(probs, f)))


@pytest.mark.parametrize("a_p", [0.3, 0.7, 0.95])
def test_the_marginal_fan_out_buys_the_most_expected_hits(a_p):
    model = MissModel.from_law(PowerLaw(c=0.4, r=0.8))
    model = MissModel(recovered=tuple(min(1.0, 1.6 * m) if f else 1.0 for f, m in enumerate(model.recovered)),
                      bonus=model.bonus)  # recovered tokens rank lower than bonus ones, as measured
    for budget in (1, 3, 6):
        best = max(expected_hits(f, a_p, model) for f in itertools.product(range(budget + 1), repeat=4)
                   if sum(f) == budget)
        assert expected_hits(marginal_fan_out(budget, 3, a_p, model), a_p, model) == pytest.approx(best)


def test_the_miss_rates_are_learnt_per_kind_of_position():
    """Bonus tokens nearly always rank first, recovered ones spread widely: calibrated learns each, and gives the
    bonus position fewer candidates than one law fitted over both would."""
    rng = np.random.default_rng(0)
    calibrator = Calibrator(prior_a_p=0.8, prior_r=1.0)
    for _ in range(400):
        accepted = 4 if rng.random() < 0.6 else int(rng.integers(0, 4))
        rank = 1 if accepted == 4 and rng.random() < 0.95 else int(rng.integers(1, 12))
        calibrator.update(accepted, 4, rank)
    model = calibrator.miss_model()
    assert model.at("bonus", 1) < 0.1 < 0.5 < model.at("recovered", 1)
    assert all(0.0 <= m <= 1.0 for m in model.recovered + model.bonus) and model.at("bonus", 0) == 1.0
    per_kind = allocate("calibrated", 16, 4, calibrator=calibrator)
    pooled = geometric_fan_out(16, 4, calibrator.a_p, calibrator.r)
    assert per_kind[4] < pooled[4]


def test_power_law_fit_on_exact_data():
    ranks = [math.ceil(x) for x in np.linspace(1e-6, 1 - 1e-6, 20000) ** (-1 / 0.7)]
    assert fit_power_law(ranks, 32) == pytest.approx(0.7, rel=0.05)
    assert fit_power_law([1, 1, 1], 32) is None  # always a hit at F = 1: nothing to fit


def test_candidates_skip_the_drafted_token_and_rank_agrees():
    logits = torch.tensor([0.1, 3.0, 2.0, 2.5, -1.0])
    assert candidates(logits, 2) == [1, 3]
    assert candidates(logits, 2, exclude=1) == [3, 2]
    assert [rank_of(t, logits, exclude=1) for t in (3, 2, 0, 4)] == [1, 2, 3, 4]
