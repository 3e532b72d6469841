"""Figures drawn from the tidy DataFrames of `ssd.analysis.experiments`, by topic: SD's acceptance and tokens per
round; SSD's hit rates, miss-rate power law, a_p and Saguaro; wall clock and speed-ups; the latency profile; K and B on
auto; the batch-size study. Every function returns a matplotlib Figure, drawn in the kit's style
(`ssd.analysis.style`: one colour per method, 95% intervals over prompts). The timeline and the coloured text have
modules of their own (`ssd.analysis.timeline`, `ssd.analysis.coloured_text`).
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..bench.stats import MIN_CI_N
from .experiments import fitted_a_p
from ..core.fan_out import fit_miss_rate, miss_rates, outcome_probabilities
from ..core.theory import expected_tokens
from .style import (check_frame, ci_label, colours, dodge, error_bars, errorbar, format_value, legend_outside,
                    method_colours, ordered, styled, summarise)


# --- SD: acceptance and tokens per round ----------------------------------------------------------------------------

def acceptance_vs_k(frame: pd.DataFrame, column: str = "acceptance_rate"):
    """Acceptance rate a against draft length K; columns k, prompt_id, `column` (accepted / drafted, or a_p =
    accepted / tested), optional temperature (hue)."""
    check_frame(frame, ["k", "prompt_id", column], "acceptance_vs_k")
    hue = "temperature" if "temperature" in frame.columns else None
    groups = [(None, frame)] if hue is None else [(t, frame[frame[hue] == t]) for t in sorted(ordered(frame[hue]))]
    with styled():
        fig, ax = plt.subplots()
        pal = colours(len(groups))
        summaries = [summarise(g, "k", column).sort_values("k") for _, g in groups]
        bars = ci_label(*summaries, value="acceptance_rate")
        for i, ((t, _), s) in enumerate(zip(groups, summaries)):
            label = bars if hue is None else format_value(t)
            errorbar(ax, dodge(ax, s["k"], i, len(groups)), s, label=label, colour=pal[i])
        ax.set_xticks(sorted(ordered(frame["k"])))
        ax.set(xlabel="draft length K", ylabel="acceptance rate a", ylim=(0, 1.05),
               title="Acceptance rate a vs draft length K")
        legend_outside(ax, f"temperature\n({bars})" if hue else None)
    return fig


def tokens_per_round(frame: pd.DataFrame, a_by: str = "k", column: str = "acceptance_rate"):
    """Measured tokens per round against K, with the theory E = (1 - a^(K+1)) / (1 - a).

    Columns k, prompt_id, tokens_per_round and `column`. a is the mean of `column` over prompts at each K
    (a_by="k") or over every row (a_by="overall"). The theory assumes each drafted token is accepted independently
    with probability a; the drafted-token acceptance rate (accepted / drafted) is biased low for that (tokens after a
    rejection are never tested), which a_p = accepted / tested is not; rounds cut by EOS or max_new_tokens add fewer
    tokens, so measured and theory need not coincide.
    """
    check_frame(frame, ["k", "prompt_id", "tokens_per_round", column], "tokens_per_round")
    if a_by not in ("k", "overall"):
        raise ValueError(f"a_by must be 'k' (a per K) or 'overall' (one a for all K), got {a_by!r}")
    measured = summarise(frame, "k", "tokens_per_round").sort_values("k")
    a = summarise(frame, "k", column).set_index("k")["mean"]
    ks = measured["k"].to_numpy()
    if a_by == "overall":
        per_prompt = frame[column].astype(float).groupby(frame["prompt_id"], sort=False).mean()
        a_all = float(per_prompt.mean())
        theory = [expected_tokens(a_all, int(k)) for k in ks]
        theory_label = f"theory (1 − a^(K+1)) / (1 − a), a = {a_all:.2f}"
    else:
        theory = [expected_tokens(float(a[k]), int(k)) for k in ks]
        theory_label = "theory (1 − a^(K+1)) / (1 − a), a measured at each K"
    with styled():
        fig, ax = plt.subplots()
        pal = colours(2)
        errorbar(ax, ks, measured, label=f"measured, {ci_label(measured)}", colour=pal[0])
        ax.plot(ks, theory, "s--", color=pal[1], label=theory_label)
        ax.set_xticks(ks)
        ax.set(xlabel="draft length K", ylabel="tokens per round", ylim=(0, None),
               title="Tokens per round vs draft length K")
        legend_outside(ax)
    return fig


def accepted_histogram(rounds: pd.DataFrame, k: int | None = None):
    """Fraction of rounds with each accepted count k, among rounds that drafted K tokens (K = max draft_len).

    Overlaid: the truncated geometric P(k) = a^k (1 - a) for k < K, a^K for k = K, with a the maximum-likelihood
    per-token acceptance rate of those rounds, accepted / tested (`ssd.analysis.experiments.fitted_a_p`: a round tests k
    + 1 drafted tokens when one is rejected and K when all are accepted).
    """
    check_frame(rounds, ["accepted", "draft_len"], "accepted_histogram")
    big_k = int(rounds["draft_len"].max()) if k is None else int(k)
    if big_k <= 0:
        raise ValueError(f"accepted_histogram needs rounds that drafted tokens (K >= 1); got K = {big_k}")
    sub = rounds[rounds["draft_len"] == big_k]
    if sub.empty:
        seen = sorted(ordered(rounds["draft_len"]))
        raise ValueError(f"no round drafted K = {big_k} tokens (draft_len values: {seen})")
    a = fitted_a_p(sub)
    kk = np.arange(big_k + 1)
    fraction = sub["accepted"].astype(int).value_counts(normalize=True).reindex(kk, fill_value=0.0).to_numpy()
    with styled():
        fig, ax = plt.subplots()
        pal = colours(2)
        ax.bar(kk, fraction, color=pal[0], alpha=0.85, label=f"measured ({len(sub)} rounds, mean k = "
                                                              f"{sub['accepted'].mean():.2f})")
        ax.plot(kk, outcome_probabilities(big_k, a), "o--", color=pal[1],
                label=f"truncated geometric, a = {a:.2f} (accepted / tested)")
        ax.set_xticks(kk)
        ax.set(xlabel="accepted count k", ylabel="fraction of rounds", ylim=(0, 1.05),
               title=f"Accepted count k per round (K = {big_k})")
        ax.legend()
    return fig


# --- SSD: hit rate, miss-rate power law, a_p, Saguaro, wall clock ---------------------------------------------------

def hit_rate_vs_budget(frame: pd.DataFrame):
    """Hit rate against budget B (symlog base 2, B = 0 included), one series per strategy.

    Columns prompt_id, strategy, budget, hit_rate: what `ssd.analysis.experiments.hit_rate_curves` returns.
    """
    check_frame(frame, ["prompt_id", "strategy", "budget", "hit_rate"], "hit_rate_vs_budget")
    strategies = ordered(frame["strategy"])
    budgets = sorted(ordered(frame["budget"]))
    with styled():
        fig, ax = plt.subplots()
        ax.set_xscale("symlog", base=2, linthresh=1, linscale=0.5)
        pal = colours(len(strategies))
        summaries = [summarise(frame[frame["strategy"] == strategy], "budget", "hit_rate").sort_values("budget")
                     for strategy in strategies]
        for i, (strategy, s) in enumerate(zip(strategies, summaries)):
            errorbar(ax, dodge(ax, s["budget"], i, len(strategies)), s, label=str(strategy), colour=pal[i])
        ax.set_xticks(budgets)
        ax.set_xticklabels([format_value(b) for b in budgets])
        ax.minorticks_off()
        ax.set(xlabel="budget B (cached outcomes)", ylabel="hit rate", ylim=(0, 1.05),
               title="Hit rate vs budget B")
        legend_outside(ax, f"fan-out\n({ci_label(*summaries, value='hit_rate')})")
    return fig


def _clean_ranks(ranks) -> np.ndarray:
    kept = []
    for r in ranks:
        if r is None:
            continue
        r = float(r)
        if math.isnan(r):
            continue
        kept.append(int(r))
    return np.asarray(kept, dtype=int)


def miss_rate_fit(ranks, max_f: int = 32):
    """Empirical miss rate P(rank of t* > F) against fan-out F on log-log, with the fitted power law c F^(-r).

    ranks: the 1-based rank of each round's t* among the candidates at its position; None/NaN (not ranked) dropped.
    """
    if not (isinstance(max_f, int) and max_f >= 2):
        raise ValueError(f"max_f (largest fan-out F) must be an integer >= 2, got {max_f!r}")
    clean = _clean_ranks(ranks)
    if len(clean) == 0:
        raise ValueError("miss_rate_fit needs at least one rank (every rank was None/NaN or none were given)")
    if clean.min() < 1:
        raise ValueError(f"ranks are 1-based; got a rank of {clean.min()}")
    f, miss = miss_rates(clean, max_f)
    fit = fit_miss_rate(clean, max_f)
    with styled():
        fig, ax = plt.subplots()
        pal = colours(2)
        pos = miss > 0
        ax.plot(f[pos], miss[pos], "o", color=pal[0], label=f"measured ({len(clean)} ranked rounds)")
        if fit is not None:
            c, r = fit.c, fit.r
            ax.plot(f, c * f.astype(float) ** (-r), "-", color=pal[1], label=f"fit: {c:.2f} · F^(−r), r = {r:.2f}")
        else:
            ax.plot([], [], " ", label="too few misses to fit r")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        if not pos.any():  # every t* ranked first: no miss to draw on a log axis, which then has no range at all
            ax.set(xlim=(1, max_f), ylim=(1 / (10 * len(clean)), 1))
            ax.text(0.5, 0.5, f"no miss at any F: t* ranked first in all {len(clean)} rounds", ha="center",
                    transform=ax.transAxes)
        ax.set(xlabel="fan-out F", ylabel="miss rate P(rank of t* > F)", title="Miss rate vs fan-out F")
        ax.legend()
    return fig


def ap_sensitivity(frame: pd.DataFrame, fitted_a_p: float | None = None):
    """Hit rate against the a_p the geometric fan-out assumes; columns assumed_a_p, prompt_id, hit_rate, optional
    strategy (hue). Rows with strategy == "uniform" (which assumes nothing) become a dashed reference line with its
    CI band; fitted_a_p, if given, a vertical line."""
    check_frame(frame, ["assumed_a_p", "prompt_id", "hit_rate"], "ap_sensitivity")
    has_strategy = "strategy" in frame.columns
    uniform = frame[frame["strategy"] == "uniform"] if has_strategy else frame.iloc[:0]
    rest = frame[frame["strategy"] != "uniform"] if has_strategy else frame
    rest = rest[rest["assumed_a_p"].notna()]
    groups = [(s, rest[rest["strategy"] == s]) for s in ordered(rest["strategy"])] if has_strategy else [(None, rest)]
    with styled():
        fig, ax = plt.subplots()
        pal = colours(len(groups) + 2)
        summaries = [summarise(g, "assumed_a_p", "hit_rate").sort_values("assumed_a_p") for _, g in groups]
        bars = ci_label(*summaries, value="hit_rate")
        for i, ((strategy, _), s) in enumerate(zip(groups, summaries)):
            label = bars if strategy is None else str(strategy)
            errorbar(ax, dodge(ax, s["assumed_a_p"], i, len(groups)), s, label=label, colour=pal[i])
        if not uniform.empty:
            u = summarise(uniform.assign(_all=0), "_all", "hit_rate").iloc[0]
            grey = "0.35"
            ax.axhline(u["mean"], ls="--", color=grey, label=f"uniform ({u['mean']:.2f})")
            if u["n"] >= MIN_CI_N:
                ax.axhspan(u["ci_low"], u["ci_high"], color=grey, alpha=0.12, lw=0)
        if fitted_a_p is not None:
            ax.axvline(fitted_a_p, ls=":", color=pal[len(groups)], label=f"fitted a_p = {fitted_a_p:.2f}")
        ax.set(xlabel="assumed a_p (geometric fan-out)", ylabel="hit rate", ylim=(0, 1.05),
               title="Hit rate vs the a_p the fan-out assumes")
        legend_outside(ax, f"fan-out\n({bars})" if has_strategy else None)
    return fig


def pareto_front(x, y) -> list[int]:
    """Indices of the points not dominated in both coordinates (higher is better), sorted by x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    front = [i for i in range(len(x))
             if not np.any((x >= x[i]) & (y >= y[i]) & ((x > x[i]) | (y > y[i])))]
    return sorted(front, key=lambda i: (x[i], -y[i]))


