"""K and B on auto (issue 11): the tuner re-decides as the estimates move, and auto runs stay lossless."""
import dataclasses
import json

import pytest
import matplotlib.pyplot as plt
import torch

from ssd.bench import frames
from ssd.bench import run as bench
from ssd.bench import machines, records
from ssd.analysis import experiments, plots, stored_files, style
from ssd.core import tuning
from ssd.checks import parse_methods, parse_variant
from ssd.cli import main
from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
from ssd.bench.lossless import ALPHA, chi_square_p, exact_target_distribution, sequence_index
from ssd.bench.methods import resolve
from ssd.models.tiny import tiny_pair
from ssd.core.fan_out import Calibrator
from ssd.models.capability import kind_line, kind_of, machine_kind
from ssd.pipeline.launch import PipelineConfig, close_pipelines, generate_ssd_pipeline
from ssd.core.latencies import Profile
from ssd.bench.prompts import load_prompts
from ssd.core.speculation import SSDConfig, generate_ssd


def toy_profile(verify_slope: float = 0.05, draft_ms: float = 20.0) -> Profile:
    """A GPU-like profile: a pass over n tokens costs 100 (1 + verify_slope (n - 1)) ms, B branch rows little more
    than one. A real Profile, so it crosses the wire to the pipeline's drafter."""
    target = {n: 100 * (1 + verify_slope * (n - 1)) for n in (1, 2, 3, 5, 9, 17)}
    draft = {n: draft_ms * (1 + 0.05 * (n - 1)) for n in (1, 2, 4, 8, 16, 32)}
    return Profile("toy", {"target": "float32", "draft": "float32"}, {}, [0], [1], 128, target, draft,
                   {"target": 1.0, "draft": 1.0}, {"target": 1, "draft": 1})


PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]


def test_the_sd_tuner_moves_k_with_the_acceptance_rate():
    calibrator = Calibrator(prior_a_p=0.6, prior_weight=tuning.PRIOR_WEIGHT, memory=tuning.MEMORY)
    tuner = tuning.sd_tuner(DecodeConfig(k="auto"), calibrator, toy_profile())
    start = tuner.k
    for _ in range(tuning.EVERY * 60):  # a draft the target always accepts: K climbs to the top
        calibrator.update(tuner.k, tuner.k, None)
        tuner.step()
    assert tuner.k == max(tuning.SD_KS) > start
    for _ in range(tuning.EVERY * 60):  # then one that is always rejected: K falls to the bottom
        calibrator.update(0, tuner.k, None)
        tuner.step()
    assert tuner.k == min(tuning.SD_KS)


def test_the_tuner_decides_only_every_few_rounds():
    choices = iter(range(1, 100))
    tuner = tuning.Tuner(lambda: tuning.Choice(next(choices), None, None), every=3)
    seen = []
    for _ in range(7):
        seen.append(tuner.k)
        tuner.step()
    assert seen == [1, 1, 1, 2, 2, 2, 3]
    with pytest.raises(ValueError, match="every"):
        tuning.Tuner(lambda: tuning.Choice(1, None, None), every=0)


def test_the_ssd_tuner_on_carried_estimates_moves_k_with_the_text():
    autotune = tuning.Autotune({1: toy_profile()})
    config = SSDConfig(k="auto", budget="auto", fan_out_strategy="calibrated")
    calibrator = autotune.calibrator(config)
    tuner = tuning.ssd_tuner(config, calibrator, autotune.profile(1))
    for _ in range(150):  # code: every draft accepted, t* the draft's first candidate
        calibrator.update(tuner.k, tuner.k, 1)
        tuner.step()
    long_k = tuner.k
    for _ in range(150):  # then prose: the first drafted token rejected, t* second
        calibrator.update(0, tuner.k, 2)
        tuner.step()
    assert long_k >= 6 and tuner.k <= 2
    assert autotune.calibrator(config) is calibrator  # the next answer goes on from here
    assert autotune.calibrator(SSDConfig(k="auto", budget=4)) is not calibrator  # other settings: their own
    assert tuning.Autotune().calibrator(config) is not calibrator  # another autotune: a fresh start


