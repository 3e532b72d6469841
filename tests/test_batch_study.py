"""The batch-size study's tables (ssd.batch_study): a bench as the sweep's table of calls, intervals over calls, the
crossover b*, break-even batch sizes and the auto backup against the fixed ones, on synthetic tables whose answers
are known; and one real (tiny) bench through point_table."""
import math

import pandas as pd
import pytest

from ssd import batch_study
from ssd.bench import run_bench
from ssd.decoding import DecodeConfig
from ssd.models import tiny_pair
from ssd.prompts import load_prompts
from ssd.theory import critical_batch_size

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
