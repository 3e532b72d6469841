"""ssd.analysis.plots on small synthetic frames: the right marks, deterministic PNGs written atomically, token roles."""
import hashlib
import os

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402

from ssd.analysis import coloured_text, plots, style, timeline# noqa: E402
from ssd.bench.frames import rounds_frame, spans_frame, token_roles  # noqa: E402
from ssd.bench.stats import mean_ci  # noqa: E402
from ssd.core.fan_out import fit_miss_rate, fit_power_law, outcome_probabilities  # noqa: E402
from ssd.core.theory import expected_tokens  # noqa: E402
from ssd.core.trace import Round, Trace  # noqa: E402

PROMPTS = ["p0", "p1", "p2"]


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def errorbars(fig):
    return [c for c in fig.axes[0].containers if isinstance(c, ErrorbarContainer)]


def png_digest(fig, tmp_path, name="fig.png"):
    path = style.save(fig, tmp_path / "out" / name)
    assert os.path.getsize(path) > 0
    assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert not [f for f in os.listdir(tmp_path / "out") if f.startswith(".tmp-")]
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def acceptance_frame(temperatures=(0.0, 1.0)):
    rows = []
    for t in temperatures:
        for k in (1, 2, 4, 8):
            for i, p in enumerate(PROMPTS):
                a = 0.8 - 0.03 * k - 0.1 * t + 0.02 * i
                rows.append({"k": k, "prompt_id": p, "temperature": t, "acceptance_rate": a,
                             "tokens_per_round": expected_tokens(a, k) - 0.1 * i})
    return pd.DataFrame(rows)


def hit_frame():
    rows = []
    for strategy in ("uniform", "geometric", "calibrated"):
        for b in (0, 1, 2, 4, 8, 16, 32):
            for i, p in enumerate(PROMPTS):
                rows.append({"prompt_id": p, "strategy": strategy, "budget": b,
                             "hit_rate": 0.0 if b == 0 else min(1.0, 0.2 + 0.15 * np.log2(b + 1) + 0.03 * i),
                             "rounds": 20})
    return pd.DataFrame(rows)


def test_save_creates_folder_atomically_and_rejects_other_formats(tmp_path):
    fig = plots.acceptance_vs_k(acceptance_frame())
    path = style.save(fig, tmp_path / "a" / "b" / "acc.png")
    assert path == str(tmp_path / "a" / "b" / "acc.png") and os.path.getsize(path) > 0
    assert os.listdir(tmp_path / "a" / "b") == ["acc.png"]
    with pytest.raises(ValueError, match="png"):
        style.save(fig, tmp_path / "acc.pdf")


def test_acceptance_vs_k_hue_and_ci(tmp_path):
    frame = acceptance_frame()
    fig = plots.acceptance_vs_k(frame)
    bars = errorbars(fig)
    assert len(bars) == 2  # one series per temperature
    ax = fig.axes[0]
    assert ax.get_xlabel() == "draft length K" and ax.get_ylabel() == "acceptance rate a"
    assert ax.get_legend().get_title().get_text() == f"temperature\n({style.RATE_CI_LABEL})"
    # The drawn means and bars are mean_ci's, over prompts.
    line = bars[0].lines[0]
    expected = mean_ci(frame[frame.temperature == 0.0], "k", "acceptance_rate").sort_values("k")
    np.testing.assert_allclose(line.get_ydata(), expected["mean"])
    caps = bars[0].lines[1]
    np.testing.assert_allclose(np.max([c.get_ydata() for c in caps], axis=0), expected["ci_high"])
    assert png_digest(fig, tmp_path, "1.png") == png_digest(plots.acceptance_vs_k(frame), tmp_path, "2.png")
    # Without temperature: one series.
    assert len(errorbars(plots.acceptance_vs_k(frame[frame.temperature == 0.0].drop(columns="temperature")))) == 1