def saguaro_pareto(frame: pd.DataFrame):
    """Acceptance rate (x) against hit rate (y), one point per Saguaro C with mean ± CI on both axes (a colour and a
    legend entry per C, so labels never overlap), and the Pareto front joined by a line. Both axes stay in [0, 1].
    Columns saguaro_c, prompt_id, acceptance_rate, hit_rate."""
    check_frame(frame, ["saguaro_c", "prompt_id", "acceptance_rate", "hit_rate"], "saguaro_pareto")
    acc = summarise(frame, "saguaro_c", "acceptance_rate")
    hit = summarise(frame, "saguaro_c", "hit_rate")
    s = acc.merge(hit, on="saguaro_c", suffixes=("_a", "_h")).sort_values("saguaro_c", ascending=False)
    s = s.reset_index(drop=True)
    front = pareto_front(s["mean_a"], s["mean_h"])
    with styled():
        fig, ax = plt.subplots()
        pal = colours(len(s) + 1)
        xerr, yerr = error_bars(s, "_a"), error_bars(s, "_h")
        for i, row in s.iterrows():
            ax.errorbar(row["mean_a"], row["mean_h"], xerr=xerr[:, i : i + 1], yerr=yerr[:, i : i + 1], fmt="o",
                        capsize=4, color=pal[i], label=f"C = {format_value(row['saguaro_c'])}")
        ax.plot(s.loc[front, "mean_a"], s.loc[front, "mean_h"], "-", color="0.4", lw=1.5, label="Pareto front")
        ax.set_xlim(*_rate_limits(s["mean_a"] - s["err_low_a"], s["mean_a"] + s["err_high_a"]))
        ax.set_ylim(*_rate_limits(s["mean_h"] - s["err_low_h"], s["mean_h"] + s["err_high_h"]))
        ax.set(xlabel="acceptance rate a", ylabel="hit rate", title="Saguaro C: acceptance rate vs hit rate")
        legend_outside(ax, ci_label(acc, hit, value="hit_rate"))
    return fig