def test_the_ssd_tuner_takes_both_and_keeps_what_is_fixed():
    calibrator = Calibrator(prior_a_p=0.9)
    both = tuning.ssd_tuner(SSDConfig(k="auto", budget="auto"), calibrator, toy_profile())
    assert both.k in tuning.SSD_KS and both.budget in tuning.BUDGETS
    k_only = tuning.ssd_tuner(SSDConfig(k="auto", budget=6), calibrator, toy_profile())
    assert k_only.budget == 6
    b_only = tuning.ssd_tuner(SSDConfig(k=3, budget="auto"), calibrator, toy_profile())
    assert b_only.k == 3 and b_only.budget in tuning.BUDGETS
    fixed = tuning.ssd_tuner(SSDConfig(k=3, budget=6), None)
    assert (fixed.k, fixed.budget) == (3, 6)


def test_auto_without_latencies_says_how_to_get_them(pair):
    with pytest.raises(ValueError, match="Autotune.profile"):
        tuning.sd_tuner(DecodeConfig(k="auto"), Calibrator())
    how = r"^k, budget or backup is 'auto' but no autotune was given: pass autotune=Autotune\(\{1: ssd.bench.profile"
    for method, config in [(generate_sd, DecodeConfig(k="auto")), (generate_ssd, SSDConfig(backup="auto")),
                           (generate_ssd_pipeline, PipelineConfig(budget="auto"))]:  # before a drafter starts
        with pytest.raises(ValueError, match=how) as caught:
            method(pair, PROMPT, config, torch.Generator())
        assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match=r"^autotune holds no latency profile at batch size 2 \(it holds 1\)"):
        generate_sd(pair, [PROMPT, PROMPT], DecodeConfig(k="auto"), torch.Generator(),
                    autotune=tuning.Autotune({1: toy_profile()}))


@pytest.mark.parametrize("field,value,match", [
    ("k", "fast", r"k \(the draft length K\) must be an integer >= 1 or 'auto'"),
    ("k", 0, r"k \(the draft length K\) must be an integer >= 1 or 'auto'"),
    ("budget", "lots", "budget"),
    ("a_p", 1.5, r"a_p must lie in \[0, 1\]"),
])
def test_bad_auto_settings_fail_with_one_line(field, value, match):
    with pytest.raises(ValueError, match=match):
        SSDConfig(**{field: value})


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(agreement_noise=0.3, seed=3)


def ar_tokens(pair, n):
    return generate_ar(pair, PROMPT, DecodeConfig(max_new_tokens=n), torch.Generator().manual_seed(0))[0]


def test_greedy_sd_on_auto_is_ar_and_its_k_moves(pair, monkeypatch):
    monkeypatch.setattr(tuning, "EVERY", 1)
    config = DecodeConfig(k="auto", max_new_tokens=40, a_p=0.0)
    tokens, trace = generate_sd(pair, PROMPT, config, torch.Generator().manual_seed(0),
                                autotune=tuning.Autotune({1: toy_profile()}))
    assert tokens == ar_tokens(pair, 40)
    assert trace.rounds[0].draft_len == 1  # the prior a_p = 0: draft as little as possible
    assert len({r.draft_len for r in trace.rounds}) > 1  # then the run's acceptance rate moved K


@pytest.mark.parametrize("strategy", ["calibrated", "uniform"])
def test_greedy_ssd_on_auto_is_ar_and_records_its_k_and_b(pair, strategy):
    config = SSDConfig(k="auto", budget="auto", fan_out_strategy=strategy, max_new_tokens=40)
    tokens, trace = generate_ssd(pair, PROMPT, config, torch.Generator().manual_seed(0),
                                 autotune=tuning.Autotune({1: toy_profile()}))
    assert tokens == ar_tokens(pair, 40)
    assert all(r.budget == sum(r.fan_out) and r.budget in tuning.BUDGETS for r in trace.rounds)