def test_one_prompt_draws_no_interval_and_missing_columns_are_named():
    frame = acceptance_frame((0.0,))
    fig = plots.acceptance_vs_k(frame[frame.prompt_id == "p0"])
    (bar,) = errorbars(fig)
    np.testing.assert_allclose(*[c.get_ydata() for c in bar.lines[1]])  # zero-length bar, not NaN
    # None where nothing was drafted (an object column) is no sample, not an error.
    with_none = frame.astype({"acceptance_rate": object})
    with_none.loc[with_none.prompt_id == "p2", "acceptance_rate"] = None
    (bar,) = errorbars(plots.acceptance_vs_k(with_none))
    np.testing.assert_allclose(bar.lines[0].get_ydata(),
                               frame[frame.prompt_id != "p2"].groupby("k").acceptance_rate.mean())
    with pytest.raises(ValueError, match="acceptance_rate"):
        plots.acceptance_vs_k(frame.drop(columns="acceptance_rate"))
    with pytest.raises(ValueError, match="empty"):
        plots.acceptance_vs_k(frame.iloc[:0])


def test_tokens_per_round_measured_and_theory():
    frame = acceptance_frame((0.0,))
    fig = plots.tokens_per_round(frame)
    assert len(errorbars(fig)) == 1
    theory = [ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("theory")]
    assert len(theory) == 1
    a = frame.groupby("k").acceptance_rate.mean()
    np.testing.assert_allclose(theory[0].get_ydata(), [expected_tokens(a[k], k) for k in (1, 2, 4, 8)])
    overall = plots.tokens_per_round(frame, a_by="overall")
    (line,) = [ln for ln in overall.axes[0].get_lines() if ln.get_label().startswith("theory")]
    a_all = frame.acceptance_rate.mean()
    np.testing.assert_allclose(line.get_ydata(), [expected_tokens(a_all, k) for k in (1, 2, 4, 8)])
    with pytest.raises(ValueError, match="a_by"):
        plots.tokens_per_round(frame, a_by="prompt")


def test_hit_rate_vs_budget_symlog_with_zero(tmp_path):
    frame = hit_frame()
    fig = plots.hit_rate_vs_budget(frame)
    bars = errorbars(fig)
    assert len(bars) == 3 and all(len(b.lines[0].get_xdata()) == 7 for b in bars)
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog" and 0 in ax.get_xticks()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["uniform", "geometric", "calibrated"]
    assert png_digest(fig, tmp_path, "1.png") == png_digest(plots.hit_rate_vs_budget(frame), tmp_path, "2.png")


def test_accepted_histogram_fractions_and_geometric():
    # K = 4 rounds plus two shorter rounds near max_new_tokens, which are left out.
    accepted = [0, 1, 1, 2, 4, 4, 4, 3, 0, 4]
    rounds = pd.DataFrame({"accepted": accepted + [1, 0], "draft_len": [4] * 10 + [2, 1]})
    fig = plots.accepted_histogram(rounds)
    ax = fig.axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    np.testing.assert_allclose([b.get_height() for b in bars], [0.2, 0.2, 0.1, 0.1, 0.4])
    a = sum(accepted) / sum(k + (k < 4) for k in accepted)  # accepted / tested
    (geom,) = [ln for ln in ax.get_lines() if "geometric" in ln.get_label()]
    np.testing.assert_allclose(geom.get_ydata(), outcome_probabilities(4, a))
    assert f"a = {a:.2f}" in geom.get_label()
    with pytest.raises(ValueError, match="K >= 1"):
        plots.accepted_histogram(pd.DataFrame({"accepted": [0, 0], "draft_len": [0, 0]}))