def _rate_limits(low, high, pad: float = 0.05) -> tuple[float, float]:
    """Axis limits around [min(low), max(high)] with a margin, never beyond [0, 1] (plus room for the markers)."""
    return max(float(np.min(low)) - pad, -0.02), min(float(np.max(high)) + pad, 1.02)


def wall_clock(frame: pd.DataFrame):
    """Tokens per second per method (bars in each method's colour, mean ± CI, in the frame's method order; the
    title says what the intervals are); a marker per method for the optional column predicted_tokens_per_s
    (Theorem 7's prediction) where present, with a legend for it. Columns method, prompt_id, tokens_per_s."""
    check_frame(frame, ["method", "prompt_id", "tokens_per_s"], "wall_clock")
    methods = [str(m) for m in ordered(frame["method"])]
    frame = frame.assign(method=frame["method"].astype(str))
    s = summarise(frame, "method", "tokens_per_s").set_index("method").reindex(methods).reset_index()
    x = np.arange(len(methods))
    with styled():
        fig, ax = plt.subplots()
        pal = method_colours(methods)
        ax.bar(x, s["mean"].to_numpy(float), yerr=error_bars(s), capsize=5, color=[pal[m] for m in methods], alpha=0.9)
        if "predicted_tokens_per_s" in frame.columns:
            pred = frame["predicted_tokens_per_s"].astype(float).groupby(frame["method"], sort=False).mean()
            pred = pred.reindex(methods)
            have = pred.notna().to_numpy()
            if have.any():
                ax.plot(x[have], pred.to_numpy()[have], "D", color="black", markersize=8,
                        label="predicted (Theorem 7)")
        ax.set_xticks(x)
        ax.set_xticklabels(methods)
        ax.set(xlabel="method", ylabel="tokens / s")
        ax.set_title(f"Wall clock: tokens per second\n({ci_label(s)})", fontsize="medium")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize="small")
    return fig


