"""The choice of K and B on synthetic latencies: each lever moves the choice the way the theory says it must."""
import pathlib
from dataclasses import dataclass

import pytest

from ssd.core.fan_out import Calibrator, PowerLaw
from ssd.bench.profile import load
from ssd.core.theory import expected_tokens
from ssd.core.tuning import (choose_sd_k, choose_ssd_k_budget, predicted_hit_rate, sd_tokens_per_s, ssd_tokens_per_s)

LAW = PowerLaw(c=0.3, r=1.2)


@dataclass(frozen=True)
class Latencies:
    """ms of a verify pass over n tokens: verify_ms (1 + verify_slope (n - 1)); of a draft forward over n rows:
    draft_ms (1 + draft_slope (n - 1)), and a glue step over n tokens the same."""

    verify_ms: float = 100.0
    verify_slope: float = 0.05  # a GPU-like pass: K + 1 tokens cost about one step
    draft_ms: float = 20.0
    draft_slope: float = 0.05
    batch_size: int = 1  # the rows every pass was timed over

    def target_at(self, n):
        return self.verify_ms * (1 + self.verify_slope * (n - 1))

    def draft_at(self, n):
        return self.draft_ms * (1 + self.draft_slope * (n - 1))

    def glue_at(self, n):
        return self.draft_at(n)


def test_sd_prediction_is_tokens_per_round_over_its_time():
    lat = Latencies()
    assert sd_tokens_per_s(0.8, 4, lat) == pytest.approx(expected_tokens(0.8, 4) / (4 * 20 + 100 * 1.2) * 1000)


def test_a_free_draft_drives_k_up_and_a_useless_one_to_the_smallest_k():
    free = Latencies(draft_ms=1e-6)
    assert choose_sd_k(0.9, free).k == 8  # the largest candidate: every extra token is nearly free
    assert choose_sd_k(0.0, Latencies()).k == 1  # nothing is ever accepted: draft as little as possible
    assert choose_sd_k(0.0, free).k == 1  # a tie on tokens: the smaller K


def test_k_grows_with_the_acceptance_rate_and_shrinks_with_the_draft_cost():
    lat = Latencies()
    ks = [choose_sd_k(a, lat).k for a in (0.3, 0.6, 0.8, 0.95)]
    assert ks == sorted(ks) and ks[0] < ks[-1]
    costs = [choose_sd_k(0.8, Latencies(draft_ms=ms)).k for ms in (1.0, 10.0, 40.0, 80.0)]
    assert costs == sorted(costs, reverse=True) and costs[0] > costs[-1]


def test_the_hit_rate_rises_with_the_budget_and_stays_a_rate():
    rates = [predicted_hit_rate(0.8, LAW, 4, b) for b in (1, 2, 4, 8, 16, 32, 256)]
    assert rates == sorted(rates) and all(0.0 <= p <= 1.0 for p in rates)
    assert predicted_hit_rate(0.8, PowerLaw(c=0.0, r=1.0), 4, 5, "uniform") == pytest.approx(1.0)  # every F_k >= 1
    assert predicted_hit_rate(0.8, PowerLaw(c=5.0, r=0.5), 4, 4) == 0.0  # c F^(-r) >= 1 everywhere: nothing hits


def test_a_drafter_slower_than_the_verifier_drives_the_budget_down():
    cheap_rows = Latencies(draft_slope=0.01)  # a tree of B rows costs about one step: cache widely
    dear_rows = Latencies(draft_ms=60.0, draft_slope=1.0)  # B rows cost B steps: pre-speculation outruns the verifier
    wide, narrow = choose_ssd_k_budget(0.8, LAW, cheap_rows), choose_ssd_k_budget(0.8, LAW, dear_rows)
    assert wide.budget > narrow.budget
    assert 0.0 < narrow.p_hit < wide.p_hit <= 1.0
    tps, p_hit = ssd_tokens_per_s(0.8, LAW, wide.k, wide.budget, cheap_rows)
    assert (tps, p_hit) == (wide.tokens_per_s, wide.p_hit)


