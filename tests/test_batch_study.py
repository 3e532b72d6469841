"""The batch-size study's tables (ssd.analysis.batch_study): a bench as the sweep's table of calls, intervals over
calls, the crossover b*, break-even batch sizes and the auto backup against the fixed ones, on synthetic tables whose
answers are known; and one real (tiny) bench through point_table."""
import math

import pandas as pd
import pytest

from ssd.analysis import batch_study
from ssd.bench.run import run_bench
from ssd.core.decoding import DecodeConfig
from ssd.models.tiny import tiny_pair
from ssd.bench.prompts import load_prompts
from ssd.core.theory import critical_batch_size

JIT, FAST, AUTO = "ssd-pipeline:jit", "ssd-pipeline:fast", "ssd-pipeline:auto"


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=32, agreement_noise=0.4, seed=1)


def call_rows(label, b, tokens_per_s, decode, predicted=None, calls=None, **run):
    """A method's calls at batch size b as the sweep keeps them: `calls` calls (16 prompts' worth), each of the
    given tokens/s, the run's figures in run_ columns."""
    n = calls or 16 // b
    runs = {f"run_{c}": None for c in batch_study.RUN_COLUMNS} | {
        "run_tokens_per_s": tokens_per_s, "run_sequence_tokens_per_s": tokens_per_s / b,
        "run_decode_tokens_per_s": decode, "run_profile_tokens_per_s": predicted,
        "run_decode_over_profile_prediction": None if predicted is None else decode / predicted,
        "run_identical_to_target": True, "run_identical_share": 1.0} | {f"run_{k}": v for k, v in run.items()}
    return pd.DataFrame({"prompts": "set", "method": label, "label": label, "batch_size": b, "call": range(n),
                         "answers": b, "tokens_per_s": tokens_per_s, **runs})


def study(jit_decode, fast_decode, sd_total, ar_total, sizes=(1, 2, 4, 8, 16)):
    frames = []
    for i, b in enumerate(sizes):
        frames += [call_rows("ar", b, ar_total[i], ar_total[i]), call_rows("sd", b, sd_total[i], sd_total[i]),
                   call_rows(JIT, b, jit_decode[i], jit_decode[i], predicted=jit_decode[i] * 1.1, p_hit=0.8,
                             all_hit=0.8**b, e_hit=4.0, e_miss=3.5, profile_t_p=0.8, profile_t_b=0.4,
                             fast_backup_share=0.0),
                   call_rows(FAST, b, fast_decode[i], fast_decode[i], predicted=fast_decode[i], p_hit=0.8,
                             all_hit=0.8**b, e_hit=4.0, e_miss=1.2, profile_t_p=0.8, profile_t_b=0.0,
                             fast_backup_share=1.0),
                   call_rows(AUTO, b, max(jit_decode[i], fast_decode[i]), max(jit_decode[i], fast_decode[i]) * 0.97,
                             p_hit=0.8, fast_backup_share=0.5)]
    return batch_study.by_batch_size(pd.concat(frames, ignore_index=True))


def test_intervals_are_over_calls_and_none_from_fewer_than_three():
    calls = call_rows("ar", 4, 10.0, 12.0).assign(tokens_per_s=[9.0, 10.0, 11.0, 10.0])
    one = batch_study.by_batch_size(pd.concat([calls, call_rows("ar", 8, 20.0, 22.0)])).set_index("batch_size")
    half = 3.182446 * pd.Series([9.0, 10.0, 11.0, 10.0]).std() / 2  # t(0.975, 3) s / sqrt(4)
    assert one.loc[4, "calls"] == 4 and one.loc[4, "ci_low"] == pytest.approx(10 - half)
    assert one.loc[8, "calls"] == 2 and math.isnan(one.loc[8, "ci_low"])  # two calls: no interval
    assert one.loc[4, "tokens_per_s"] == 10.0  # the run's figure, not the mean over calls


