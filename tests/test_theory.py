"""Closed forms and Theorem 7 fed by measured rounds; the bench summary that reports them."""
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ssd.bench.summaries import measured_theorem7, ratios, resummarised, summarize
from ssd.core.theory import (all_hit_rate, critical_batch_size, expected_tokens, pipelined_speedup, sd_speedup,
                             theorem7_speedup)


def test_expected_tokens_per_round():
    assert expected_tokens(0.0, 4) == 1
    assert expected_tokens(1.0, 4) == 5
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_sd_speedup_formula():
    assert sd_speedup(0.8, 4, 0.0) == pytest.approx(expected_tokens(0.8, 4))
    assert sd_speedup(0.0, 4, 0.25) == pytest.approx(0.5)  # nothing accepted: pure draft overhead
    assert sd_speedup(0.8, 4, 0.25, v=2.5) == pytest.approx(expected_tokens(0.8, 4) / 3.5)  # a costly verify pass


@pytest.mark.parametrize("p_hit", np.linspace(0, 1, 6))
@pytest.mark.parametrize("c", [0.05, 0.2, 0.5])
@pytest.mark.parametrize("a", [0.2, 0.6, 0.9])
def test_corollary_8_ssd_with_sds_drafter_is_never_slower_than_sd(p_hit, c, a):
    k = 4
    e = expected_tokens(a, k)
    # Primary and backup are SD's drafter: pre-speculating one branch or drafting just in time both cost c K.
    assert theorem7_speedup(p_hit, e, e, t_p=c * k, t_b=c * k) >= sd_speedup(a, k, c) - 1e-12


@pytest.mark.parametrize("p_hit", [0.0, 0.4, 1.0])
def test_the_pipelined_form_is_theorem7_until_pre_speculation_outlasts_the_verify_pass(p_hit):
    for t_p in (0.3, 1.0):
        assert pipelined_speedup(p_hit, 4.0, 3.0, t_p, 0.5) == pytest.approx(theorem7_speedup(p_hit, 4.0, 3.0, t_p, 0.5))
    slower = pipelined_speedup(p_hit, 4.0, 3.0, 1.5, 0.5)
    assert slower == pytest.approx((p_hit * 4 + (1 - p_hit) * 3) / (1.5 + (1 - p_hit) * 0.5))  # a miss waits for it
    assert slower <= theorem7_speedup(p_hit, 4.0, 3.0, 1.5, 0.5) + 1e-12


def rounds_frame():
    """Two runs: hits in rounds 0 and 2 of the first run (so rounds 1 and 3 drafted from the cache)."""
    return pd.DataFrame(
        {
            "method": "ssd",
            "round": [0, 1, 2, 3, 0, 1],
            "hit": [True, False, True, False, False, False],
            "new_tokens": [2, 4, 1, 5, 3, 1],
            "verify_s": [7.0, 1.0, 1.0, 1.0, 9.0, 1.0],  # round 0 also processes the prompt: not a verify pass
            "prespec_s": [0.5] * 6,
            "draft_s": [0.0, 0.3, 0.0, 0.3, 0.3, 0.3],
            "backup": [None, "jit", None, "jit", "jit", "jit"],
        }
    )


def test_measured_theorem7_reads_every_input_off_the_rounds():
    out = measured_theorem7(rounds_frame(), ar_step_s=0.5)
    assert out["p_hit"] == pytest.approx(2 / 4)  # each run's last round's lookup decides nothing: left out
    assert out["e_hit"] == pytest.approx((4 + 5) / 2)  # rounds after a hit
    assert out["e_miss"] == pytest.approx((2 + 1 + 3 + 1) / 4)
    assert (out["t_p"], out["t_b"]) == (pytest.approx(0.5), pytest.approx(0.3))
    expected = theorem7_speedup(2 / 4, 4.5, 7 / 4, 0.5, 0.3)
    assert out["tokens_per_verify"] == pytest.approx(expected)
    assert out["predicted_speedup_vs_ar"] == pytest.approx(expected * 0.5 / 1.0)