def test_miss_rate_fit_uses_the_package_fit():
    rng = np.random.default_rng(0)
    ranks = list(np.ceil(rng.pareto(0.7, 400) + 1).astype(int)) + [None, float("nan")]
    fig = plots.miss_rate_fit(ranks, max_f=16)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    r = fit_power_law([x for x in ranks if x is not None and x == x], 16)
    law = fit_miss_rate(ranks, 16)  # the one fit, which the figure draws
    c, r2 = law.c, law.r
    assert r2 == r
    (fit,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fit")]
    assert f"r = {r:.2f}" in fit.get_label()
    np.testing.assert_allclose(fit.get_ydata(), c * np.arange(1, 17.0) ** -r)
    # Every rank within F = 1: nothing to fit, still a figure.
    assert fit_miss_rate([1, 1, 1]) is None
    plots.miss_rate_fit([1, 1, 2])
    with pytest.raises(ValueError, match="rank"):
        plots.miss_rate_fit([None, float("nan")])


def test_ap_sensitivity_lines():
    rows = [{"assumed_a_p": a, "prompt_id": p, "strategy": "geometric", "hit_rate": 0.5 + 0.3 * a * (1 - a) + i / 50}
            for a in (0.2, 0.4, 0.6, 0.8) for i, p in enumerate(PROMPTS)]
    rows += [{"assumed_a_p": np.nan, "prompt_id": p, "strategy": "uniform", "hit_rate": 0.45 + i / 50}
             for i, p in enumerate(PROMPTS)]
    fig = plots.ap_sensitivity(pd.DataFrame(rows), fitted_a_p=0.55)
    ax = fig.axes[0]
    assert len(errorbars(fig)) == 1
    labels = [ln.get_label() for ln in ax.get_lines()]
    (uniform,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("uniform")]
    assert uniform.get_linestyle() == "--"
    np.testing.assert_allclose(uniform.get_ydata(), [0.47, 0.47])
    (fitted,) = [ln for ln in ax.get_lines() if ln.get_label().startswith("fitted a_p")]
    np.testing.assert_allclose(fitted.get_xdata(), [0.55, 0.55])
    assert "fitted a_p = 0.55" in labels
    # Without strategy or fitted a_p: one series, no reference lines.
    plain = plots.ap_sensitivity(pd.DataFrame(rows[:12]).drop(columns="strategy"))
    assert len(errorbars(plain)) == 1
    assert not [ln for ln in plain.axes[0].get_lines() if ln.get_label().startswith(("uniform", "fitted"))]


def test_pareto_front():
    assert plots.pareto_front([0.9, 0.8, 0.7, 0.6], [0.1, 0.5, 0.4, 0.6]) == [3, 1, 0]


def test_saguaro_pareto(tmp_path):
    # C: 0 (no re-weighting) .. 1; acceptance falls and hit rate rises, C=0.5 is dominated by C=0.25.
    means = {0.0: (0.70, 0.30), 0.25: (0.68, 0.45), 0.5: (0.60, 0.40), 1.0: (0.50, 0.60)}
    frame = pd.DataFrame([{"saguaro_c": c, "prompt_id": p, "acceptance_rate": a + i / 100, "hit_rate": h - i / 100}
                          for c, (a, h) in means.items() for i, p in enumerate(PROMPTS)])
    fig = plots.saguaro_pareto(frame)
    ax = fig.axes[0]
    bars = errorbars(fig)
    assert len(bars) == 4 and all(b.has_xerr and b.has_yerr for b in bars)  # one point per C
    # Told apart by the legend, not by text beside the points (which overlapped where Cs lie close).
    assert [b.get_label() for b in bars] == ["C = 1", "C = 0.5", "C = 0.25", "C = 0"] and not ax.texts
    assert ax.get_legend().get_title().get_text() == style.RATE_CI_LABEL
    assert min(ax.get_xlim()[0], ax.get_ylim()[0]) >= -0.02 and max(ax.get_xlim()[1], ax.get_ylim()[1]) <= 1.02
    (front,) = [ln for ln in ax.get_lines() if ln.get_label() == "Pareto front"]
    np.testing.assert_allclose(front.get_xdata(), [0.51, 0.69, 0.71])
    assert png_digest(fig, tmp_path, "1.png") == png_digest(plots.saguaro_pareto(frame), tmp_path, "2.png")


def test_wall_clock_order_and_prediction():
    rows = [{"method": m, "prompt_id": p, "tokens_per_s": v + i, "predicted_tokens_per_s": pred}
            for m, v, pred in (("ar", 10, np.nan), ("sd", 18, np.nan), ("ssd", 25, 27.0))
            for i, p in enumerate(PROMPTS)]
    fig = plots.wall_clock(pd.DataFrame(rows))
    ax = fig.axes[0]
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    np.testing.assert_allclose([b.get_height() for b in bars], [11, 19, 26])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ar", "sd", "ssd"]
    assert len(errorbars(fig)) == 1
    (pred,) = [ln for ln in ax.get_lines() if "Theorem 7" in ln.get_label()]
    assert list(pred.get_xdata()) == [2] and list(pred.get_ydata()) == [27.0]
    assert style.CI_LABEL in ax.get_title()
    # Without predictions: bars only, and no legend (it would say nothing the title does not).
    fig = plots.wall_clock(pd.DataFrame(rows).drop(columns="predicted_tokens_per_s"))
    assert not [ln for ln in fig.axes[0].get_lines() if "Theorem 7" in ln.get_label()]
    assert fig.axes[0].get_legend() is None
    # Two prompts: no interval, so no caps at all, and the title says so.
    fig = plots.wall_clock(pd.DataFrame([r for r in rows if r["prompt_id"] != "p2"]))
    (bar,) = errorbars(fig)
    assert all(np.isnan(c.get_ydata().astype(float)).all() for c in bar.lines[1])
    assert style.NO_CI_LABEL in fig.axes[0].get_title()


def test_a_method_keeps_its_colour_whatever_else_a_figure_holds():
    rows = lambda methods: pd.DataFrame([{"method": m, "prompt_id": p, "tokens_per_s": 1.0}  # noqa: E731
                                         for m in methods for p in PROMPTS])

    def bar_colours(fig):
        (bars,) = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)]
        return [tuple(np.round(b.get_facecolor()[:3], 4)) for b in bars]

    one = bar_colours(plots.wall_clock(rows(["ar", "sd", "ssd-pipeline"])))
    other = bar_colours(plots.wall_clock(rows(["ssd-pipeline", "hf-ar", "sd"])))
    assert one[1] == other[2] and one[2] == other[0]  # sd and the pipeline, wherever they stand
    assert len(set(one + other)) == 4
    colours = style.method_colours(["ar", "ar:batch_size=8", "ar:batch_size=16", "sd", "mine", "ar"])
    assert colours["ar"] == style.method_colours(["ar"])["ar"]
    assert len({colours[m] for m in ("ar", "ar:batch_size=8", "ar:batch_size=16")}) == 3  # variants: shades of it
    assert colours["mine"] not in [style.method_colours([m])[m] for m in style.METHOD_COLOURS]
    # The speed-ups figure (notebook 06) colours a method as the wall clock (notebook 05) does.
    speed = pd.DataFrame([{"method": m, "prompt_id": p, "speedup": 1.0} for m in ("ssd-pipeline", "sd")
                          for p in PROMPTS])
    bars = [c for c in plots.speedups(speed, group=None).axes[0].containers if isinstance(c, BarContainer)]
    assert tuple(np.round(bars[1][0].get_facecolor()[:3], 4)) == one[1]



