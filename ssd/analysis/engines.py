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

from ..bench import machines
from ..bench.profile import profiles_in, regime
from ..bench.stats import speedups
from ..core.latencies import Profile
from ..core.theory import sd_from_profile, theorem7_from_profile

LLAMA_CPP = "llama.cpp"
BENCH_PREFIX = "llamacpp_"  # data/<machine>/llamacpp_<prompt set>.json: ar, sd, llamacpp-ar, llamacpp-sd side by side
BENCH_PATTERN = f"{BENCH_PREFIX}*.json"
# data/<machine>/fastest_<prompt set>.json: the kit at its fastest forwards (int4, compiled: ssd.analysis.report's
# FAST) beside llama.cpp's AR: ar, sd, sd-1core, ssd-pipeline and llamacpp-ar side by side, with the profile's
# predictions (issue 56's regime, measured again)
FASTEST_PREFIX = "fastest_"
# data/<machine>/fastest-batches_<prompt set>.json: the same forwards' AR and SD at batch sizes 1 to 16 side by side
# (the batch-size study's break-even b, on these forwards)
FASTEST_BATCHES_PREFIX = "fastest-batches_"
DRIFT_PREFIX = "llamacpp-drift_"  # data/<machine>/llamacpp-drift_<prompt set>.json: python -m ssd llamacpp --drift
PAYS = 1.1  # a method "pays" on an engine where predicted at least this much over that engine's AR


def by_prompt_set(root: str, machine: str, prefix: str) -> dict[str, str]:
    """A machine's files named PREFIX<prompt set>.json (``BENCH_PREFIX``, ``DRIFT_PREFIX``), by prompt set."""
    paths = sorted(glob.glob(os.path.join(root, machine, f"{prefix}*.json")))
    return {os.path.basename(p)[len(prefix) : -len(".json")]: p for p in paths}


def read_by_prompt_set(root: str, machine: str, prefix: str) -> dict[str, dict]:
    """Those files' JSON, by prompt set."""
    out = {}
    for name, path in by_prompt_set(root, machine, prefix).items():
        with open(path) as f:
            out[name] = json.load(f)
    return out


def engine_machines(root: str) -> list[str]:
    """The machines under `root` that keep llama.cpp's profiles and at least one bench of both engines."""
    return [m for m in machines.stored_machines(root) if by_prompt_set(root, m, BENCH_PREFIX)
            and any(p.engine == LLAMA_CPP for p in profiles_in(os.path.join(root, m, "profiles")))]


def engine_machine(root: str, kind: dict, machine: str = "nearest") -> str:
    """The machine whose two engines to show: `machine`, or with 'nearest' the one nearest `kind` (itself first)
    among those that keep them (``engine_machines``, ``ssd.bench.machines.chosen``)."""
    return machines.chosen(root, kind, machine, engine_machines(root),
                           f"llama.cpp's profiles and a {BENCH_PATTERN} bench (make llamacpp measures them)")


def load_benches(root: str, machine: str) -> dict[str, dict]:
    """A machine's benches of both engines, {prompt set: the bench's JSON}."""
    return read_by_prompt_set(root, machine, BENCH_PREFIX)


def load_fastest(root: str, machine: str) -> dict[str, dict]:
    """A machine's benches of the kit at its fastest forwards beside llama.cpp's AR, {prompt set: the bench's JSON}
    ({} where it keeps none)."""
    return read_by_prompt_set(root, machine, FASTEST_PREFIX)


def load_fastest_batches(root: str, machine: str) -> dict[str, dict]:
    """A machine's benches of AR and SD by batch size at the fastest forwards, {prompt set: the bench's JSON} ({}
    where it keeps none)."""
    return read_by_prompt_set(root, machine, FASTEST_BATCHES_PREFIX)


def threads_label(profile: Profile) -> str:
    """How a profile's passes ran: llama.cpp's by threads, the kit's by the cores of each rank."""
    if profile.engine == LLAMA_CPP:
        n = len(profile.verifier_cores)
        return f"{n} thread{'s' if n > 1 else ''}"
    return f"target cores {profile.verifier_cores}, draft {profile.drafter_cores}"


def profile_label(profile: Profile) -> str:
    """A profile's curve in a legend: the engine, the precisions, compiled forwards where the kit's ran so, and how its
    passes ran ('torch bfloat16/int8, target cores [0], draft [1]')."""
    compiled = ", compiled" if profile.engine != LLAMA_CPP and profile.forward != "eager" else ""
    return (f"{profile.engine} {profile.precisions['target']}/{profile.precisions['draft']}{compiled}, "
            f"{threads_label(profile)}")