def test_bench_summary_ratios_and_ssd_prediction():
    rows = pd.DataFrame(
        {
            "method": ["ar", "sd", "hf-ar", "ssd"],
            "prompt_id": ["p"] * 4,
            "new_tokens": [10, 10, 10, 10],
            "wall_s": [5.0, 4.0, 4.0, 2.0],
            "drafted": [0, 8, 0, 8],
            "accepted": [0, 6, 0, 6],
            "rounds": [10, 4, 0, 4],
            "identical_to_target": [True, True, True, True],
            "prefill_s": [1.0, 1.5, None, 1.0],  # transformers' generate does not time its prompt pass apart
        }
    )
    summary = {s["method"]: s for s in summarize(rows, rounds_frame())}
    assert summary["sd"]["speedup_vs_ar"] == pytest.approx(1.25)
    # decode tokens/s: over the time after the prompt's pass (ar 10 / 4 s, sd 10 / 2.5 s)
    assert summary["sd"]["decode_tokens_per_s"] == pytest.approx(4.0)
    assert summary["sd"]["decode_speedup_vs_ar"] == pytest.approx(1.6)
    assert summary["hf-ar"]["decode_tokens_per_s"] is None and summary["hf-ar"]["decode_speedup_vs_ar"] is None
    assert summary["ar"]["speedup_vs_peer"] == pytest.approx(0.8)  # ar against hf-ar
    assert summary["sd"]["acceptance_rate"] == pytest.approx(0.75)
    assert summary["ssd"]["hit_rate"] == pytest.approx(2 / 4)
    assert summary["ssd"]["predicted_speedup_vs_ar"] == pytest.approx(
        measured_theorem7(rounds_frame(), ar_step_s=0.5)["predicted_speedup_vs_ar"]
    )


# ---- batch size b ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p_hit", [0.0, 0.3, 0.8, 1.0])
def test_a_batch_of_one_is_todays_theorem(p_hit):
    assert all_hit_rate(p_hit, 1) == p_hit
    for t_p in (0.4, 1.6):
        for form in (theorem7_speedup, pipelined_speedup):
            assert form(p_hit, 4.0, 3.0, t_p, 0.5, all_hit=p_hit) == form(p_hit, 4.0, 3.0, t_p, 0.5)


def test_a_batch_waits_for_the_backup_unless_every_sequence_hit():
    p, t_p, t_b = 0.7, 0.8, 0.6
    by_b = [pipelined_speedup(p, 4.0, 3.0, t_p, t_b, all_hit_rate(p, b)) for b in (1, 2, 4, 8, 16)]
    assert by_b == sorted(by_b, reverse=True) and by_b[0] > by_b[-1]
    # past every sequence's hit, each round waits: the bound is a round that always pays the backup
    assert by_b[-1] > (p * 4 + (1 - p) * 3) / (1 + t_b) and pipelined_speedup(p, 4.0, 3.0, t_p, t_b, 0.0) == (
        pytest.approx((p * 4 + (1 - p) * 3) / (1 + t_b)))
    assert theorem7_speedup(p, 4.0, 3.0, t_p, t_b, 0.0) == pytest.approx((p * 4 + (1 - p) * 3) / (1 + t_b))
    # a fast backup never waits: its rate does not depend on the batch
    assert pipelined_speedup(p, 4.0, 2.0, t_p, 0.0, all_hit_rate(p, 16)) == pipelined_speedup(p, 4.0, 2.0, t_p, 0.0)


@pytest.mark.parametrize("p_hit,e_fast,t_p,t_b", [(0.7, 2.0, 0.8, 0.6), (0.9, 1.5, 1.3, 0.4), (0.5, 2.5, 0.5, 1.0),
                                                   (0.95, 1.2, 0.9, 0.2), (0.6, 1.0, 1.0, 0.05)])
def test_the_critical_batch_size_is_where_the_fast_backup_first_catches_up(p_hit, e_fast, t_p, t_b):
    """Brute force over b against the closed form: below b* the jit backup predicts more tokens per verify pass,
    from b* on the fast one does (Theorem 17's shape)."""
    b_star = critical_batch_size(p_hit, 4.0, 3.0, e_fast, t_p, t_b)
    fast_ahead = [pipelined_speedup(p_hit, 4.0, e_fast, t_p, 0.0)
                  >= pipelined_speedup(p_hit, 4.0, 3.0, t_p, t_b, all_hit_rate(p_hit, b)) for b in range(1, 400)]
    first = fast_ahead.index(True) + 1 if True in fast_ahead else None
    assert b_star == first
    if first is not None:
        assert all(fast_ahead[first - 1:])