def test_an_auto_run_starts_where_the_last_answer_with_its_autotune_on_its_settings_left_the_estimates(pair):
    config = SSDConfig(k="auto", budget="auto", fan_out_strategy="calibrated", max_new_tokens=24)
    other = SSDConfig(k="auto", budget=4, fan_out_strategy="calibrated", max_new_tokens=24)

    def first_a_p(config, autotune):
        tokens, trace = generate_ssd(pair, PROMPT, config, torch.Generator().manual_seed(0), autotune=autotune)
        assert tokens == ar_tokens(pair, 24)
        return trace.rounds[0].a_p, trace.rounds[-1].a_p

    autotune = tuning.Autotune({1: toy_profile()})
    start, end = first_a_p(config, autotune)
    assert start == config.a_p  # the first answer: the prior
    assert first_a_p(config, autotune)[0] != config.a_p  # the next: the estimates the first left
    assert first_a_p(other, autotune)[0] == other.a_p  # other settings: their own estimates, from the prior
    assert first_a_p(config, tuning.Autotune({1: toy_profile()})) == (start, end)  # a new one: the prior, the same run


def test_a_windowed_calibrator_keeps_the_last_ranks_of_each_kind():
    calibrator = Calibrator(window=3)
    for rank in range(1, 8):
        calibrator.update(1, 4, rank)  # a recovered position
    calibrator.update(4, 4, 9)  # the bonus one
    assert calibrator.ranks == {"recovered": [5, 6, 7], "bonus": [9]}


@pytest.mark.integration
def test_the_pipeline_on_auto_is_ar_and_matches_one_process(pair):
    fields = dict(k="auto", budget="auto", fan_out_strategy="calibrated", max_new_tokens=32, temperature=0.8)
    close_pipelines()  # both ranks start from the prior: a fresh Autotune here, a fresh drafter process there
    autotune = tuning.Autotune({1: toy_profile(draft_ms=5.0)})
    one = [generate_ssd(pair, PROMPT, SSDConfig(**fields), torch.Generator().manual_seed(s), autotune=autotune)
           for s in (1, 2)]
    try:  # the second answer of each starts from the first's estimates: on the drafter's rank in the pipeline
        verifier = tuning.Autotune({1: toy_profile(draft_ms=5.0)})  # gives the latencies; the drafter learns
        two = [generate_ssd_pipeline(pair, PROMPT, PipelineConfig(**fields), torch.Generator().manual_seed(s),
                                     autotune=verifier) for s in (1, 2)]
        greedy = generate_ssd_pipeline(pair, PROMPT, PipelineConfig(**(fields | {"temperature": 0.0})),
                                       torch.Generator().manual_seed(1), autotune=verifier)
    finally:
        close_pipelines()
    for (tokens, trace), (expected, expected_trace) in zip(two, one):
        assert tokens == expected  # the same draws on two ranks: the drafter tells the verifier the K it drew for
        assert [r.draft_len for r in trace.rounds] == [r.draft_len for r in expected_trace.rounds]
        assert [r.a_p for r in trace.rounds] == pytest.approx([r.a_p for r in expected_trace.rounds])
    assert two[1][1].rounds[0].a_p != fields.get("a_p", SSDConfig().a_p)  # carried, not the prior
    assert greedy[0] == ar_tokens(pair, 32)


@pytest.mark.integration
def test_sampled_outputs_on_auto_follow_the_target_distribution(monkeypatch):
    monkeypatch.setattr(tuning, "EVERY", 1)
    pair = tiny_pair(vocab_size=6, agreement_noise=0.2, seed=2)
    prompt, n_new, temperature, n = [1, 4, 2], 4, 0.9, 2000
    config = DecodeConfig(k="auto", temperature=temperature, max_new_tokens=n_new, a_p=0.0)
    autotune = tuning.Autotune({1: toy_profile()})
    expected = exact_target_distribution(pair, prompt, n_new, temperature)
    counts, ks = torch.zeros(len(expected)), set()
    for seed in range(n):
        tokens, trace = generate_sd(pair, prompt, config, torch.Generator().manual_seed(seed), autotune=autotune)
        counts[sequence_index(tokens, pair.vocab_size)] += 1
        ks |= {r.draft_len for r in trace.rounds}
    assert len(ks) > 1  # K changed within runs
    assert chi_square_p(counts, expected) > ALPHA