def speedups(frame: pd.DataFrame, baseline: str = "ar", group: str | None = "prompt_set"):
    """Per-prompt speed-up over `baseline` (bars, mean ± CI over prompts), one bar per method within each group (a
    prompt set, say), and a dashed line at 1 = as fast as the baseline. Columns prompt_id, method, speedup and
    `group` (None for one group): what `ssd.bench.stats.speedups` returns."""
    check_frame(frame, ["prompt_id", "method", "speedup", *([group] if group else [])], "speedups")
    frame = frame.assign(_group=frame[group].astype(str) if group else "")
    groups, methods = ordered(frame["_group"]), [str(m) for m in ordered(frame["method"])]
    frame = frame.assign(method=frame["method"].astype(str))
    s = summarise(frame, ["_group", "method"], "speedup").set_index(["_group", "method"])
    with styled():
        fig, ax = plt.subplots()
        grouped_bars(ax, s, groups, methods)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label=f"{baseline} (= 1)")
        ax.set(xlabel=group or "", ylabel=f"speed-up over {baseline}", title=f"Wall clock: speed-up over {baseline}")
        legend_outside(ax, f"method\n({ci_label(s.reset_index())})")
    return fig


def grouped_bars(ax, s: pd.DataFrame, groups: list, methods: list[str], suffix: str = "") -> dict[str, np.ndarray]:
    """One bar per method in each group, in the method's colour, mean ± CI (`s`: ``summarise``'s frame indexed by
    group and method); the groups' names under them. Returns each method's bar positions."""
    width, pal, xs = 0.8 / len(methods), method_colours(methods), {}
    for i, method in enumerate(methods):
        m = s.reindex(pd.MultiIndex.from_product([groups, [method]]))
        xs[method] = np.arange(len(groups)) + (i - (len(methods) - 1) / 2) * width
        ax.bar(xs[method], m["mean"].to_numpy(float), width=width * 0.95, color=pal[method], alpha=0.9,
               label=method + suffix, yerr=error_bars(m), capsize=4)
    ax.set_xticks(np.arange(len(groups)))
    ax.set_xticklabels(groups)
    return xs