def test_the_critical_batch_size_at_its_edges():
    assert critical_batch_size(0.7, 4.0, 3.0, 3.0, 0.8, 0.6) == 1  # the fast backup as good after a miss
    assert critical_batch_size(0.7, 4.0, 3.0, 2.0, 0.8, 0.0) is None  # a jit backup that costs nothing
    assert critical_batch_size(1.0, 4.0, 3.0, 2.0, 0.8, 0.6) == 1  # nothing misses: the backups never run, a tie
    assert critical_batch_size(0.0, 4.0, 3.0, 2.0, 0.8, 0.6) == 1  # every round misses: it waits from b = 1 on
    assert critical_batch_size(0.7, 4.0, 3.0, 0.5, 0.8, 0.01) is None  # the jit draft's tokens always pay


def test_measured_theorem7_charges_a_batch_its_all_hit_rate():
    rounds = rounds_frame().assign(all_hit=[False, False, True, False, False, False])  # one counted round of 4 all hit
    out = measured_theorem7(rounds)
    assert out["p_hit"] == pytest.approx(2 / 4) and out["all_hit"] == pytest.approx(1 / 4)
    assert out["tokens_per_verify"] == pytest.approx(theorem7_speedup(2 / 4, 4.5, 7 / 4, 0.5, 0.3, all_hit=1 / 4))
    assert measured_theorem7(rounds_frame())["all_hit"] == pytest.approx(2 / 4)  # no column: one sequence's rounds


def test_an_answers_last_round_leaves_the_hit_rates():
    """Its lookup decides nothing: what it found moves neither p_hit nor the all-hit rate, nor E_hit / E_miss."""
    base = rounds_frame().assign(all_hit=[True, False, True, False, False, False])
    flipped = base.assign(hit=[True, False, True, True, False, True], all_hit=[True, False, True, True, False, True])
    assert measured_theorem7(flipped) == pytest.approx(measured_theorem7(base))
    moved = base.assign(hit=[True, True, True, False, False, False])  # a round that is not last does move it
    assert measured_theorem7(moved)["p_hit"] == pytest.approx(3 / 4)


def test_a_summarys_speed_ups_are_geometric_means_of_per_answer_ratios_with_their_interval():
    """Ratios of 2, 1 and 1 give 2 ** (1 / 3), not the 1.33 of their arithmetic mean or of a ratio of the totals."""
    rows = pd.DataFrame({"method": ["ar", "sd"] * 3, "prompt_id": ["a", "a", "b", "b", "c", "c"],
                         "new_tokens": [10] * 6, "wall_s": [2.0, 1.0, 1.0, 1.0, 1.0, 1.0],
                         "prefill_s": [0.5, 0.25, 0.5, 0.5, 0.5, 0.5], "prefill_tokens": [1] * 6})
    out = ratios(rows, "sd")
    assert out["speedup_vs_ar"] == pytest.approx(2 ** (1 / 3))
    low, high = out["speedup_vs_ar_ci"]
    assert low < 2 ** (1 / 3) < high  # three answers: an interval, of the mean log
    assert out["decode_speedup_vs_ar"] == pytest.approx((9 / 0.75 / (9 / 1.5)) ** (1 / 3))
    assert out["speedup_vs_peer"] is None and out["speedup_vs_peer_ci"] is None  # hf-sd did not run
    assert ratios(rows, "ar")["speedup_vs_ar"] == 1.0 and ratios(rows, "ar")["speedup_vs_ar_ci"] is None
    # rows a caller made by hand, without prompt ids: answers pair by their order within each method
    assert ratios(rows.drop(columns="prompt_id"), "sd")["speedup_vs_ar"] == pytest.approx(2 ** (1 / 3))


def test_every_stored_bench_gives_its_speed_ups_in_the_one_convention():
    """Each data/ bench's summary, per-category report and peers are what its rows give today (resummarised), so no
    stored file keeps a ratio of totals or an arithmetic mean of ratios beside the report's geometric means."""
    paths = [p for p in sorted(Path("data").glob("*/*.json")) if {"rows", "summary"} <= set(json.loads(p.read_text()))]
    assert len(paths) >= 30
    for path in paths:
        stored = json.loads(path.read_text())
        assert json.loads(json.dumps(resummarised(stored), default=str)) == stored, path