def test_method_variants_parse_and_fail_clearly():
    assert parse_variant("ssd-pipeline:k=auto:budget=8") == ("ssd-pipeline", {"k": "auto", "budget": 8})
    assert parse_methods("ar,sd:k=2,sd:k=auto") == ["ar", "sd:k=2", "sd:k=auto"]
    _, config, batch_size = resolve("sd:k=6:batch_size=2", DecodeConfig())
    assert config.k == 6 and batch_size == 2 and resolve("sd", DecodeConfig(), batch_size=3).batch_size == 3
    with pytest.raises(ValueError, match="FIELD=VALUE"):
        parse_variant("sd:temperature=1")
    with pytest.raises(ValueError, match="neither an integer nor 'auto'"):
        parse_variant("sd:k=two")
    with pytest.raises(ValueError, match="lacks"):
        resolve("sd:budget=4", DecodeConfig())
    with pytest.raises(ValueError, match="twice"):
        parse_methods("sd,sd")


def test_the_command_line_takes_auto_and_refuses_junk(capsys):
    from ssd.cli import build_parser

    args = build_parser().parse_args(["bench", "--k", "auto", "--budget", "auto"])
    assert (args.k, args.budget) == ("auto", "auto")
    assert build_parser().parse_args(["bench", "-k", "6"]).k == 6
    with pytest.raises(SystemExit):
        main(["generate", "--pair", "tiny", "--prompt", "x", "-k", "lots"])
    assert "must be an integer or auto, got 'lots'" in capsys.readouterr().err
    assert main(["hit-rates", "--pair", "tiny", "-k", "auto", "--prompts", "humaneval:1"]) == 2
    assert "k='auto' changes K as the run goes" in capsys.readouterr().err


def test_hf_sd_refuses_auto(pair):
    from ssd.bench.peers import generate_hf_sd

    with pytest.raises(ValueError, match="hf-sd drafts a fixed K"):
        generate_hf_sd(pair, PROMPT, DecodeConfig(k="auto"), torch.Generator())


SUMMARY = [  # a bench summary of SD variants, as its JSON holds it
    {"method": "ar", "decode_tokens_per_s": 2.0, "mean_k": None, "mean_budget": None},
    {"method": "sd:k=2", "decode_tokens_per_s": 4.0, "mean_k": 2.0, "mean_budget": None},
    {"method": "sd:k=4", "decode_tokens_per_s": 5.0, "mean_k": 3.9, "mean_budget": None},
    {"method": "sd:k=auto", "decode_tokens_per_s": 4.9, "mean_k": 3.4, "mean_budget": None},
]


def test_a_bench_of_variants_reads_as_a_grid_and_auto_is_held_against_it():
    variants = experiments.variant_summary(SUMMARY)
    assert list(variants["k"]) == [None, 2, 4, "auto"] and list(variants["base"]) == ["ar", "sd", "sd", "sd"]
    verdict = experiments.auto_against_fixed(variants, "sd", "sd:k=4")
    assert verdict["best_fixed"] == "sd:k=4" and verdict["auto_over_best"] == pytest.approx(0.98)
    assert verdict["auto_over_default"] == pytest.approx(0.98) and verdict["mean_k"] == 3.4
    with pytest.raises(ValueError, match="one auto variant"):
        experiments.auto_against_fixed(variants[variants.k != "auto"], "sd", "sd:k=4")


