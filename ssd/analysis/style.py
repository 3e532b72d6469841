"""The look every figure of the kit shares: one palette and one colour per method through the course, the error bars
and what their legend says, and saving a figure.

Error bars are 95% Student-t confidence intervals over prompts (`ssd.bench.stats.mean_ci`), never seaborn's
bootstrap, so a figure is a deterministic function of its frame. Where a frame holds several rows per prompt and
setting (seeds, rounds), they are averaged per prompt first (`summarise`): the sample is the prompts. A rate's
interval is clipped to [0, 1]. A group of fewer than 3 prompts has no interval: it is drawn without an error bar, and
the legend says so. The style (seaborn "whitegrid", one palette) is applied while a figure is built (`styled`),
without touching the global rcParams. `caption` names the machine and precisions under a figure; `save` writes a
PNG atomically.
"""
from __future__ import annotations

import itertools
import os
from contextlib import contextmanager

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns

from ..bench.stats import MIN_CI_N, RATES, mean_ci
from ..files import atomic_path

PALETTE = "colorblind"
FIGSIZE = (7.0, 4.5)
DPI = 120
LEVEL = 0.95
CI_LABEL = "mean ± 95% CI over prompts"
RATE_CI_LABEL = "mean ± 95% CI over prompts, clipped to [0, 1]"
NO_CI_LABEL = f"mean over prompts; no interval from fewer than {MIN_CI_N} prompts"
CAPTION_GAP_PT = 6

# One colour per method through the whole course (colorblind palette): the baselines in earth tones, SD in blues,
# SSD in orange and green, llama.cpp's AR and SD in yellow and red. A variant ("ar:batch_size=8", "ssd-pipeline:backup=fast") takes its method's hue, in a
# shade of its own where several variants of one method share a figure.
METHOD_COLOURS = {"ar": 7, "hf-ar": 5, "sd": 0, "sd-1core": 9, "hf-sd": 4, "ssd": 1, "ssd-pipeline": 2, "llamacpp-ar": 8,
                  "llamacpp-sd": 3}



# --- style and shared helpers ---------------------------------------------------------------------------------------

def style() -> dict:
    """The rcParams every figure here is built under: seaborn whitegrid, notebook context, one palette."""
    from cycler import cycler

    return {
        **sns.axes_style("whitegrid"),
        **sns.plotting_context("notebook"),
        "axes.prop_cycle": cycler(color=sns.color_palette(PALETTE)),
        "figure.figsize": FIGSIZE,
    }


@contextmanager
def styled():
    """Build a figure in the kit's style, leaving the global rcParams as they were, but for one: matplotlib's
    interactive mode. The first figure of a Jupyter kernel loads the inline backend, which turns interactive mode on
    so that every figure a cell makes is shown under it; restored to off as the context closes, every later figure of
    the notebook was drawn and saved but never shown (the stored notebooks kept only its path)."""
    with plt.rc_context(style()):
        try:
            yield
        finally:
            interactive = matplotlib.is_interactive()
    matplotlib.interactive(interactive)


def format_value(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float, np.number)) else str(value)


def colours(n: int) -> list:
    return sns.color_palette(PALETTE, max(n, 1))


def method_colours(methods) -> dict[str, tuple]:
    """The colour of each method name (or variant) in `methods`: its method's, from METHOD_COLOURS; the second and
    later variants of one method darker by turns. A method the kit does not name takes a colour left over."""
    palette = sns.color_palette(PALETTE, 10)
    spare = itertools.cycle([c for i, c in enumerate(palette) if i not in METHOD_COLOURS.values()])
    hues, shades, out = {}, {}, {}
    for name in dict.fromkeys(str(m) for m in methods):
        base = name.split(":")[0]
        if base not in hues:
            hues[base] = palette[METHOD_COLOURS[base]] if base in METHOD_COLOURS else next(spare)
        n = shades[base] = shades.get(base, -1) + 1
        out[name] = tuple(float(c) * (1 - 0.22 * (n % 4)) for c in hues[base])
    return out