def test_speedups_bars_per_group_and_method_with_a_line_at_one():
    rows = [{"prompt_set": s, "method": m, "prompt_id": f"{s}/{p}", "speedup": v + 0.1 * i}
            for s, base in (("code", 1.0), ("prose", 0.5)) for m, v in (("sd", base + 0.2), ("ssd", base + 0.4))
            for i, p in enumerate(PROMPTS)]
    fig = plots.speedups(pd.DataFrame(rows))
    ax = fig.axes[0]
    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [b.get_label() for b in bars] == ["sd", "ssd"]
    mean = 0.1 * (len(PROMPTS) - 1) / 2
    np.testing.assert_allclose([r.get_height() for r in bars[0]], [1.2 + mean, 0.7 + mean])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["code", "prose"]
    assert len(errorbars(fig)) == 2
    assert [ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_label() == "ar (= 1)"] == [1.0]
    # One group: no group column needed.
    one = pd.DataFrame(rows).query("prompt_set == 'code'").drop(columns="prompt_set")
    assert len([c for c in plots.speedups(one, group=None).axes[0].containers if isinstance(c, BarContainer)]) == 2
    with pytest.raises(ValueError, match="missing \\['speedup'\\]"):
        plots.speedups(pd.DataFrame(rows).drop(columns="speedup"))

