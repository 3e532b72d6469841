"""The notebooks' experiment functions and lossless checks, on tiny random pairs."""
import dataclasses
import math

import pandas as pd
import pytest

from ssd.analysis import experiments
from ssd.bench import stats
from ssd.core.decoding import DecodeConfig
from ssd.bench.lossless import ALPHA, chi_square_p, distribution_check, exact_target_distribution, greedy_identical
from ssd.models.loading import load_pair
from ssd.models.tiny import tiny_pair
from ssd.bench.prompts import load_prompts
from ssd.core.speculation import SSDConfig


@pytest.fixture(scope="module")
def pair():
    return load_pair("tiny")


@pytest.fixture(scope="module")
def prompts():
    return load_prompts("humaneval[0:3]")


def test_a_tiny_pair_encodes_any_prompt_set_with_its_toy_tokenizer(pair, prompts):
    ids = pair.tokenizer(prompts[0].text)["input_ids"]
    assert ids and all(0 <= i < pair.vocab_size for i in ids)
    assert pair.tokenizer.decode([3, 1]) == "<3><1>"


def test_decode_gives_one_row_per_prompt_and_the_rounds_of_each(pair, prompts):
    runs, rounds, tokens = experiments.decode(pair, prompts, "sd", DecodeConfig(k=3, max_new_tokens=12), progress=False)
    assert list(runs.prompt_id) == [p.id for p in prompts] == list(tokens)
    assert (runs.new_tokens == 12).all()
    # a_p counts only the tokens tested; acceptance_rate also counts those after a rejection, so it is never above
    assert (runs.a_p >= runs.acceptance_rate).all() and runs.a_p.between(0, 1).all()
    for row in runs.itertuples():
        assert rounds[rounds.prompt_id == row.prompt_id].new_tokens.sum() == row.new_tokens
        assert row.tokens_per_round == pytest.approx(row.new_tokens / row.rounds)


def test_sweep_field_varies_one_config_field_and_labels_the_rows(pair, prompts):
    runs, rounds, tokens = experiments.sweep_field(pair, prompts, "sd", DecodeConfig(max_new_tokens=10), "k", [1, 4],
                                                   progress=False)
    assert sorted(runs.k.unique()) == [1, 4] and sorted(rounds.k.unique()) == [1, 4]
    assert rounds[rounds.k == 1].draft_len.max() == 1 and rounds[rounds.k == 4].draft_len.max() == 4
    ar, _, ar_tokens = experiments.decode(pair, prompts, "ar", DecodeConfig(max_new_tokens=10), progress=False)
    assert tokens[1] == tokens[4] == ar_tokens  # greedy: every K gives the target's tokens


def test_ap_sensitivity_has_a_row_per_prompt_and_assumed_a_p_plus_uniform(pair, prompts):
    config = SSDConfig(k=3, temperature=0.8, max_new_tokens=12, budget=1)
    rounds = experiments.ssd_rounds(pair, prompts, config, progress=False)
    sens = experiments.ap_sensitivity(rounds, budget=6, k=3, a_ps=[0.2, 0.8], r=1.0)
    assert len(sens) == len(prompts) * 3
    assert set(sens.strategy) == {"geometric", "uniform"}
    assert sens.hit_rate.between(0, 1).all()
    # geometric believing a_p with the same budget is a different split from uniform: not always the same hit rate
    curves = experiments.hit_rate_curves(rounds, [6], 3, ["uniform"])
    assert sorted(curves.hit_rate) == sorted(sens[sens.strategy == "uniform"].hit_rate)


def test_greedy_identical_reports_identity_per_prompt_and_method(pair, prompts):
    frame = greedy_identical(pair, prompts, ["sd", "ssd"], SSDConfig(k=3, max_new_tokens=10, budget=4),
                             progress=False)
    assert len(frame) == 2 * len(prompts) and frame.identical_to_target.all() and frame.first_difference.isna().all()
    with pytest.raises(ValueError, match="temperature must be 0"):
        greedy_identical(pair, prompts, ["sd"], DecodeConfig(temperature=0.5))