def test_on_the_measured_profile_every_candidate_is_priced():
    profile = load(pathlib.Path(__file__).parent.parent / "data" / "intel-xeon-amx" / "profiles" /
                   "qwen2.5-coder_bfloat16_int8_f3bdb07b.json")  # the pair at its auto precision, with AMX
    sd = choose_sd_k(0.8, profile)
    ssd = choose_ssd_k_budget(0.8, LAW, profile)
    assert sd.k in range(1, 9) and sd.tokens_per_s > 0
    assert ssd.k in range(1, 9) and ssd.budget in (1, 2, 4, 8, 16, 32) and ssd.tokens_per_s > 0


@pytest.mark.parametrize("call,match", [
    (lambda: choose_sd_k(1.5, Latencies()), r"a \(the acceptance rate\) must lie in \[0, 1\]"),
    (lambda: choose_sd_k(0.5, Latencies(), ks=[]), "ks must be a non-empty list of integers >= 1"),
    (lambda: choose_ssd_k_budget(-0.1, LAW, Latencies()), r"a_p \(the acceptance rate\) must lie in \[0, 1\]"),
    (lambda: choose_ssd_k_budget(0.5, LAW, Latencies(), budgets=[0]), "budgets must be a non-empty list"),
])
def test_bad_input_is_refused_in_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---- the backup: jit or fast, by what each is predicted to give at the batch size ------------------------------------


def fast(k):
    """An n-gram that keeps one token of K at a miss (the draft keeps E(0.8, K))."""
    return 1.0 + min(k, 1)


@pytest.mark.parametrize("draft_ms, expected", [(1.0, "jit"), (400.0, "fast")])
def test_auto_takes_the_jit_backup_while_drafting_is_cheap_and_the_fast_one_when_it_is_dear(draft_ms, expected):
    lat = Latencies(draft_ms=draft_ms, draft_slope=0.0)
    choice = choose_ssd_k_budget(0.8, LAW, lat, (4,), (8,), backup="auto", fast_tokens=fast)
    assert choice.backup == expected
    alone = choose_ssd_k_budget(0.8, LAW, lat, (4,), (8,), backup=expected, fast_tokens=fast)
    assert (alone.tokens_per_s, alone.backup) == (choice.tokens_per_s, expected)
    other = choose_ssd_k_budget(0.8, LAW, lat, (4,), (8,), backup={"jit": "fast", "fast": "jit"}[expected],
                                fast_tokens=fast)
    assert other.tokens_per_s < choice.tokens_per_s


def test_the_batch_size_moves_the_choice_from_the_jit_backup_to_the_fast_one():
    """The same per-pass latencies timed over b rows: a round waits for the jit draft unless all b sequences hit,
    p_hit^b, so past some b the fast backup wins (Theorem 17)."""
    chosen = [choose_ssd_k_budget(0.8, LAW, Latencies(draft_ms=5.0, batch_size=b), (4,), (8,), backup="auto",
                                  fast_tokens=fast).backup for b in (1, 2, 4, 8, 16, 32)]
    assert chosen[0] == "jit" and chosen[-1] == "fast"
    assert chosen == sorted(chosen, key=["jit", "fast"].index)  # one crossover, never back


def test_a_fast_miss_is_priced_at_the_fast_backups_tokens():
    lat = Latencies(draft_ms=1.0)
    best_case, _ = ssd_tokens_per_s(0.8, LAW, 4, 8, lat, backup="fast")  # no estimate: a fast miss as good as a hit
    priced, _ = ssd_tokens_per_s(0.8, LAW, 4, 8, lat, backup="fast", fast_tokens=fast)
    assert priced < best_case


def test_the_fast_backups_tokens_follow_what_its_proposals_kept_and_a_p_stays_the_drafts():
    calibrator = Calibrator(prior_a_p=0.6)
    prior = 1 + sum(calibrator.prior_fast_a**i for i in range(1, 5))
    assert calibrator.fast_tokens(4) == pytest.approx(prior)
    for matched in [0, 8, 2, 0] * 50:
        calibrator.update_fast(matched)
    assert calibrator.fast_tokens(4) == pytest.approx(1 + (0 + 4 + 2 + 0) / 4, abs=0.05)  # min(matched, K) + 1
    assert calibrator.fast_tokens(1) == pytest.approx(1 + 2 / 4, abs=0.05)
    calibrator.update(0, 4, rank=3, model_drafted=False)  # an n-gram round: its rank counts, not its acceptance
    assert (calibrator.a_p, calibrator.ranks["recovered"]) == (0.6, [3])
    calibrator.update(4, 4, rank=None)
    assert calibrator.a_p > 0.6
