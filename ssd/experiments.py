"""Experiments that return tidy DataFrames: one row per round, per (prompt, setting), or per aggregate."""
from __future__ import annotations

import pandas as pd
import torch
from scipy import stats
from tqdm.auto import tqdm

from .prompts import encode
from .ssd import SSDConfig, counterfactual_hits, generate_ssd


def ssd_rounds(pair, prompts, config: SSDConfig, seed: int = 0, progress: bool = True) -> pd.DataFrame:
    """Run SSD on every prompt; one row per round, with prompt_id. Prompt i uses seed + i."""
    frames = []
    for i, prompt in enumerate(tqdm(prompts, desc="ssd", disable=not progress)):
        _, trace = generate_ssd(pair, encode(pair.tokenizer, prompt), config, torch.Generator().manual_seed(seed + i))
        frames.append(trace.to_frame().assign(prompt_id=prompt.id))
    return pd.concat(frames, ignore_index=True)


def hit_rate_curves(rounds: pd.DataFrame, budgets, k: int, strategies, a_p: float = 0.6, r: float = 0.5) -> pd.DataFrame:
    """Counterfactual hit rate per (prompt, strategy, budget) from rounds run with the jit backup and C = 1."""
    rows = []
    for prompt_id, frame in rounds.groupby("prompt_id", sort=False):
        for strategy in strategies:
            hits = counterfactual_hits(frame, budgets, k, strategy, a_p=a_p, r=r)
            for budget, g in hits.groupby("budget"):
                rows.append({"prompt_id": prompt_id, "strategy": strategy, "budget": budget, "hit_rate": g.hit.mean(),
                             "rounds": len(g)})
    return pd.DataFrame(rows)


def mean_ci(frame: pd.DataFrame, by, value: str, level: float = 0.95) -> pd.DataFrame:
    """Mean of `value` over the rows of each group (prompts), with a Student-t confidence interval."""

    def one(g):
        n, mean = len(g), g[value].mean()
        half = stats.t.ppf((1 + level) / 2, n - 1) * g[value].std(ddof=1) / n**0.5 if n > 1 else float("nan")
        return pd.Series({"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": n})

    return frame.groupby(by, sort=False)[[value]].apply(one).reset_index()