# --- latency profile -----------------------------------------------------------------------------------------------

def latency_profile(frame: pd.DataFrame, title: str = ""):
    """Two panels: the target's pass time against the tokens verified, the draft's time for one depth of the
    pre-speculation tree (forward and draws) against its branch rows,
    one line per label (e.g. "target bfloat16, draft int8"), each label's memory floor of a
    one-token step dashed in its colour, and the ratio to that one-token step written at the last point. Columns
    label, role (target | draft), n, ms, ratio, floor_ms: `ssd.bench.frames.profile_frame(profile)` with a label."""
    check_frame(frame, ["label", "role", "n", "ms", "ratio", "floor_ms"], "latency_profile")
    labels = ordered(frame["label"])
    with styled():
        fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.5))
        pal = colours(len(labels))
        for ax, role, xlabel in ((axes[0], "target", "tokens in one verify pass (K + 1)"),
                                 (axes[1], "draft", "branch rows of one pre-speculation depth (B)")):
            for colour, label in zip(pal, labels):
                g = frame[(frame["label"] == label) & (frame["role"] == role)].sort_values("n")
                if g.empty:
                    continue
                ax.plot(g["n"], g["ms"], "o-", color=colour, label=str(label))
                ax.axhline(g["floor_ms"].iloc[0], color=colour, linestyle=":", linewidth=1.2)
                last = g.iloc[-1]
                ax.annotate(f"{last['ratio']:.1f}x", (last["n"], last["ms"]), textcoords="offset points",
                            xytext=(4, 4), fontsize=9, color=colour)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set_ylim(bottom=0)
            ax.set(xlabel=xlabel, ylabel="ms per pass", title=f"{role}")
            ax.legend(title="dotted: memory floor of one step", fontsize=8, title_fontsize=8)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
    return fig