@pytest.mark.integration
def test_distribution_check_passes_sd_and_fails_outputs_from_another_distribution():
    toy = tiny_pair(vocab_size=6, agreement_noise=0.2, seed=2)
    prompt, config = [1, 4, 2], DecodeConfig(k=2, temperature=0.9, max_new_tokens=3)
    good = distribution_check(toy, prompt, "sd", config, samples=800, progress=False)
    assert good["p_value"] > ALPHA and 0.2 < good["acceptance_rate"] < 0.95
    assert good["table"].observed.sum() == 800 and len(good["table"]) == 6**3
    # The draft sampled alone (AR on a pair whose target is the draft) passes against its own distribution...
    drafted = distribution_check(dataclasses.replace(toy, target=toy.draft), prompt, "ar", config, samples=800,
                                 progress=False)
    assert drafted["p_value"] > ALPHA
    # ...and fails against the real target's: the check can tell the two apart.
    observed = drafted["table"].sort_values("sequence").observed.to_numpy()
    assert chi_square_p(observed, exact_target_distribution(toy, prompt, 3, 0.9)) < ALPHA
    with pytest.raises(ValueError, match="temperature must be > 0"):
        distribution_check(toy, prompt, "sd", DecodeConfig(), samples=1)


def test_paired_difference_pairs_settings_per_prompt():
    import pandas as pd

    frame = pd.DataFrame({"set": ["x"] * 6, "prompt_id": [1, 2, 3] * 2, "c": [1.0] * 3 + [0.1] * 3,
                          "hit_rate": [0.5, 0.6, 0.7, 0.6, 0.7, 0.9]})
    out = stats.paired_difference(frame, ["set"], "c", 0.1, 1.0, "hit_rate").iloc[0]
    assert out["mean"] == pytest.approx(0.4 / 3) and out["n"] == 3
    assert out.ci_low < out["mean"] < out.ci_high
    with pytest.raises(ValueError, match="c has no rows for \\[0.5\\]"):
        stats.paired_difference(frame, ["set"], "c", 0.5, 1.0, "hit_rate")



def test_speedups_are_paired_ratios_per_prompt_over_the_baseline():
    import pandas as pd

    rows = pd.DataFrame({"set": ["x"] * 6 + ["y"] * 2, "prompt_id": [1, 2, 3] * 2 + [4, 4],
                         "method": ["sd"] * 3 + ["ar"] * 3 + ["ar", "sd"],
                         "tokens_per_s": [3.0, 4.0, 9.0, 2.0, 2.0, 3.0, 5.0, 4.0]})
    out = stats.speedups(rows, "ar", ["set"])
    assert list(out.columns) == ["set", "prompt_id", "method", "speedup"] and set(out.method) == {"sd"}
    assert out.set_index("prompt_id").speedup.to_dict() == {1: 1.5, 2: 2.0, 3: 3.0, 4: 0.8}
    ci = stats.mean_ci(out, ["set", "method"], "speedup").set_index("set")
    assert ci.loc["x", "mean"] == pytest.approx(6.5 / 3) and ci.loc["x", "n"] == 3
    # A prompt the baseline did not run is left out, not counted as a ratio of NaN.
    assert len(stats.speedups(rows.drop(index=3), "ar", ["set"])) == 3
    with pytest.raises(ValueError, match="baseline must be one of the methods"):
        stats.speedups(rows, "hf-ar")
    with pytest.raises(ValueError, match="missing \\['wall_s'\\]"):
        stats.speedups(rows, "ar", value="wall_s")

def test_atomic_writes_leave_ordinary_file_permissions(tmp_path):
    import os

    import pandas as pd

    from ssd.files import _umask, write_csv

    write_csv(pd.DataFrame({"a": [1]}), str(tmp_path / "out.csv"))
    assert os.stat(tmp_path / "out.csv").st_mode & 0o777 == 0o666 & ~_umask()
    assert os.listdir(tmp_path) == ["out.csv"]