# --- token roles ----------------------------------------------------------------------------------------------------

def frame(*rounds):
    """Rounds as (draft_len, accepted, new_tokens), through a real Trace."""
    trace = Trace("sd", prompt_len=3, rounds=[Round(d, k, 0, n, 0.0, 0.0) for d, k, n in rounds])
    return rounds_frame(trace)


def test_roles_autoregressive():
    assert token_roles(frame((0, 0, 1), (0, 0, 1), (0, 0, 1))) == ["target"] * 3


def test_roles_sd_full_accept_and_rejection():
    assert token_roles(frame((3, 3, 4))) == ["accepted"] * 3 + ["bonus"]
    assert token_roles(frame((3, 1, 2), (3, 0, 1))) == ["accepted", "recovered", "recovered"]
    # K = 0 in an SD round near max_new_tokens: a plain target token.
    assert token_roles(frame((2, 2, 3), (0, 0, 1))) == ["accepted"] * 2 + ["bonus", "target"]


def test_roles_cut_by_eos_or_max_new_tokens():
    # EOS among the accepted tokens: the round ends there, no target token.
    assert token_roles(frame((4, 3, 2))) == ["accepted", "accepted"]
    # All accepted but max_new_tokens leaves no room for the bonus.
    assert token_roles(frame((3, 3, 3))) == ["accepted"] * 3
    with pytest.raises(ValueError, match="round 1"):
        token_roles(frame((3, 1, 2), (3, 1, 3)))


class CharTokenizer:
    """One character per id."""

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def test_coloured_tokens_html_escapes_and_keeps_newlines():
    text = "a<b\n&c"
    ids = [ord(ch) for ch in text]
    rounds = frame((3, 2, 3), (3, 3, 3))  # accepted accepted recovered, accepted x3 (cut)
    out = coloured_text.coloured_tokens(CharTokenizer(), ids, rounds)
    body = out.data
    assert "&lt;" in body and "<b" not in body.replace("<b>", "") and "&amp;" in body
    assert "white-space:pre-wrap" in body and "\n" in body
    for role in ("accepted", "recovered", "bonus", "target"):
        assert f"ssd-{role}" in body  # legend names every role
    assert body.count('class="ssd-recovered"') == 2  # the legend entry and one token
    with pytest.raises(ValueError, match="6 new tokens"):
        coloured_text.coloured_tokens(CharTokenizer(), ids[:-1], rounds)


class ByteTokenizer:
    """One UTF-8 byte per id: half a character decodes to U+FFFD, like byte-level BPE."""

    def decode(self, ids):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_pieces_give_a_split_character_to_the_token_completing_it():
    ids = list("é!".encode())
    assert coloured_text.token_pieces(ByteTokenizer(), ids) == ["", "é", "!"]
    assert coloured_text.token_pieces(None, [5, 6]) == ["5 ", "6 "]