def test_the_crossover_and_break_even_are_the_first_b_that_reaches():
    summary = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[4, 7, 10.5, 12, 13],
                    sd_total=[4, 6, 7, 8, 8], ar_total=[3, 5, 7, 9, 10])
    # the fast backup reaches jit at b = 4 measured; predicted (jit's prediction 10% above its measurement) only at 16
    assert batch_study.crossover(summary) == {"measured": 4, "predicted": 16}
    assert batch_study.break_even(summary)["tokens_per_s"] == 4  # SD no faster than AR from b = 4 on
    never = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[1, 2, 3, 4, 5], sd_total=[9] * 5, ar_total=[3] * 5)
    assert batch_study.crossover(never)["measured"] is None and batch_study.break_even(never)["tokens_per_s"] is None
    with pytest.raises(ValueError, match="needs methods 'ar' and 'hf-ar'"):
        batch_study.break_even(summary, "hf-ar")


def test_theorem17_is_the_closed_form_from_the_b1_rates():
    summary = study(jit_decode=[5] * 5, fast_decode=[4] * 5, sd_total=[4] * 5, ar_total=[3] * 5)
    assert batch_study.theorem17(summary) == critical_batch_size(0.8, 4.0, 3.5, 1.2, 0.8, 0.4)
    with pytest.raises(ValueError, match="at b = 1"):
        batch_study.theorem17(summary[summary["batch_size"] > 1])


def test_auto_is_held_against_the_better_fixed_backup_at_each_b():
    summary = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[4, 7, 10.5, 12, 13], sd_total=[4] * 5,
                    ar_total=[3] * 5)
    auto = batch_study.auto_over_fixed(summary).loc["set"]
    assert list(auto["better fixed"]) == [JIT, JIT, FAST, FAST, FAST]
    assert auto["auto_over_better"].tolist() == pytest.approx([0.97] * 5)
    assert auto.loc[16, "auto_over_jit"] == pytest.approx(13 * 0.97 / 11)
    without = batch_study.auto_over_fixed(summary[summary["label"] != "ssd-pipeline:auto"])
    assert without.empty and "auto_over_better" in without  # a sweep of the fixed backups only: nothing to hold


def test_a_label_names_the_backup_a_variant_sets():
    assert batch_study.label("ssd-pipeline:backup=fast:batch_size=8") == FAST
    assert batch_study.label("ar:batch_size=8") == "ar" and batch_study.label("sd") == "sd"


def test_a_bench_becomes_one_row_per_method_and_call(pair):
    prompts = load_prompts("prose[0:4]")
    result = run_bench(pair, prompts, ["ar", "ar:batch_size=4", "sd:batch_size=2"], DecodeConfig(k=3, max_new_tokens=6),
                       progress=False)
    table = batch_study.point_table(result, "prose[0:4]", machine="here")
    calls = table.groupby("method")["call"].nunique()
    assert calls.to_dict() == {"ar": 4, "ar:batch_size=4": 1, "sd:batch_size=2": 2}
    assert (table["answers"] * table.groupby("method")["call"].transform("size")).eq(4).all()
    assert table.set_index("method")["batch_size"].groupby(level=0).first().to_dict() == {
        "ar": 1, "ar:batch_size=4": 4, "sd:batch_size=2": 2}
    summary = {s["method"]: s for s in result["summary"]}
    for method, g in table.groupby("method"):
        assert g["run_tokens_per_s"].iloc[0] == pytest.approx(summary[method]["tokens_per_s"])
        # the calls' tokens over their time is the run's figure
        assert (g["new_tokens"].sum() / g["wall_s"].sum()) == pytest.approx(summary[method]["tokens_per_s"])
    assert set(table["machine"]) == {"here"} and set(table["prompts"]) == {"prose[0:4]"}
    # each call's rounds: the most of its rows', every row live in each (AR) or some finished early (SD at b = 2)
    rows = pd.DataFrame(result["rows"])
    assert table.set_index(["method", "call"])["rounds"].to_dict() == rows.groupby(["method", "call"])["rounds"].max(
        ).to_dict()
    assert table.loc[table["method"].str.startswith("ar"), "live_share"].eq(1.0).all()
    assert table["live_share"].between(0.5, 1.0).all()
    # the verify steps fit in the call (AR's and SD's first round feeds the prompts: its pass is in their verify time,
    # so at least the call's first target forward is); nothing here waits for drafts
    assert (table["verify_s"] >= table["first_target_forward_s"]).all() and (table["verify_s"] <= table["wall_s"]).all()
    assert table["wait_s"].eq(0).all()


