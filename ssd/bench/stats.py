"""Summary statistics over prompts: Student-t confidence intervals, paired differences and speed-ups, the numbers
every table and figure of the kit reports with its interval."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats


MIN_CI_N = 3  # a t-interval from two values says little, and at n = 2 its half-width is 12.7 standard errors
RATES = ("acceptance_rate", "hit_rate")  # fractions: neither they nor their intervals may leave [0, 1]


def mean_ci(frame: pd.DataFrame, by, value: str, level: float = 0.95) -> pd.DataFrame:
    """Mean of `value` over the rows of each group (prompts), with a Student-t confidence interval.

    A group of fewer than MIN_CI_N rows gets no interval (NaN). The interval of a rate (a value in RATES) is clipped
    to [0, 1]: the t-interval is symmetric, a rate is not, and near 0 or 1 it would otherwise promise the impossible.
    """
    low, high = (0.0, 1.0) if value in RATES else (-math.inf, math.inf)

    def one(g):
        n, mean = len(g), g[value].mean()
        if n < MIN_CI_N:
            return pd.Series({"mean": mean, "ci_low": math.nan, "ci_high": math.nan, "n": n})
        half = stats.t.ppf((1 + level) / 2, n - 1) * g[value].std(ddof=1) / n**0.5
        return pd.Series({"mean": mean, "ci_low": max(mean - half, low), "ci_high": min(mean + half, high), "n": n})

    # dropna=False: a NaN key is a setting too (uniform's assumed_a_p, say), not a row to lose.
    return frame.groupby(by, sort=False, dropna=False)[[value]].apply(one).reset_index()


def paired_difference(frame: pd.DataFrame, by, column: str, a, b, value: str, level: float = 0.95) -> pd.DataFrame:
    """Mean over prompts of (value where column == a) - (value where column == b), paired per prompt, with a
    Student-t CI: the comparison of two settings measured on the same prompts (geometric - uniform, C = 0.1 - C = 1)."""
    wide = frame.pivot_table(index=[*by, "prompt_id"], columns=column, values=value).reset_index()
    missing = [s for s in (a, b) if s not in wide.columns]
    if missing:
        raise ValueError(f"{column} has no rows for {missing}; present: {sorted(frame[column].unique())}")
    return mean_ci(wide.assign(difference=wide[a] - wide[b]), by, "difference", level)


def speedups(rows: pd.DataFrame, baseline: str, by=(), value: str = "tokens_per_s") -> pd.DataFrame:
    """Each method's `value` over the baseline method's on the same prompt: one row per (by..., prompt_id, method
    other than the baseline), column speedup. Ratios are paired per prompt, so `mean_ci(out, [*by, "method"],
    "speedup")` is the speed-up's CI over prompts. Columns of `rows`: by..., prompt_id, method, value (a bench's rows).
    """
    by = [by] if isinstance(by, str) else list(by)
    missing = [c for c in [*by, "prompt_id", "method", value] if c not in rows.columns]
    if missing:
        raise ValueError(f"rows need columns {[*by, 'prompt_id', 'method', value]}; missing {missing}")
    methods = list(pd.unique(rows["method"]))
    if baseline not in methods:
        raise ValueError(f"baseline must be one of the methods in rows {methods}, got {baseline!r}")
    wide = rows.pivot_table(index=[*by, "prompt_id"], columns="method", values=value, sort=False)
    ratios = wide.div(wide[baseline], axis=0).drop(columns=baseline)
    long = ratios.reset_index().melt(id_vars=[*by, "prompt_id"], var_name="method", value_name="speedup")
    # A prompt the baseline or the method did not run is no sample; methods keep the order of the rows.
    return long.dropna(subset=["speedup"]).reset_index(drop=True)


def geometric_mean_ci(ratios: pd.Series, level: float = 0.95) -> dict:
    """The geometric mean of per-answer ratios with the Student-t interval of their mean log, exponentiated: ratios
    multiply, so they are averaged on the log scale (a 2x and a 0.5x average to 1x, not 1.25x). No interval from
    fewer than MIN_CI_N answers (NaN). The one convention of every speed-up the kit reports."""
    logs = pd.DataFrame({"log": np.log(ratios.astype(float)), "all": 0}).dropna()
    ci = mean_ci(logs, "all", "log", level).iloc[0]
    return {"mean": float(np.exp(ci["mean"])), "ci_low": float(np.exp(ci["ci_low"])),
            "ci_high": float(np.exp(ci["ci_high"])), "n": int(ci["n"])}
