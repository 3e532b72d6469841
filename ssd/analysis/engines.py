"""Two engines on one machine: the kit's PyTorch models at their precisions beside llama.cpp on the same GGUF files
(notebook 06's last section). Whether SD pays rests on v (a verify pass over K + 1 tokens in one-token steps) and c
(a draft step over a target step); whether the pipeline pays, on Theorem 7's T_p and T_b, read off the same curves.

- ``regimes``: v, c and SD's E / (cK + v) at a stated acceptance for every stored profile of a machine at b = 1, one
  row per engine, precision and core set.
- ``sd_check``: SD's predicted speed-up on llama.cpp, E / (cK + v) from llama.cpp's profile on the threads its tool
  ran on, with the tokens per round of the kit's SD and of llama.cpp's own on the same prompts, beside
  ``llamacpp-sd`` over ``llamacpp-ar`` measured in one bench.
- ``study_on_engine``: the same prediction for SD, and Theorem 7 for the two-rank pipeline, at every batch size of a
  machine's stored study: its hit rates, all-hit rates and tokens per round (the kit's SSD on the same prompts)
  priced on llama.cpp's profiles timed at that b (one thread per model for the pipeline's ranks; every thread for SD
  and AR, as llama.cpp runs them).
"""
from __future__ import annotations

import glob
import json
import os

import pandas as pd

from ..bench.profile import regime
from ..core.latencies import Profile
from ..core.theory import theorem7_from_profile

LLAMA_CPP = "llama.cpp"
SD_BAR = 0.15  # the bar: SD's predicted speed-up on llama.cpp within 15% of the measured one
PAYS = 1.1  # a method "pays" on an engine where predicted at least this much over that engine's AR


def stored_profiles(folder: str) -> list[Profile]:
    """Every profile among a folder's JSON files (data/<machine>/profiles), the kit's and llama.cpp's."""
    found = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        with open(path) as f:
            record = json.load(f)
        if isinstance(record, dict) and "target_ms" in record:
            found.append(Profile.from_dict(record))
    return found


def threads_label(profile: Profile) -> str:
    """How a profile's passes ran: llama.cpp's by threads, the kit's by the cores of each rank."""
    if profile.engine == LLAMA_CPP:
        n = len(profile.verifier_cores)
        return f"{n} thread{'s' if n > 1 else ''}"
    return f"target cores {profile.verifier_cores}, draft {profile.drafter_cores}"


def regimes(profiles: list[Profile], k: int = 4, a: float = 0.8) -> pd.DataFrame:
    """One row per b = 1 profile: engine, precisions, core set, the one-token step and its memory floor, the verify
    pass over K + 1, v, the draft step, c, and SD's E / (cK + v) at acceptance a; the kit's first."""
    rows = [{"engine": p.engine, "threads": threads_label(p), **regime(p, k, a)} for p in profiles
            if p.batch_size == 1]
    frame = pd.DataFrame(rows)
    return frame.sort_values(["engine", "threads"], key=lambda c: c.map({"torch": 0}).fillna(1) if c.name == "engine"
                             else c, kind="stable", ignore_index=True)


def engine_profiles(profiles: list[Profile], engine: str, threads: int) -> dict[int, Profile]:
    """{b: profile} of one engine on a number of threads (llama.cpp) or cores per rank (the kit)."""
    return {p.batch_size: p for p in profiles if p.engine == engine and len(p.verifier_cores) == threads}


def tokens_per_round(result: dict, method: str) -> float:
    """A bench method's tokens per target pass after the prompt's, over all its answers: new tokens over rounds."""
    rows = pd.DataFrame(result["rows"])
    rows = rows[rows["method"] == method]
    if rows.empty:
        raise ValueError(f"the bench ran no {method}; it ran {sorted(set(pd.DataFrame(result['rows'])['method']))}")
    return float(rows["new_tokens"].sum() / rows["rounds"].sum())