@pytest.mark.parametrize("method", ["ar", "sd"])
def test_roles_match_a_real_trace(method):
    """On a tiny random pair: one role per new token, and each round's target token is the trace's t*."""
    import torch

    from ssd.core.decoding import DecodeConfig, generate_ar, generate_sd
    from ssd.models.tiny import tiny_pair

    pair = tiny_pair(agreement_noise=0.2)
    run = generate_ar if method == "ar" else generate_sd
    new, trace = run(pair, [1, 2, 3], DecodeConfig(k=3, temperature=0.0, max_new_tokens=23),
                        torch.Generator().manual_seed(0))
    roles = token_roles(trace)
    assert len(roles) == len(new)
    # SD here: 23 tokens in rounds with accepted, recovered and bonus tokens, the last round K = 0 (a target token).
    assert set(roles) == ({"target"} if method == "ar" else {"accepted", "recovered", "bonus", "target"})
    ends = np.cumsum([r.new_tokens for r in trace.rounds]) - 1
    for r, end in zip(trace.rounds, ends):
        if r.new_tokens > r.accepted:
            assert new[end] == r.token and roles[end] != "accepted"
    html = coloured_text.coloured_tokens(None, new, rounds_frame(trace)).data
    assert html.count("<span") == len(new) + 4


def test_rate_intervals_stay_in_0_1_and_none_is_drawn_from_fewer_than_3_prompts():
    # Hit rates near 1 with one low prompt: the t-interval would run past 1; clipped, it stops there.
    frame = pd.DataFrame([{"prompt_id": p, "strategy": "uniform", "budget": b, "hit_rate": h}
                          for b in (1, 4) for p, h in zip(PROMPTS, (1.0, 1.0, 0.4))])
    fig = plots.hit_rate_vs_budget(frame)
    (bar,) = errorbars(fig)
    tops = np.max([c.get_ydata() for c in bar.lines[1]], axis=0)
    bottoms = np.min([c.get_ydata() for c in bar.lines[1]], axis=0)
    assert (tops <= 1.0).all() and (bottoms >= 0.0).all() and np.isclose(tops, 1.0).all()
    assert style.RATE_CI_LABEL in fig.axes[0].get_legend().get_title().get_text()
    # Two prompts: no interval (not even a cap of zero length), and the legend says why.
    fig = plots.hit_rate_vs_budget(frame[frame.prompt_id != "p2"])
    (bar,) = errorbars(fig)
    assert all(np.isnan(c.get_ydata().astype(float)).all() for c in bar.lines[1])
    assert style.NO_CI_LABEL in fig.axes[0].get_legend().get_title().get_text()
    # A speed-up is not a rate: its interval is not clipped.
    assert style.ci_label(style.summarise(frame, "budget", "hit_rate")) == style.CI_LABEL


def test_miss_rate_fit_without_a_single_miss_still_draws(tmp_path):
    fig = plots.miss_rate_fit([1] * 20, max_f=8)  # every t* ranked first (a tiny pair that agrees with itself)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.texts] == ["no miss at any F: t* ranked first in all 20 rounds"]
    png_digest(fig, tmp_path)  # drawing used to fail: a log axis with nothing above 0


# --- the timeline ---------------------------------------------------------------------------------------------------

def spans(method, *blocks, hits=None, backups=None):
    """A trace of `method` whose spans are (round, phase, start, end), with SSD rounds' hits and backups."""
    from ssd.clock import Span
    from ssd.core.trace import SSDRound

    n = max(b[0] for b in blocks if b[0] is not None) + 1
    rounds = [SSDRound(2, 1, 0, 2, 0.0, 0.0, hit=None if hits is None else hits[i],
                       backup=None if backups is None else backups[i]) for i in range(n)]
    return Trace(method, prompt_len=3, rounds=rounds, spans=[Span(*b) for b in blocks])