def regimes(profiles: list[Profile], k: int = 4, a: float = 0.8) -> pd.DataFrame:
    """One row per b = 1 profile: engine, core set, forward (the kit's eager or compiled; llama.cpp's its own),
    precisions, the one-token step and its memory floor, the verify pass over K + 1, v, the draft step, c, and SD's
    E / (cK + v) at acceptance a; the kit's first."""
    rows = [{"engine": p.engine, "threads": threads_label(p), "forward": p.forward if p.engine == "torch" else "-",
             **regime(p, k, a)} for p in profiles if p.batch_size == 1]
    frame = pd.DataFrame(rows)
    return frame.sort_values(["engine", "threads"], key=lambda c: c.map({"torch": 0}).fillna(1) if c.name == "engine"
                             else c, kind="stable", ignore_index=True)


def engine_profiles(profiles: list[Profile], engine: str, threads: int) -> dict[int, Profile]:
    """{b: profile} of one engine on a number of threads (llama.cpp) or cores per rank (the kit)."""
    return {p.batch_size: p for p in profiles if p.engine == engine and len(p.verifier_cores) == threads}


def tokens_per_round(result: dict, method: str) -> float:
    """A bench method's tokens per round over all its answers: the tokens its rounds made over their number (for
    llama.cpp's tool, every token it decoded, ``engine_new_tokens``, of which an answer keeps max_new_tokens)."""
    rows = pd.DataFrame(result["rows"])
    rows = rows[rows["method"] == method]
    if rows.empty:
        raise ValueError(f"the bench ran no {method}; it ran {sorted(set(pd.DataFrame(result['rows'])['method']))}")
    made = rows["engine_new_tokens"].fillna(rows["new_tokens"]) if "engine_new_tokens" in rows else rows["new_tokens"]
    return float(made.sum() / rows["rounds"].sum())


def measured_ratio(result: dict, method: str = "llamacpp-sd", peer: str = "llamacpp-ar",
                   measure: str = "decode_tokens_per_s") -> dict:
    """A bench's geometric mean over answers of method over peer, and its 95% interval (``against_peers``)."""
    for record in result["peers"]:
        if (record["method"], record["peer"], record["measure"]) == (method, peer, measure):
            return record
    raise ValueError(f"the bench holds no {method} / {peer} ratio of {measure}: run both in one bench")


def sd_check(result: dict, profile: Profile, k: int) -> pd.DataFrame:
    """SD's speed-up over AR on llama.cpp, predicted on `profile` (llama.cpp's, on the threads its tool ran on)
    against llamacpp-sd over llamacpp-ar measured (decode tokens/s, geometric mean over answers): one row per source
    of E, the kit's SD (``sd``) and llama.cpp's own (``llamacpp-sd``), on the same prompts. Two predictions: the
    kit's E / (cK + v), and llama.cpp's round as its tool runs it, E / (cK + g + v) (``theory.sd_from_profile``'s
    draft_pass: besides its K draft steps, its draft-simple drafter also runs the draft over every verify batch of
    K + 1 tokens, logits at the last: the profile's glue curve)."""
    record = measured_ratio(result)
    measured = record["geometric_mean"], record["ci"]
    replayed = profile.round_ms["round"] if profile.round_ms and profile.round_ms.get("k") == k else None
    rows = []
    for source in ("sd", "llamacpp-sd"):
        e = tokens_per_round(result, source)
        plain, its_round = sd_from_profile(profile, k, e), sd_from_profile(profile, k, e, draft_pass=True)
        c, v, g = its_round["profile_c"], its_round["profile_v"], its_round["profile_g"]
        rows.append({"tokens_per_round_from": source, "E": e, "c": c, "v": v, "g": g,
                     "predicted": plain["profile_speedup_vs_ar"],
                     "predicted_its_round": its_round["profile_speedup_vs_ar"], "measured": measured[0],
                     "measured_ci": measured[1], "error": plain["profile_speedup_vs_ar"] / measured[0] - 1,
                     "error_its_round": its_round["profile_speedup_vs_ar"] / measured[0] - 1,
                     "round_ms_profile": (c * k + g + v) * profile.target_at(1), "round_ms_replayed": replayed,
                     "round_ms_tool": tool_round_ms(result)})
    return pd.DataFrame(rows)