def test_the_predicted_surfaces_hold_what_the_choice_takes_the_best_of():
    law = Calibrator(prior_a_p=0.8).miss_model()
    surface = frames.ssd_surface(0.8, law, toy_profile(), (2, 4), (1, 8))
    assert list(zip(surface.k, surface.budget)) == [(2, 1), (2, 8), (4, 1), (4, 8)]
    best = surface.loc[surface.tokens_per_s.idxmax()]
    choice = tuning.choose_ssd_k_budget(0.8, law, toy_profile(), (2, 4), (1, 8), strategy="calibrated")
    assert (best.k, best.budget) == (choice.k, choice.budget) and surface.p_hit.between(0, 1).all()
    curve = frames.sd_curve(0.8, toy_profile())
    assert curve.loc[curve.tokens_per_s.idxmax(), "k"] == tuning.choose_sd_k(0.8, toy_profile()).k
    fig = plots.sd_k_speeds(curve, experiments.variant_summary(SUMMARY).query("base == 'sd'"))
    assert len(fig.axes) == 1
    plt.close(fig)


AMX_ENVIRONMENT = {"device": "cpu", "device_name": "Intel(R) Xeon(R) Processor", "cpu_count": 2, "capability": {
    "cpu": "Intel(R) Xeon(R) Processor", "isa": "AVX512", "native": ["bfloat16", "float16"], "cores": 2,
    "flags": ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8"],
    "torch": "2.13.0+cpu", "int8_engine": "x86"}}  # as the Intel Xeon with AMX recorded its benches


def stored_bench(pair, **precision) -> dict:
    """A stored bench of `pair` as `python -m ssd bench --json` writes it, measured on this kind of machine."""
    return {"args": {"pair": pair.name}, "precision": pair.precisions.as_dict() | precision,
            "environment": records.environment(pair.target.device), "rows": [], "summary": SUMMARY}


def test_a_stored_bench_is_used_only_for_its_own_pair(tmp_path, pair):
    path = tmp_path / "bench.json"
    assert stored_files.stored_or_run(str(path), pair, [], ["ar"], DecodeConfig(), measure_missing=False) is None
    path.write_text(json.dumps(stored_bench(pair)))
    shown = stored_files.stored_or_run(str(path), pair, [], ["ar"], DecodeConfig(), measure_missing=False)
    assert shown["source"].name == path.name  # the file as the report reads it (a Source)
    assert stored_files.stored_bench(str(path), pair)["source"].name == path.name
    assert stored_files.stored_bench(str(tmp_path / "none.json"), pair) is None
    path.write_text(json.dumps(stored_bench(pair) | {"args": {"pair": "another"}}))
    assert stored_files.stored_bench(str(path), pair) is None  # measured on another pair: not this one's
    assert "not on" in stored_files.not_stored_line(str(path), pair)


def test_a_stored_bench_is_recognised_by_its_precisions_not_by_the_timings_of_auto(tmp_path, pair):
    """The auto rule's timings and its reason never repeat, not even on the machine that stored the bench."""
    path = tmp_path / "bench.json"
    other_timings = {"reason": "auto: target float32 (float32 1013 ms, bfloat16 1467 ms)",
                     "measured_ms": {"target": {"float32": 1013.2, "bfloat16": 1467.5}, "draft": {"float32": 210.7}}}
    path.write_text(json.dumps(stored_bench(pair, **other_timings)))
    found = stored_files.stored_bench(str(path), pair)
    assert found["source"].name == path.name and found["elsewhere"] is None  # this kind of machine: no note
    for role in ("target", "draft"):
        path.write_text(json.dumps(stored_bench(pair, **{role: "int8"})))
        assert stored_files.stored_bench(str(path), pair) is None, role  # another precision: another model's numbers
        assert stored_files.stored_or_run(str(path), pair, [], ["ar"], DecodeConfig(), measure_missing=False) is None
        assert f"{role} int8" in stored_files.not_stored_line(str(path), pair)


def test_a_stored_bench_answers_only_for_the_forwards_it_ran_on(tmp_path, pair):
    """A bench stored before forwards were recorded ran eager; a compiled pair's numbers are another model's."""
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(stored_bench(pair)))
    compiled = dataclasses.replace(pair, forward="compiled")
    assert stored_files.stored_bench(str(path), pair)["source"].name == path.name
    assert stored_files.stored_bench(str(path), compiled) is None
    path.write_text(json.dumps(stored_bench(pair) | {"forward": "compiled"}))
    assert stored_files.stored_bench(str(path), compiled)["elsewhere"] is None
    assert stored_files.stored_bench(str(path), pair) is None
    note = stored_files.stored_bench(str(path), pair, other_precisions=True)["elsewhere"]
    assert "with compiled forwards (this pair here: eager)" in note