def test_the_timeline_draws_each_lane_and_marks_hits_and_misses(tmp_path):
    sd = spans("sd", (None, "prefill_s", 0.0, 1.0), (0, "draft_s", 1.0, 1.5), (0, "verify_s", 1.5, 2.0),
               (1, "draft_s", 2.0, 2.5), (1, "verify_s", 2.5, 3.0))
    pipe = spans("ssd-pipeline", (None, "prefill_s", 0.0, 1.0), (0, "verify_s", 1.2, 1.7), (0, "wait_s", 1.7, 2.0),
                 (0, "prespec_s", 1.2, 1.9), (0, "draft_s", 1.9, 2.0), (1, "verify_s", 2.0, 2.5),
                 (1, "wait_s", 2.5, 3.0), (1, "prespec_s", 2.0, 2.6), (1, "draft_s", 2.6, 3.0),
                 (2, "verify_s", 3.0, 3.5), (2, "draft_s", 3.5, 3.6),
                 hits=[True, False, False], backups=[None, "jit", None])
    fig = timeline.timeline([sd, pipe])
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [
        "ssd-pipeline: verifier (rank 0)", "ssd-pipeline: drafter (rank 1)", "sd: target", "sd: draft"]
    assert len(ax.collections) == 16  # one bar per span
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["prompts' pass", "verify", "wait", "draft steps", "pre-speculation", "lookup", "backup (jit)",
                      "hit", "miss"]
    marks = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 1]
    # each verify's end but the last round's, whose lookup decides nothing
    assert [(ln.get_xdata()[0], ln.get_marker()) for ln in marks] == [(1.7, "^"), (2.5, "x")]
    png_digest(fig, tmp_path)
    # The first round only; a frame of spans draws as its traces do.
    fig = timeline.timeline(pd.concat([spans_frame(sd), spans_frame(pipe)]), rounds=1)
    assert len(fig.axes[0].collections) == 8 and fig.axes[0].get_xlim()[1] < 2.5
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        timeline.timeline(sd, rounds=0)
    with pytest.raises(ValueError, match="missing"):
        timeline.timeline(spans_frame(sd).drop(columns="lane"))


def test_the_batch_study_draws_each_method_in_its_colour_and_marks_the_crossover(tmp_path):
    from tests.test_batch_study import study  # a synthetic study of known figures

    summary = study(jit_decode=[5, 8, 10, 11, 11], fast_decode=[4, 7, 10.5, 12, 13], sd_total=[4, 6, 7, 8, 8],
                    ar_total=[3, 5, 7, 9, 10])
    fig = plots.batch_study(summary, "set", {"measured": 4, "predicted": 16})
    total, decode, sequence, hits = fig.axes[:4]
    colours = style.method_colours(pd.unique(summary["label"]))
    drawn = {line.get_label().split(", ")[0]: line.get_color() for line in decode.get_lines()
             if line.get_label().endswith("measured") and not line.get_label().startswith("b*")}
    assert set(drawn) == set(colours) and all(tuple(c) == tuple(colours[m]) for m, c in drawn.items())
    assert {line.get_label() for line in decode.get_lines()} >= {
        "sd, measured", "ssd-pipeline:jit, predicted from the profile", "b* measured (fast backup reaches jit)",
        "b* predicted (fast backup reaches jit)"}
    assert all(0 <= y <= 1 for line in hits.get_lines() for y in line.get_ydata())  # rates stay rates
    assert total.get_xscale() == "log" and list(total.get_xticks()) == [1, 2, 4, 8, 16]
    style.save(fig, tmp_path / "study.png")
    assert (tmp_path / "study.png").stat().st_size > 0


def test_a_caption_names_the_setting_below_the_figure_clear_of_its_x_label():
    with style.styled():
        fig, ax = plt.subplots()
        ax.set_xlabel("prompt_set")
        fig.tight_layout()
    line = style.setting_line("AMD EPYC (2 cores), AVX512, native bfloat16", "bfloat16", "int8")
    assert style.caption(fig, line) is fig
    (text,) = [t for t in fig.texts if t.get_text() == line]
    assert line == "AMD EPYC (2 cores), AVX512, native bfloat16 · target bfloat16, draft int8"
    renderer = fig.canvas.get_renderer()
    top = text.get_window_extent(renderer).y1  # display pixels; the figure's bottom edge is 0
    assert top < -3 and top < ax.xaxis.label.get_window_extent(renderer).y0  # a few pixels of gap below the edge