def measured_ratio(result: dict, method: str = "llamacpp-sd", peer: str = "llamacpp-ar",
                   measure: str = "decode_tokens_per_s") -> dict:
    """A bench's geometric mean over answers of method over peer, and its 95% interval (``against_peers``)."""
    for record in result["peers"]:
        if (record["method"], record["peer"], record["measure"]) == (method, peer, measure):
            return record
    raise ValueError(f"the bench holds no {method} / {peer} ratio of {measure}: run both in one bench")


def sd_check(result: dict, profile: Profile, k: int) -> pd.DataFrame:
    """SD's speed-up over AR on llama.cpp, predicted by E / (cK + v) on `profile` (llama.cpp's, on the threads its
    tool ran on), against llamacpp-sd over llamacpp-ar measured (decode tokens/s, geometric mean over answers): one
    row per source of E, the kit's SD (``sd``) and llama.cpp's own (``llamacpp-sd``), on the same prompts."""
    measured = measured_ratio(result)
    step = profile.target_at(1)
    c, v = profile.draft_at(1) / step, profile.target_at(k + 1) / step
    rows = []
    for source in ("sd", "llamacpp-sd"):
        e = tokens_per_round(result, source)
        predicted = sd_speedup_e(e, k, c, v)
        rows.append({"tokens_per_round_from": source, "E": e, "c": c, "v": v, "predicted": predicted,
                     "measured": measured["geometric_mean"], "measured_ci": measured["ci"],
                     "error": predicted / measured["geometric_mean"] - 1})
    return pd.DataFrame(rows)


def sd_speedup_e(e: float, k: int, c: float, v: float) -> float:
    """E / (cK + v) given E itself (``theory.sd_speedup`` takes the acceptance rate)."""
    return e / (c * k + v)


def study_on_engine(study: pd.DataFrame, ranks: dict[int, Profile], whole: dict[int, Profile], k: int,
                    budget: int, pipeline: str = "ssd-pipeline:jit") -> pd.DataFrame:
    """Per prompt set and batch size of a machine's stored study (``batch_study.stored_study``: the kit's SD and SSD
    on those prompts) where llama.cpp's profiles were timed: SD's E / (cK + v) with the study's SD tokens per round
    (its mean accepted count + 1, as the bench prices SD) on `whole` (every thread), and Theorem 7 for the pipeline
    (``theorem7_from_profile``: the pipeline's form, jit backup) with the study's hit rate, all-hit rate and tokens
    per round after hits and after misses on `ranks` (one thread per model); the pipeline as tokens/s and over
    llama.cpp's AR at that b on every thread (b sequences a step)."""
    rows = []
    runs = study.groupby(["prompts", "batch_size", "label"], sort=False).first()
    for (prompts, b), g in runs.groupby(level=["prompts", "batch_size"], sort=False):
        if b not in ranks or b not in whole or not {"sd", pipeline} <= set(g.index.get_level_values("label")):
            continue
        sd, ssd, step = g.xs("sd", level="label").iloc[0], g.xs(pipeline, level="label").iloc[0], whole[b].target_at(1)
        e = sd["run_mean_accepted"] + 1
        priced = theorem7_from_profile(ranks[b], k, budget, ssd["run_p_hit"], ssd["run_e_hit"], ssd["run_e_miss"],
                                       "jit", ssd["run_all_hit"])
        ar = b * 1000 / step
        rows.append({"prompts": prompts, "batch_size": b, "sd_E": e,
                     "c": whole[b].draft_at(1) / step, "v": whole[b].target_at(k + 1) / step,
                     "sd_predicted": sd_speedup_e(e, k, whole[b].draft_at(1) / step, whole[b].target_at(k + 1) / step),
                     "p_hit": ssd["run_p_hit"], "all_hit": ssd["run_all_hit"], "t_p": priced["profile_t_p"],
                     "t_b": priced["profile_t_b"], "ar_tokens_per_s": ar,
                     "pipeline_tokens_per_s": priced["profile_tokens_per_s"],
                     "pipeline_predicted": priced["profile_tokens_per_s"] / ar})
    return pd.DataFrame(rows)
