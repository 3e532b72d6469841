"""The batch-size study's tables (ssd.analysis.batch_study): a bench as the sweep's table of calls, intervals over
calls, the crossover b*, break-even batch sizes and the auto backup against the fixed ones, on synthetic tables whose
answers are known; one real (tiny) bench through point_table; and a machine's stored study, from a synthetic bench of
every b or a sweep table, priced at each b."""
import dataclasses
import json
import math

import pandas as pd
import pytest

from ssd.analysis import batch_study
from ssd.bench.run import run_bench
from ssd.core.decoding import DecodeConfig
from ssd.models.tiny import tiny_pair
from ssd.bench.prompts import load_prompts
from ssd.checks import parse_variant
from ssd.core.latencies import Profile
from ssd.core.theory import critical_batch_size, sd_from_profile, theorem7_from_profile

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


# ---- a stored study: a bench of every b as the sweep's table, and the machine whose study is shown ----------------

CAP = {"cpu": "Some CPU", "isa": "AVX2", "flags": ["avx2"], "native": [], "cores": 2, "torch": "2"}


def profile_at(b, step=100.0, precision="float32", measured="2026-01-01T00:00:00"):
    """A profile timed over b rows whose passes cost b times more per extra token than at b = 1."""
    return Profile(pair="tiny", precisions={"target": precision, "draft": "int8"}, capability=CAP,
                   verifier_cores=[0], drafter_cores=[1], context=128,
                   target_ms={n: step + 10.0 * b * (n - 1) for n in (1, 2, 5, 9)},
                   draft_ms={n: 20.0 + b * n for n in (1, 2, 4, 8)}, bandwidth_gbs={"target": 1.0, "draft": 1.0},
                   step_bytes={"target": 1, "draft": 1}, measured_at=measured,
                   glue_ms={n: 25.0 * b for n in (1, 5, 9)}, batch_size=b)


def bench_rows(method, b, n=4):
    """`n` answers of a variant at batch size b, `n // b` calls, as ``run_bench`` keeps them."""
    spec = method != "ar" and not method.startswith("ar:")
    return [{"prompt_id": f"p{i}", "method": method, "batch_size": b, "call": i - i % b, "new_tokens": 8,
             "wall_s": 2.0, "prefill_s": 0.5, "prefill_tokens": 1, "drafted": 8 if spec else 0,
             "accepted": 6 if spec else 0, "rounds": 3 if spec else 8, "drafting_rounds": 2 if spec else 0,
             "all_hit_rate": None, "mean_budget": None, "identical_to_target": True, "near_tie": None,
             "margin_at_difference": None, "target_forwards": 3, "target_forward_s": 1.5,
             "first_target_forward_s": 0.5, "outside_forwards_s": 0.1} for i in range(n)]


def bench_result(sizes=(1, 2), profile=None):
    """A bench of ar, sd and the pipeline with each backup at every b in `sizes`, as ``run_bench`` writes it."""
    methods = [m if b == 1 else f"{m}:batch_size={b}" for b in sizes
               for m in ("ar", "sd", "ssd-pipeline:backup=jit", "ssd-pipeline:backup=fast",
                         "ssd-pipeline:backup=auto")]
    summary = []
    for m in methods:
        b = parse_variant(m)[1].get("batch_size", 1)
        s = {"method": m, "batch_size": b, "tokens_per_s": 4.0 * b, "decode_tokens_per_s": 5.0 * b,
             "sequence_tokens_per_s": 4.0, "identical_to_target": True, "identical_share": 1.0,
             "mean_accepted": None if m.startswith("ar") else 3.0}
        if m.startswith("ssd"):
            s |= {"p_hit": 0.8, "e_hit": 4.0, "e_miss": 3.0 if "jit" in m else 1.2, "all_hit": 0.8 ** b}
        summary.append(s)
    return {"args": {"pair": "tiny", "prompts": "humaneval:4", "k": 4, "budget": 4, "backup": "jit"},
            "precision": {"target": "float32", "draft": "int8"}, "environment": {"capability": CAP},
            "profile": (profile or profile_at(1)).to_dict(), "summary": summary,
            "rows": [r for m in methods for r in bench_rows(m, parse_variant(m)[1].get("batch_size", 1))]}


def test_a_bench_of_every_b_becomes_the_sweeps_table_priced_at_each_b():
    result = bench_result(sizes=(1, 2, 4))
    table = batch_study.bench_table(result, {2: profile_at(2, measured="b2"), 1: profile_at(1, step=999.0)})
    assert table.groupby(["label", "batch_size"])["call"].nunique().unstack().to_dict("list") == {
        1: [4] * 5, 2: [2] * 5, 4: [1] * 5}
    assert set(table["prompts"]) == {"humaneval:4"} and set(table["precision"]) == {"target float32, draft int8"}
    assert set(table["machine"]) == {"Some CPU (2 cores), AVX2, no native bfloat16 or float16"}
    first = table.groupby(["label", "batch_size"]).first()
    # each b priced with its own profile; the bench's own profile wins for its b (the 999 ms step is not read)
    for b, profile in ((1, profile_at(1)), (2, profile_at(2))):
        for label, e_miss, backup in ((JIT, 3.0, "jit"), (FAST, 1.2, "fast")):
            priced = theorem7_from_profile(profile, 4, 4, 0.8, 4.0, e_miss, backup, 0.8 ** b)
            row = first.loc[(label, b)]
            assert row["run_profile_tokens_per_s"] == pytest.approx(priced["profile_tokens_per_s"])
            assert row["run_decode_over_profile_prediction"] == pytest.approx(5.0 * b / priced["profile_tokens_per_s"])
            assert row["run_profile_t_b"] == pytest.approx(priced["profile_t_b"])
        sd = sd_from_profile(profile, 4, 4.0)["profile_speedup_vs_ar"]  # E: 3 accepted + 1
        assert first.loc[("sd", b), "run_profile_tokens_per_s"] == pytest.approx(5.0 * b * sd)  # batched AR's x
        assert first.loc[("sd", b), "profile_verify_ms"] == profile.target_at(5)
    assert first.loc[(JIT, 2), "profile_measured_at"] == "b2"
    # no prediction: the backup on auto (no one price), AR, and a b with no profile
    assert first.loc[[AUTO, "ar"], "run_profile_tokens_per_s"].isna().all()
    assert first.xs(4, level="batch_size")[["run_profile_tokens_per_s", "profile_step_ms"]].isna().all().all()
    summary = batch_study.by_batch_size(table)
    assert summary.set_index(["label", "batch_size"]).loc[(JIT, 2), "predicted"] == pytest.approx(
        first.loc[(JIT, 2), "run_profile_tokens_per_s"])