# --- K and B on auto (notebook 07) ----------------------------------------------------------------------------------

def sd_k_speeds(predicted: pd.DataFrame, measured: pd.DataFrame, title: str = ""):
    """SD's decode tokens/s against K: the prediction (line; columns k, tokens_per_s, from ssd.core.tuning.sd_curve),
    the fixed K measured (points; columns k, decode_tokens_per_s, from ssd.analysis.experiments.variant_summary), and
    the auto run measured (a star at the mean K its rounds used; the row whose k is "auto")."""
    check_frame(predicted, ["k", "tokens_per_s"], "sd_k_speeds")
    check_frame(measured, ["k", "decode_tokens_per_s", "mean_k"], "sd_k_speeds")
    fixed = measured[measured["k"] != "auto"].astype({"k": int}).sort_values("k")
    auto = measured[measured["k"] == "auto"]
    with styled():
        fig, ax = plt.subplots()
        best = predicted.loc[predicted["tokens_per_s"].idxmax()]
        ax.plot(predicted["k"], predicted["tokens_per_s"], "-", color="grey", label="predicted (profile, a measured)")
        ax.plot([best["k"]], [best["tokens_per_s"]], "s", color="grey", markersize=9, fillstyle="none",
                label=f"predicted best: K {int(best['k'])}")
        ax.plot(fixed["k"], fixed["decode_tokens_per_s"], "o", color=method_colours(["sd"])["sd"], markersize=8,
                label="measured, fixed K")
        for row in auto.itertuples():
            ax.plot([row.mean_k], [row.decode_tokens_per_s], "*", color="black", markersize=14,
                    label=f"measured, K auto (mean K {row.mean_k:.1f})")
        ax.set(xlabel="draft length K", ylabel="decode tokens/s", title=title or "SD: tokens/s against K")
        ax.set_ylim(bottom=0)
        legend_outside(ax)
        fig.tight_layout()
    return fig