def test_a_bench_stored_on_another_kind_of_machine_is_shown_with_a_note(tmp_path, pair):
    path = tmp_path / "bench.json"
    result = stored_bench(pair)
    here = result["environment"]["capability"]
    # Another kind than this machine's, whichever this is: AVX2 alone where it has more, AVX-512 where it has not
    isa, flags = ("AVX2", ["avx2"]) if here["flags"] != ["avx2"] else ("AVX512", ["avx2", "avx512f"])
    cap = here | {"isa": isa, "flags": flags, "cores": 64}
    result["environment"] |= {"capability": cap, "cpu_count": 64, "date": "2020-01-01T00:00:00+00:00"}
    path.write_text(json.dumps(result))
    note = stored_files.stored_bench(str(path), pair)["elsewhere"]
    assert "another kind of machine" in note and f"{isa} ({', '.join(flags)})" in note and "\n" not in note
    result["environment"] = stored_bench(pair)["environment"] | {"cpu_count": 64, "date": "2020-01-01T00:00:00+00:00",
                                                                 "torch_threads": 7}
    path.write_text(json.dumps(result))
    # dates, threads and core counts do not make a kind
    assert stored_files.stored_bench(str(path), pair)["elsewhere"] is None
    path.write_text(json.dumps({k: v for k, v in result.items() if k != "environment"}))
    # stored before environments were
    assert "did not record" in stored_files.stored_bench(str(path), pair)["elsewhere"]
    kind = machine_kind("cpu")
    assert kind_of(records.environment("cpu")) == kind and kind_line(kind_of({"device": "cuda:0",
                                                                             "device_name": "NVIDIA H200"})) == "NVIDIA H200"


def test_a_bench_at_other_precisions_is_shown_only_where_asked_and_says_at_which(tmp_path, pair):
    """Notebook 07 on a machine whose auto precision differs from the stored benches' (issue 49): shown, not empty."""
    path = tmp_path / "bench.json"
    other = "bfloat16" if pair.precisions.target != "bfloat16" else "float16"
    path.write_text(json.dumps(stored_bench(pair, target=other)))
    assert stored_files.stored_bench(str(path), pair) is None  # by default another precision is another model's numbers
    found = stored_files.stored_bench(str(path), pair, other_precisions=True)
    assert found["source"].name == path.name
    assert f"at target {other}, draft {pair.precisions.draft}" in found["elsewhere"]
    assert "another kind of machine" not in found["elsewhere"] and "\n" not in found["elsewhere"]
    shown = stored_files.stored_or_run(str(path), pair, [], ["ar"], DecodeConfig(), measure_missing=True,
                                  other_precisions=True)
    assert shown["source"].name == path.name  # shown as stored, not measured
    path.write_text(json.dumps(stored_bench(pair, target=other) | {"args": {"pair": "another"}}))
    assert stored_files.stored_bench(str(path), pair, other_precisions=True) is None  # another pair is never shown


def test_the_machine_whose_benches_are_shown_is_named_or_the_nearest_that_has_them(tmp_path, pair):
    root = tmp_path / "data"
    here = machines.this_machine()
    assert stored_files.machine_to_show(str(root), "nearest", having="b.json") is None  # nothing stored: none
    for name, env in (("intel-xeon-amx", AMX_ENVIRONMENT), (here, records.environment("cpu"))):
        (root / name).mkdir(parents=True, exist_ok=True)  # one folder where this machine is the AMX one
        (root / name / "a.json").write_text(json.dumps(stored_bench(pair) | {"environment": env}))
    (root / "intel-xeon-amx" / "b.json").write_text("{}")
    if here != "intel-xeon-amx":
        assert stored_files.machine_to_show(str(root), "nearest", having="b.json") == "intel-xeon-amx"
    assert stored_files.machine_to_show(str(root), "nearest", having="a.json") == here  # this kind's own first
    assert stored_files.machine_to_show(str(root), "here") == here
    assert stored_files.machine_to_show(str(root), "intel-xeon-amx") == "intel-xeon-amx"
    with pytest.raises(ValueError, match="machine must be 'nearest', 'here' or a stored machine"):
        stored_files.machine_to_show(str(root), "mars")