def tool_round_ms(result: dict, method: str = "llamacpp-sd") -> float:
    """ms a round of llama.cpp's speculative tool took in a bench: its decode time (all it decoded, the answers'
    share scaled back up) over its rounds."""
    rows = pd.DataFrame(result["rows"])
    rows = rows[rows["method"] == method]
    decode_s = (rows["wall_s"] - rows["prefill_s"]) * rows["engine_new_tokens"] / rows["new_tokens"]
    return float(decode_s.sum() / rows["rounds"].sum() * 1000)


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
        plain, its_round = sd_from_profile(whole[b], k, e), sd_from_profile(whole[b], k, e, draft_pass=True)
        rows.append({"prompts": prompts, "batch_size": b, "sd_E": e, "c": plain["profile_c"], "v": plain["profile_v"],
                     "sd_predicted": plain["profile_speedup_vs_ar"],
                     "sd_predicted_its_round": its_round["profile_speedup_vs_ar"],
                     "p_hit": ssd["run_p_hit"], "all_hit": ssd["run_all_hit"], "t_p": priced["profile_t_p"],
                     "t_b": priced["profile_t_b"], "ar_tokens_per_s": ar,
                     "pipeline_tokens_per_s": priced["profile_tokens_per_s"],
                     "pipeline_predicted": priced["profile_tokens_per_s"] / ar})
    return pd.DataFrame(rows)


def own_ar_ratios(results: dict[str, dict], value: str = "decode_tokens_per_s") -> pd.DataFrame:
    """Per prompt set and prompt: each engine's SD over that engine's AR on the same prompt (sd / ar, llamacpp-sd /
    llamacpp-ar), as ``plots.own_ar_speedups`` draws them."""
    frames = []
    for prompt_set, result in results.items():
        rows = pd.DataFrame(result["rows"]).astype({value: float})
        for method, own in (("sd", "ar"), ("llamacpp-sd", "llamacpp-ar")):
            pair = rows[rows["method"].isin([method, own])]
            frames.append(speedups(pair, own, value=value).assign(prompt_set=prompt_set))
    return pd.concat(frames, ignore_index=True)


def study_series(summary: pd.DataFrame, on_llama: pd.DataFrame, pipeline: str = "ssd-pipeline:jit") -> pd.DataFrame:
    """The study's speed-ups over AR at each b, as ``plots.engine_study`` draws them: the kit's SD and pipeline
    measured (decode tokens/s over AR's at that b, ``batch_study.by_batch_size``) beside llama.cpp's predicted
    (``study_on_engine``)."""
    rows = []
    for (prompt_set, b), g in summary.groupby(["prompts", "batch_size"], sort=False):
        rate = g.set_index("label")["decode_tokens_per_s"]
        for label, method in (("sd", "sd"), (pipeline, "ssd-pipeline")):
            if label in rate and "ar" in rate:
                rows.append({"prompt_set": prompt_set, "batch_size": b, "method": method, "predicted": False,
                             "series": f"{method}, torch (measured)", "speedup": rate[label] / rate["ar"]})
    for _, r in on_llama.iterrows():
        for column, method, how in (("sd_predicted_its_round", "llamacpp-sd", "E / (cK + g + v)"),
                                    ("pipeline_predicted", "ssd-pipeline", "Theorem 7")):
            rows.append({"prompt_set": r["prompts"], "batch_size": r["batch_size"], "method": method,
                         "predicted": True, "series": f"{method.replace('llamacpp-', '')}, llama.cpp ({how})",
                         "speedup": r[column]})
    return pd.DataFrame(rows)


def load_drift(root: str, machine: str) -> dict[str, dict]:
    """A machine's measured drift of llama.cpp's greedy margins (``python -m ssd llamacpp --drift``), by prompt set."""
    return read_by_prompt_set(root, machine, DRIFT_PREFIX)


def differences(results: dict[str, dict], drift: dict[str, dict]) -> pd.DataFrame:
    """Every llama.cpp answer that is not its AR's: where it first differs, AR's top-2 margin there, and whether
    that is a near-tie, within twice the largest drift measured on that prompt set (``ssd.llamacpp.rounding``)."""
    rows = []
    for name, result in results.items():
        bound = drift[name]["near_tie_bound"] if name in drift else None
        for row in result["rows"]:
            if row["method"] in ("llamacpp-sd",) and not row["identical_to_target"]:
                margin = row["margin_at_difference"]
                rows.append({"prompt_set": name, "prompt_id": row["prompt_id"], "first_difference":
                             row["first_difference"], "margin": margin, "near_tie_bound": bound,
                             "near_tie": None if bound is None or margin is None else margin <= bound})
    return pd.DataFrame(rows, columns=["prompt_set", "prompt_id", "first_difference", "margin", "near_tie_bound",
                                       "near_tie"])