def test_mean_ci_gives_no_interval_from_fewer_than_3_and_keeps_rates_in_0_1():
    frame = pd.DataFrame({"g": [1, 1, 1, 2, 2], "hit_rate": [1.0, 1.0, 0.4, 0.5, 0.6]})
    out = stats.mean_ci(frame, "g", "hit_rate").set_index("g")
    assert out.loc[1, "ci_high"] == 1.0 and 0.0 <= out.loc[1, "ci_low"] < out.loc[1, "mean"]
    assert math.isnan(out.loc[2, "ci_low"]) and math.isnan(out.loc[2, "ci_high"]) and out.loc[2, "mean"] == 0.55
    # The same numbers as a value that is not a rate: the t-interval as it is, past 1.
    unbounded = stats.mean_ci(frame.rename(columns={"hit_rate": "speedup"}), "g", "speedup").set_index("g")
    assert unbounded.loc[1, "ci_high"] > 1.0


def test_the_timeline_summary_tells_turns_from_overlap():
    spans = pd.DataFrame(  # each method's first round, which may hold the prompt's pass, is left out
        [("sd", None, "prefill_s", "target", 0.0, 1.0), ("sd", 0, "verify_s", "target", 0.0, 1.0),
         ("sd", 1, "draft_s", "draft", 1.0, 1.5),
         ("sd", 1, "verify_s", "target", 1.5, 2.0), ("sd", 2, "draft_s", "draft", 2.0, 2.5),
         ("sd", 2, "verify_s", "target", 2.5, 3.0), ("pipe", 0, "verify_s", "target", 0.0, 1.0),
         ("pipe", 1, "verify_s", "target", 1.0, 1.5), ("pipe", 1, "wait_s", "target", 1.5, 2.0),
         ("pipe", 1, "prespec_s", "draft", 1.0, 1.8), ("pipe", 1, "draft_s", "draft", 1.9, 2.0)],
        columns=["method", "round", "phase", "lane", "start_s", "end_s"])
    summary = experiments.timeline_summary(spans).set_index("method")
    sd, pipe = summary.loc["sd"], summary.loc["pipe"]
    assert sd["rounds"] == 2 and sd["decode_s"] == 2.0 and sd["verify_ms"] == 500 and sd["draft_ms"] == 500
    assert sd["target_busy"] == 0.5 and sd["draft_busy"] == 0.5 and sd["both_busy"] == 0  # they take turns
    assert pipe["wait_ms"] == 500 and pipe["prespec_ms"] == pytest.approx(800)
    assert pipe["target_busy"] == 0.5 and pipe["draft_busy"] == pytest.approx(0.9)  # the wait is no work
    assert pipe["both_busy"] == pytest.approx(0.5)  # pre-speculation under the whole verify pass


def verify_spans(method: str, ms: list[float]) -> list[tuple]:
    """One verify span a round (round 0 too, which phase_apart leaves out), each `ms` long."""
    rows, start = [(method, 0, "verify_s", "target", 0.0, 5.0)], 5.0
    for r, length in enumerate(ms, start=1):
        rows.append((method, r, "verify_s", "target", start, start + length / 1000))
        start += length / 1000 + 0.1
    return rows


def test_a_phase_is_longer_only_where_the_rounds_spread_allows_it():
    columns = ["method", "round", "phase", "lane", "start_s", "end_s"]
    clear = pd.DataFrame(verify_spans("sd", [280, 275, 290, 282, 279])
                         + verify_spans("pipe", [400, 410, 395, 402, 405]), columns=columns)
    table = experiments.phase_apart(clear, "pipe", "sd")
    assert table.index.tolist() == ["pipe", "sd"] and table["apart"].all()
    assert table.loc["sd", "mean"] == pytest.approx(281.2) and (table["n"] == 5).all()  # round 0 left out
    # The same means with a spread that overlaps: not apart, though the mean is larger
    noisy = pd.DataFrame(verify_spans("sd", [200, 360, 280, 150, 416])
                         + verify_spans("pipe", [300, 290, 310, 305, 295]), columns=columns)
    noisy_table = experiments.phase_apart(noisy, "pipe", "sd")
    assert noisy_table.loc["pipe", "mean"] > noisy_table.loc["sd", "mean"] and not noisy_table["apart"].any()
    # Two rounds give no interval: never apart
    short = pd.DataFrame(verify_spans("sd", [1, 1]) + verify_spans("pipe", [9, 9]), columns=columns)
    assert not experiments.phase_apart(short, "pipe", "sd")["apart"].any()
