"""The benchmark: methods run side by side on the same prompts, in one process, interleaved per prompt.

Figures worth trusting on a noisy clock are ratios measured in one run, so every method sees each prompt before
the next prompt starts, and the order of methods rotates from prompt to prompt so no method always runs first.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from datetime import datetime, timezone

import pandas as pd
import torch
from tqdm.auto import tqdm

from .decoding import DecodeConfig, generate_ar
from .methods import get_method
from .prompts import encode
from .theory import measured_theorem7
from .trace import Trace

# Each of ours next to the transformers peer that does the same job.
PEERS = {"ar": "hf-ar", "sd": "hf-sd"}


def run_one(method: str, pair, prompt_ids, config: DecodeConfig, seed: int) -> tuple[list[int], dict, Trace]:
    generator = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    tokens, trace = get_method(method)(pair, prompt_ids, config, generator)
    wall = time.perf_counter() - start
    return tokens, {
        "method": method,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "tokens_per_s": len(tokens) / wall,
        "drafted": trace.drafted,
        "accepted": sum(r.accepted for r in trace.rounds),
        "rounds": len(trace.rounds),
        "acceptance_rate": trace.acceptance_rate,
        "mean_accepted": trace.mean_accepted,
        "hit_rate": trace.hit_rate,
    }, trace


def warm_up(pair, prompt_ids, methods: list[str], config: DecodeConfig) -> None:
    """One short untimed call per method: first calls pay for allocator growth and lazy initialisation."""
    short = dataclasses.replace(config, max_new_tokens=min(8, config.max_new_tokens))
    for method in methods:
        run_one(method, pair, prompt_ids, short, seed=0)


def run_bench(pair, prompts, methods: list[str], config: DecodeConfig, seed: int = 0, progress: bool = True) -> dict:
    """Returns {"rows": [...], "summary": [...]}: one row per (method, prompt), one summary row per method.

    config is shared by every method (an SSDConfig carries what ssd needs; the others ignore those fields).
    """
    encoded = [(p.id, encode(pair.tokenizer, p)) for p in prompts]
    warm_up(pair, encoded[0][1], methods, config)
    greedy = config.temperature == 0
    rows, rounds = [], []
    bar = tqdm(total=len(encoded) * len(methods), desc="bench", disable=not progress)
    for i, (prompt_id, ids) in enumerate(encoded):
        reference = None
        if greedy and "ar" not in methods:
            reference, _ = generate_ar(pair, ids, config, torch.Generator().manual_seed(seed + i))
        for j in range(len(methods)):
            method = methods[(i + j) % len(methods)]
            bar.set_postfix_str(f"{prompt_id} {method}")
            tokens, row, trace = run_one(method, pair, ids, config, seed=seed + i)
            if trace.rounds:
                rounds.append(trace.to_frame())
            if method == "ar":
                reference = tokens
            rows.append({"prompt_id": prompt_id, "prompt_tokens": len(ids), **row, "tokens": tokens})
            bar.update()
        for row in rows[-len(methods):]:
            row["identical_to_target"] = row.pop("tokens") == reference if greedy else None
    bar.close()
    return {"rows": rows, "summary": summarize(pd.DataFrame(rows), pd.concat(rounds) if rounds else None)}


def summarize(rows: pd.DataFrame, rounds: pd.DataFrame | None = None) -> list[dict]:
    """tokens/s = total new tokens / total wall time (long prompts weigh by their length, as a user's clock does)."""
    summary = []
    for method, g in rows.groupby("method", sort=False):
        drafted = g["drafted"].sum()
        summary.append(
            {
                "method": method,
                "prompts": len(g),
                "new_tokens": int(g["new_tokens"].sum()),
                "wall_s": float(g["wall_s"].sum()),
                "tokens_per_s": float(g["new_tokens"].sum() / g["wall_s"].sum()),
                "acceptance_rate": float(g["accepted"].sum() / drafted) if drafted else None,
                "mean_accepted": float(g["accepted"].sum() / g.loc[g["drafted"] > 0, "rounds"].sum()) if drafted else None,
                "identical_to_target": bool(g["identical_to_target"].all()) if g["identical_to_target"].notna().all() else None,
            }
        )
    tps = {s["method"]: s["tokens_per_s"] for s in summary}
    for s in summary:
        s["speedup_vs_ar"] = s["tokens_per_s"] / tps["ar"] if "ar" in tps else None
        peer = PEERS.get(s["method"])
        s["speedup_vs_peer"] = s["tokens_per_s"] / tps[peer] if peer in tps else None
    for name in ("ssd", "ssd-pipeline"):
        if rounds is None or name not in tps:
            continue
        # Theorem 7 from what the method's rounds measured: for ssd, what drafting and verifying on two devices would
        # give; for ssd-pipeline, the prediction to hold against its measured speedup_vs_ar.
        ar_step_s = 1 / tps["ar"] if "ar" in tps else None
        ssd = next(s for s in summary if s["method"] == name)
        ssd["hit_rate"] = float(rounds.loc[rounds.method == name, "hit"].astype(bool).mean())
        ssd.update(measured_theorem7(rounds[rounds.method == name], ar_step_s))
    return summary


def load_rows(path: str) -> pd.DataFrame:
    """The per-(method, prompt) rows of a bench result written by `python -m ssd bench --json PATH`."""
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or "rows" not in result:
        raise ValueError(f"{path} is not a bench result (a JSON object with 'rows'; write one with --json)")
    return pd.DataFrame(result["rows"])


def environment() -> dict:
    import transformers

    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def summary_table(summary: list[dict]) -> str:
    columns = ["method", "new_tokens", "wall_s", "tokens_per_s", "speedup_vs_ar", "speedup_vs_peer",
               "acceptance_rate", "mean_accepted", "hit_rate", "t_p", "t_b", "predicted_speedup_vs_ar",
               "identical_to_target"]
    frame = pd.DataFrame(summary).reindex(columns=columns).dropna(axis=1, how="all")
    return frame.to_string(index=False, float_format=lambda x: f"{x:.3f}")