def check_frame(frame: pd.DataFrame, columns, name: str, allow_empty: bool = False) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        raise ValueError(f"{name} needs a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ValueError(f"{name} needs columns {list(columns)}; missing {missing} (has {list(frame.columns)})")
    if frame.empty and not allow_empty:
        raise ValueError(f"{name} got an empty frame")
    return frame


def ordered(values) -> list:
    """Distinct values in order of first appearance (categories first for an ordered categorical)."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        present = set(values)
        return [c for c in values.cat.categories if c in present]
    return list(pd.unique(pd.Series(values).dropna()))


def summarise(frame: pd.DataFrame, by, value: str) -> pd.DataFrame:
    """One mean per (by..., prompt), then mean ± CI over prompts per `by` group, with error-bar half-widths.

    Columns: by..., mean, ci_low, ci_high, n, err_low, err_high (0 where one prompt gives no interval).
    """
    by = [by] if isinstance(by, str) else list(by)
    frame = frame.assign(**{value: frame[value].astype(float)})  # None (e.g. AR's acceptance rate) -> NaN
    per_prompt = frame.groupby([*by, "prompt_id"], sort=False, observed=True)[value].mean().reset_index()
    per_prompt = per_prompt[per_prompt[value].notna()]  # a prompt with no value is no sample
    if per_prompt.empty:
        raise ValueError(f"no {value} values to average (every row is None/NaN)")
    out = mean_ci(per_prompt, by, value, level=LEVEL)
    out["err_low"] = (out["mean"] - out["ci_low"]).fillna(0.0)
    out["err_high"] = (out["ci_high"] - out["mean"]).fillna(0.0)
    return out


def ci_label(*summaries: pd.DataFrame, value: str | None = None) -> str:
    """What the error bars of these summarise() frames are: an interval (clipped for a rate) or, where a group had
    too few prompts, none."""
    if any((s["n"] < MIN_CI_N).any() for s in summaries):
        return NO_CI_LABEL
    return RATE_CI_LABEL if value in RATES else CI_LABEL


def legend_outside(ax, title: str | None = None):
    """The legend right of the axes: its labels say what the error bars are, which makes it too long to sit on the
    data without hiding some."""
    return ax.legend(title=title, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small",
                     title_fontsize="small")


def dodge(ax, x, i: int, n: int, share: float = 0.08):
    """x of series i of n shifted sideways so error bars at one x do not overlap, on the axis's scale (linear, log,
    symlog: set the scale first). The shift is a small share of the smallest gap between x values; the data stay in
    data coordinates, so autoscaling still sees them."""
    x = np.asarray(x, dtype=float)
    if n <= 1 or len(x) == 0:
        return x
    scale = ax.xaxis.get_transform()
    scaled = scale.transform(x.reshape(-1, 1)).ravel()
    distinct = np.unique(scaled)
    gap = np.diff(distinct).min() if len(distinct) > 1 else 1.0
    shifted = scaled + (i - (n - 1) / 2) * share * gap
    return scale.inverted().transform(shifted.reshape(-1, 1)).ravel()


def error_bars(s: pd.DataFrame, suffix: str = "") -> np.ndarray:
    """Error-bar half-widths [2, groups] of summarise() rows; NaN where a group has no interval (fewer than
    MIN_CI_N prompts), which draws nothing there rather than a cap of zero length."""
    err = s[[f"err_low{suffix}", f"err_high{suffix}"]].to_numpy(float).T.copy()
    err[:, ~(s[f"n{suffix}"].to_numpy(float) >= MIN_CI_N)] = np.nan
    return err


def errorbar(ax, x, s: pd.DataFrame, *, label: str, colour, fmt="o-", **kw):
    yerr = error_bars(s)
    return ax.errorbar(np.asarray(x, dtype=float), s["mean"].to_numpy(float), yerr=yerr, fmt=fmt, capsize=4,
                       color=colour, label=label, **kw)


def setting_line(machine: str, target: str, draft: str) -> str:
    """'AMD EPYC (2 cores), AVX512, native bfloat16 · target bfloat16, draft int8': where a figure's numbers were
    measured and at which precisions (``caption`` puts it under the figure)."""
    return f"{machine} · target {target}, draft {draft}"


def pair_line(pair) -> str:
    """``setting_line`` for a pair measured in this process, on this machine (a GPU by its name, a CPU by its model,
    cores, ISA and native precisions)."""
    from ..models.capability import capability_line, device_name

    device = pair.target.device
    machine = capability_line() if device.type == "cpu" else device_name(device)
    return setting_line(machine, pair.precisions.target, pair.precisions.draft)


def result_line(result: dict, pair, machine: str) -> str:
    """``setting_line`` for a bench result a notebook shows (``ssd.analysis.stored_files.stored_or_run``):
    ``pair_line`` where this process measured it (no source); else the stored machine (`machine`, its words:
    ``ssd.bench.machines.describe``) at the precisions its source ran at, saying where it was not measured on this
    kind of machine."""
    source = result["source"]
    if source is None:
        return pair_line(pair)
    line = setting_line(machine, source.target, source.draft)
    where = "not measured here" if result["elsewhere"] else "on this kind of machine"
    return f"{line} · stored, {where}"


def profiles_line(profiles: dict) -> str:
    """``setting_line`` for latency profiles {label: Profile} drawn in one figure: the machine each was measured on
    (its CPU, cores, ISA and native precisions, as the profile recorded them) and every label's precisions."""
    from ..models.capability import capability_line

    if not profiles:
        raise ValueError("profiles must hold at least one profile to name its machine")
    by_machine = {}
    for label, profile in profiles.items():
        by_machine.setdefault(capability_line(profile.capability), []).append(label)
    return "; ".join(f"{machine} · {'; '.join(labels)}" for machine, labels in by_machine.items())


def caption(fig, line: str):
    """Write `line` (``setting_line``: the machine and the precisions) in small grey type under the figure, so the
    saved PNG says where its numbers came from wherever it is shown; returns the figure."""
    from matplotlib.transforms import offset_copy

    # a few points below the figure's edge, which an x-axis label may reach: the caption never touches it
    below = offset_copy(fig.transFigure, fig=fig, y=-CAPTION_GAP_PT, units="points")
    fig.text(0.01, 0.0, line, ha="left", va="top", fontsize="small", color="0.35", transform=below)
    return fig


def save(fig, path) -> str:
    """Write `fig` as a PNG (dpi 120, tight box) atomically, creating the folder; returns the path."""
    path = os.fspath(path)
    if os.path.splitext(path)[1].lower() != ".png":
        raise ValueError(f"path must end in .png (save writes a PNG), got {path!r}")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=DPI, bbox_inches="tight")
    return path