def test_a_calls_rounds_and_verifier_time_come_from_its_first_rows_spans():
    rows = pd.DataFrame({"method": "p", "call": [0, 0, 2, 2], "prompt_id": list("abcd"), "rounds": [10, 6, 4, 4]})
    spans = []
    for row in "abcd":  # the batch's spans, on each of its rows: read once per call, not once per row
        for i in range(10 if row in "ab" else 4):
            spans += [{"method": "p", "call": 0 if row in "ab" else 2, "prompt_id": row, "round": i, "phase": phase,
                       "start_s": i, "end_s": i + length} for phase, length in
                      [("verify_s", 0.5), ("wait_s", 0.25), ("prespec_s", 0.4)]]
    got = batch_study.call_rounds(rows, spans).set_index("call")
    assert got["rounds"].to_dict() == {0: 10, 2: 4} and got["live_share"].to_dict() == {0: 0.8, 2: 1.0}
    assert got["verify_s"].to_dict() == {0: 5.0, 2: 2.0} and got["wait_s"].to_dict() == {0: 2.5, 2: 1.0}
    assert got["prompts_in_verify"].tolist() == [True, True]  # round 0 fed the prompts: no pass apart
    apart = [{**spans[0], "round": None, "phase": "prefill_s"}] + spans  # a call whose verifier passed them apart
    assert batch_study.call_rounds(rows, apart)["prompts_in_verify"].tolist() == [False, True]
    # a bench whose spans name no call (or none kept): the rounds are known, the times are not
    old = batch_study.call_rounds(rows, [{k: v for k, v in s.items() if k != "call"} for s in spans])
    assert old["live_share"].tolist() == [0.8, 1.0] and old[["verify_s", "wait_s"]].isna().all().all()


def test_a_round_is_accounted_for_and_beside_the_round_its_prediction_prices():
    timed = {"prompts": "set", "label": JIT, "batch_size": 2, "answers": 2, "rounds": 10, "live_share": 0.75,
             "wall_s": 12.0, "first_target_forward_s": 2.0, "target_forward_s": 8.0, "verify_s": 7.0, "wait_s": 2.0,
             "profile_verify_ms": 500.0, "run_profile_t_p": 1.2, "run_profile_t_b": 0.5, "run_all_hit": 0.6,
             "run_decode_over_profile_prediction": 0.6}
    table = pd.DataFrame([timed, timed | {"live_share": 1.0}, timed | {"label": FAST, "verify_s": None},
                          timed | {"label": "sd"}])
    got = batch_study.round_account(table).set_index("label")
    # the pipeline's calls whose rounds were timed: not one kept before the round columns, nor another method's
    assert list(got.index) == [JIT]
    p = got.loc[JIT]
    # two calls of 10 rounds, 10 s after the prompts' pass each: 1000 ms a round, of which 600 forward, 100 check,
    # 200 wait, 100 between
    assert p["round_ms"] == pytest.approx(1000) and p["forward_ms"] == pytest.approx(600)
    assert p["check_ms"] == pytest.approx(100) and p["wait_ms"] == pytest.approx(200)
    assert p["between_ms"] == pytest.approx(100)
    assert p["live_share"] == pytest.approx(35 / 40)  # rows' rounds over answers x rounds, over both calls
    # the prediction's round: a pass, the drafter's 0.2 pass beyond it, the jit draft in the 40% of rounds that wait
    assert p["predicted_wait_ms"] == pytest.approx(500 * (0.2 + 0.4 * 0.5))
    assert p["predicted_pass_ms"] == 500 and p["predicted_round_ms"] == pytest.approx(500 + p["predicted_wait_ms"])
    assert p["measured_over_predicted"] == 0.6
    assert p["accounted"] == pytest.approx(35 / 40 * p["predicted_round_ms"] / 1000)
    # where round 0's verify step fed the prompts, their pass (the first target forward) leaves the check's time too
    fused = batch_study.round_account(table.assign(prompts_in_verify=True, verify_s=9.0)).set_index("label")
    assert fused.loc[JIT, "check_ms"] == pytest.approx(100) and fused.loc[JIT, "round_ms"] == pytest.approx(1000)
    assert batch_study.round_account(table.drop(columns=batch_study.ROUND_COLUMNS, errors="ignore")).empty