def ssd_speed_surfaces(predicted: pd.DataFrame, measured: pd.DataFrame, title: str = ""):
    """Two heatmaps over (K, B): predicted decode tokens/s (columns k, budget, tokens_per_s:
    ssd.core.tuning.ssd_surface) and measured (columns k, budget, decode_tokens_per_s: the fixed variants of
    ssd.analysis.experiments.variant_summary), each with its best cell boxed; the measured panel's title gives the auto
    run (its mean K and B and tokens/s)."""
    check_frame(predicted, ["k", "budget", "tokens_per_s"], "ssd_speed_surfaces")
    check_frame(measured, ["k", "budget", "decode_tokens_per_s", "mean_k", "mean_budget"], "ssd_speed_surfaces")
    fixed = measured[(measured["k"] != "auto") & measured["k"].notna()].astype({"k": int, "budget": int})
    auto = measured[measured["k"] == "auto"]
    panels = [("predicted", predicted.pivot_table(index="k", columns="budget", values="tokens_per_s")),
              ("measured", fixed.pivot_table(index="k", columns="budget", values="decode_tokens_per_s"))]
    with styled():
        fig, axes = plt.subplots(1, 2, figsize=(11.0, 4.2))
        for ax, (name, grid) in zip(axes, panels):
            sns.heatmap(grid, annot=True, fmt=".2f", cmap="viridis", ax=ax, cbar_kws={"label": "decode tokens/s"})
            k, b = np.unravel_index(np.nanargmax(grid.to_numpy()), grid.shape)
            ax.add_patch(plt.Rectangle((b, k), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
            sub = f"{name}; best boxed: K {grid.index[k]}, B {grid.columns[b]}"
            if name == "measured" and len(auto):
                a = auto.iloc[0]
                sub += f"\nauto: {a['decode_tokens_per_s']:.2f} tokens/s at mean K {a['mean_k']:.1f}, B {a['mean_budget']:.1f}"
            ax.set(xlabel="budget B", ylabel="draft length K", title=sub)
            ax.invert_yaxis()
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
    return fig


def batch_study(summary: pd.DataFrame, title: str, crossover: dict | None = None):
    """One prompt set of the batch-size study (``ssd.analysis.batch_study.by_batch_size``), against b on a log2 axis,
    each method in its colour: total tokens/s (mean over calls, 95% CI over calls where there were at least MIN_CI_N);
    decode tokens/s measured (solid) beside the profile's prediction (dashed, open markers) with the measured and
    predicted crossover b* of the two backups (`crossover`: ``ssd.analysis.batch_study.crossover``); per-sequence
    tokens/s (what one user waits); and the measured all-hit rate of the pipeline beside p_hit^b."""
    check_frame(summary, ["label", "batch_size", "tokens_per_s", "ci_low", "ci_high", "calls", "decode_tokens_per_s",
                     "predicted", "sequence_tokens_per_s", "all_hit", "p_hit_to_b"], "batch_study")
    labels = [str(m) for m in ordered(summary["label"])]
    pal = method_colours(labels)
    with styled():
        fig, axes = plt.subplots(2, 2, figsize=(12, 8.5), sharex=True)
        for ax in axes.ravel():
            ax.set_xscale("log", base=2)
        total, decode, sequence, hits = axes.ravel()
        for i, label in enumerate(labels):
            s = summary[summary["label"] == label].sort_values("batch_size")
            b = s["batch_size"].to_numpy(float)
            err = np.vstack([s["tokens_per_s"] - s["ci_low"], s["ci_high"] - s["tokens_per_s"]]).astype(float)
            err[:, ~(s["calls"].to_numpy(float) >= MIN_CI_N)] = np.nan
            total.errorbar(dodge(total, b, i, len(labels)), s["tokens_per_s"], yerr=err, fmt="o-", capsize=4,
                           color=pal[label], label=label)
            decode.plot(b, s["decode_tokens_per_s"], "o-", color=pal[label], label=f"{label}, measured")
            if s["predicted"].notna().any():
                decode.plot(b, s["predicted"], "o--", color=pal[label], markerfacecolor="none",
                            label=f"{label}, predicted from the profile")
            sequence.plot(b, s["sequence_tokens_per_s"], "o-", color=pal[label], label=label)
            if s["all_hit"].notna().any():
                hits.plot(b, s["all_hit"], "o-", color=pal[label], label=f"{label}, all hit (measured)")
                hits.plot(b, s["p_hit_to_b"], "o:", color=pal[label], markerfacecolor="none",
                          label=f"{label}, p_hit^b")
        for key, style_ in (("measured", "-"), ("predicted", "--")):
            if crossover and crossover.get(key):
                decode.axvline(crossover[key], color="grey", linestyle=style_, linewidth=1,
                               label=f"b* {key} (fast backup reaches jit)")
        total.set(ylabel="tokens / s, all sequences",
                  title=f"Throughput; bars: 95% CI over calls, where {MIN_CI_N} or more")
        decode.set(ylabel="decode tokens / s", title="Decode: measured and predicted")
        sequence.set(xlabel="batch size b", ylabel="tokens / s, one sequence", title="What one sequence waits")
        hits.set(xlabel="batch size b", ylabel="rate", ylim=(-0.02, 1.02), title="Rounds in which every sequence hit")
        b_values = sorted(summary["batch_size"].unique())
        for ax in axes.ravel():
            ax.set_xticks(b_values)
            ax.set_xticklabels([str(int(b)) for b in b_values])
            legend_outside(ax)
        fig.suptitle(title)
        fig.tight_layout()
    return fig


# --- two engines on one machine (notebook 09) -----------------------------------------------------------------------

def own_ar_speedups(frame: pd.DataFrame, predicted: pd.DataFrame | None = None, predicted_label: str = "predicted"):
    """Each speculative method over its own engine's AR on the same prompt (sd over ar, llamacpp-sd over
    llamacpp-ar): bars of the mean over prompts ± CI per prompt set, a dashed line at 1, and a diamond per
    (prompt set, method) for its prediction where `predicted` gives one. Columns prompt_set, prompt_id, method,
    speedup; predicted: prompt_set, method, predicted."""
    check_frame(frame, ["prompt_set", "prompt_id", "method", "speedup"], "own_ar_speedups")
    groups, methods = ordered(frame["prompt_set"]), [str(m) for m in ordered(frame["method"])]
    s = summarise(frame, ["prompt_set", "method"], "speedup").set_index(["prompt_set", "method"])
    with styled():
        fig, ax = plt.subplots()
        xs = grouped_bars(ax, s, groups, methods, " measured")
        at = predicted.set_index(["prompt_set", "method"])["predicted"] if predicted is not None else pd.Series()
        marked = False
        for method, x in xs.items():
            p = at.reindex(pd.MultiIndex.from_product([groups, [method]])).to_numpy(float)
            if (have := ~np.isnan(p)).any():
                ax.plot(x[have], p[have], "D", color="black", markersize=7, label=None if marked else predicted_label)
                marked = True
        ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
        ax.set(xlabel="prompt set", ylabel="decode speed-up over its engine's AR",
               title=f"SD over its own engine's AR\n({ci_label(s.reset_index())})")
        legend_outside(ax)
    return fig


def engine_study(frame: pd.DataFrame):
    """Speed-up over its own engine's AR against the batch size b, one panel per prompt set: a line per series
    (e.g. "sd, torch (measured)", "ssd-pipeline, llama.cpp (Theorem 7)"), solid where measured and dashed where
    predicted, coloured by method; a dashed line at 1 and a dotted one at 1.1 (where a method pays). Columns
    prompt_set, batch_size, method, series, predicted (bool), speedup."""
    check_frame(frame, ["prompt_set", "batch_size", "method", "series", "predicted", "speedup"], "engine_study")
    groups = ordered(frame["prompt_set"])
    pal = method_colours(ordered(frame["method"]))
    with styled():
        fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4.2), sharey=True, squeeze=False)
        for ax, group in zip(axes[0], groups):
            g = frame[frame["prompt_set"] == group]
            for series in ordered(g["series"]):
                line = g[g["series"] == series].sort_values("batch_size")
                ax.plot(line["batch_size"], line["speedup"], "o--" if line["predicted"].iloc[0] else "o-",
                        color=pal[line["method"].iloc[0]], label=series)
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1)
            ax.axhline(1.1, color="black", linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{v:g}"))
            ax.set(xlabel="batch size b", ylabel="speed-up over its engine's AR", title=str(group), ylim=(0, None))
        legend_outside(axes[0][-1], "solid: measured; dashed: predicted")
        fig.tight_layout()
    return fig
