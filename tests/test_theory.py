"""Closed forms and Theorem 7 fed by measured rounds; the bench summary that reports them."""
import numpy as np
import pandas as pd
import pytest

from ssd.bench import summarize
from ssd.theory import expected_tokens, measured_theorem7, pipelined_speedup, sd_speedup, theorem7_speedup


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
    assert out["p_hit"] == pytest.approx(2 / 6)
    assert out["e_hit"] == pytest.approx((4 + 5) / 2)  # rounds after a hit
    assert out["e_miss"] == pytest.approx((2 + 1 + 3 + 1) / 4)
    assert (out["t_p"], out["t_b"]) == (pytest.approx(0.5), pytest.approx(0.3))
    expected = theorem7_speedup(2 / 6, 4.5, 7 / 4, 0.5, 0.3)
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
    assert summary["ssd"]["hit_rate"] == pytest.approx(2 / 6)
    assert summary["ssd"]["predicted_speedup_vs_ar"] == pytest.approx(
        measured_theorem7(rounds_frame(), ar_step_s=0.5)["predicted_speedup_vs_ar"]
    )