def test_a_bench_is_priced_only_by_profiles_that_time_what_it_ran(tmp_path):
    for name, profile in (("b2.json", profile_at(2)), ("bf16_b4.json", profile_at(4, precision="bfloat16")),
                          ("compiled_b8.json", dataclasses.replace(profile_at(8), forward="compiled"))):
        (tmp_path / name).write_text(json.dumps(profile.to_dict()))
    (tmp_path / "bench.json").write_text(json.dumps({"summary": []}))  # not a profile: passed over
    assert sorted(batch_study.batch_profiles(str(tmp_path), profile_at(1))) == [2]


def keep(root, machine, files):
    """A machine's folder under root holding `files` (name: text) and an empty profiles/."""
    folder = root / machine
    (folder / "profiles").mkdir(parents=True)
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def test_the_study_shown_is_the_nearest_machines_and_reads_either_kind_of_file(tmp_path):
    result = bench_result()
    avx2 = {"device": "cpu", "device_name": "Some CPU", "isa": "AVX2", "flags": ["avx2"]}
    keep(tmp_path, "some-cpu-avx2", {f: json.dumps(result | {"environment": {"device": "cpu", "capability": CAP}})
                                     for f in batch_study.STUDY_BENCHES})
    other = CAP | {"cpu": "Other CPU", "isa": "AVX512", "flags": ["avx2", "avx512f"]}
    sweep = batch_study.bench_table(result).assign(machine="other")
    keep(tmp_path, "other-cpu-avx512", {"env.json": json.dumps({"environment": {"device": "cpu", "capability": other},
                                                                "rows": []}),
                                        batch_study.SWEEP_TABLE: sweep.to_csv(index=False)})
    keep(tmp_path, "half-cpu-avx2", {"env.json": json.dumps({"environment": {"device": "cpu", "capability": CAP}}),
                                     batch_study.STUDY_BENCHES[0]: json.dumps(result)})  # one prompt set: no study
    root = str(tmp_path)
    assert batch_study.study_machine(root, avx2) == "some-cpu-avx2"  # its own kind
    assert batch_study.study_machine(root, avx2 | {"device_name": "New CPU"}) == "some-cpu-avx2"  # the most alike
    assert batch_study.study_machine(root, avx2, "other-cpu-avx512") == "other-cpu-avx512"
    with pytest.raises(ValueError, match="machine must be 'nearest' or a folder .* keeps a batch-size study"):
        batch_study.study_machine(root, avx2, "half-cpu-avx2")
    # the benches, one per prompt set, priced from the profiles beside them; the sweep's table as kept
    (tmp_path / "some-cpu-avx2" / "profiles" / "b2.json").write_text(json.dumps(profile_at(2).to_dict()))
    shown = batch_study.stored_study(root, "some-cpu-avx2")
    assert len(shown) == 2 * len(batch_study.bench_table(result))
    assert shown.loc[shown["batch_size"] == 2, "profile_step_ms"].notna().all()
    assert batch_study.stored_study(root, "other-cpu-avx512")["machine"].eq("other").all()
    with pytest.raises(ValueError, match="keeps no batch-size study"):
        batch_study.stored_study(root, "half-cpu-avx2")


def test_a_studys_precisions_are_read_from_its_table_and_must_be_one():
    table = pd.DataFrame({"precision": ["target bfloat16, draft int8"] * 2})
    assert batch_study.precisions(table) == ("bfloat16", "int8")
    with pytest.raises(ValueError, match="must hold one 'target X, draft Y'"):
        batch_study.precisions(pd.DataFrame({"precision": ["target bfloat16, draft int8",
                                                           "target float32, draft int8"]}))


def test_the_reports_crossover_cell_says_not_predicted_where_only_b_1_was_predicted():
    from ssd.analysis.report import _crossover

    summary = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[4, 7, 10.5, 12, 13],
                    sd_total=[4, 6, 7, 8, 8], ar_total=[3, 5, 7, 9, 10])
    assert _crossover(summary) == "b = 4 (predicted b = 16)"
    at_b1 = summary.assign(predicted=summary["predicted"].where(summary["batch_size"] == 1))  # a bench's: b = 1 only
    assert _crossover(at_b1) == "b = 4 (not predicted)"
    never = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[1, 2, 3, 4, 5], sd_total=[9] * 5, ar_total=[3] * 5)
    assert _crossover(never) == "none up to b = 16 (predicted none up to b = 16)"