def test_a_stored_bench_is_priced_on_the_profile_of_its_own_machine(tmp_path, pair):
    folder = tmp_path / "intel-xeon-amx"
    (folder / "profiles").mkdir(parents=True)
    bench = stored_bench(pair) | {"environment": AMX_ENVIRONMENT,
                                  "args": {"pair": pair.name, "verifier_cores": "0", "drafter_cores": "1"}}
    assert stored_files.profile_of(bench, str(folder)) is None  # the folder keeps none
    profile = toy_profile()
    profile.pair, profile.capability = pair.name, AMX_ENVIRONMENT["capability"]
    profile.precisions = pair.precisions.as_dict()
    (folder / "profiles" / "not_a_profile.json").write_text("{}")
    for name, changed in (("b8.json", {"batch_size": 8}), ("other_cores.json", {"drafter_cores": [2]}),
                          ("here.json", {"capability": records.environment("cpu")["capability"]}),
                          ("amx.json", {})):
        (folder / "profiles" / name).write_text(json.dumps(profile.to_dict() | changed))
    found = stored_files.profile_of(bench, str(folder))
    assert found is not None and found.batch_size == 1 and found.drafter_cores == [1]
    assert found.capability == AMX_ENVIRONMENT["capability"]  # the bench's kind of machine, not this one's
    draft = "int8" if pair.precisions.draft != "int8" else "float32"
    other = bench | {"precision": bench["precision"] | {"draft": draft}}
    assert stored_files.profile_of(other, str(folder)) is None  # another precision: another profile
    assert stored_files.profile_of(bench | {"forward": "compiled"}, str(folder)) is None  # another forward too


def test_the_rounds_a_tuner_learns_from_are_read_where_stored(tmp_path, pair):
    path = tmp_path / "rounds.csv"
    path.write_text("draft_len,accepted,rank,prompt_id\n4,4,1,p0\n4,2,,p0\n4,3,3,p1\n")
    rounds, line = experiments.rounds_to_learn_from(str(path), pair, [], SSDConfig())  # runs nothing: no prompts
    assert len(rounds) == 3 and line == f"{path}: 3 stored rounds of 2 prompts"
    assert experiments.calibrator_from(rounds).tested == 4 + 3 + 4  # accepted, plus the rejected one where k < K


def test_a_result_line_names_where_a_shown_bench_was_measured(pair, tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(stored_bench(pair)))
    result = stored_files.stored_bench(str(path), pair) | {"elsewhere": "measured on another kind"}
    line = style.result_line(result, pair, "Intel Xeon, AVX512")
    assert line.startswith(f"Intel Xeon, AVX512 · target {pair.precisions.target}, draft {pair.precisions.draft}")
    assert line.endswith("stored, not measured here")
    assert style.result_line(result | {"elsewhere": None}, pair, "Intel").endswith("stored, on this kind of machine")
    assert style.result_line(result | {"source": None}, pair, "Intel") == style.pair_line(pair)  # measured here


def test_a_bench_summarises_each_variant_from_its_own_rounds(pair):
    config = SSDConfig(max_new_tokens=12, fan_out_strategy="calibrated")
    result = bench.run_bench(pair, load_prompts("humaneval:1"), ["ssd:budget=0", "ssd:budget=8"], config,
                             progress=False)
    hit = {s["method"]: s["hit_rate"] for s in result["summary"]}
    assert hit["ssd:budget=0"] == 0.0 and hit["ssd:budget=8"] > 0.0  # B = 0 never hits; its rounds are its own
