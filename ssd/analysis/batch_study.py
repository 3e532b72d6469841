"""The batch-size study (notebook 08, `sweeps/batches.yaml`): where SD and SSD stop paying as b grows.

A sweep point is one side-by-side bench at one batch size b on one prompt set. ``point_table`` turns it into the
table the sweep keeps: one row per (method, call), a call being one batch of b prompts decoded together (its rows
share every forward and its wall time), with the whole run's figures per method beside it (``run_`` columns: the
measured rates, Theorem 7 and SD's speed-up fed by the profile timed at b). The calls are the samples of the study:
the answers of one call are not independent, so intervals are over calls (16 prompts: 16 calls at b = 1; two at
b = 8 and one at b = 16, which get none: a t-interval needs ``stats.MIN_CI_N`` values).

A machine's stored study (``stored_study``, data/<machine>/) is the sweep's table, or one bench per prompt set with
every b a variant of it (``python -m ssd bench --methods M,M:batch_size=2,...``) turned into that table by
``bench_table``; ``study_machine`` picks the machine whose study to show.

The rest reads the kept table back: tokens/s per method and b with those intervals, predicted beside measured, the
all-hit rate beside p_hit^b, the crossover b* of the two backups and SD's break-even batch size.
"""
from __future__ import annotations

import json
import os
import re

import pandas as pd

from ..bench import machines
from ..bench.summaries import summarize
from ..checks import is_auto, parse_variant
from ..bench.stats import mean_ci
from ..bench.profile import profiles_in
from ..core.latencies import Profile
from ..core.theory import critical_batch_size, sd_from_profile, theorem7_from_profile
from ..models.capability import capability_line, kind_of

# Where a call's time went (ssd.bench.run: the call's, the same on each of its rows): the target's forwards in this
# process (for the pipeline, the verifier's), the first of them (the prompts' pass) and the rest of the call
FORWARD_COLUMNS = ["target_forwards", "target_forward_s", "first_target_forward_s", "outside_forwards_s"]
# The whole run's figures per method kept beside each call (prefixed run_)
RUN_COLUMNS = ["tokens_per_s", "decode_tokens_per_s", "sequence_tokens_per_s", "acceptance_rate", "mean_accepted",
               "hit_rate", "all_hit", "p_hit", "e_hit", "e_miss", "fast_backup_share", "profile_tokens_per_s",
               "profile_speedup_vs_ar", "profile_t_p", "profile_t_b", "decode_over_profile_prediction",
               "t_p", "t_b", "verify_s", "tokens_per_verify", "identical_to_target", "identical_share",
               "differences_at_near_ties"]
# How a call's rounds went (``call_rounds``; ``round_account`` reads them): its rounds, the share of row-rounds still
# live, the verifier's time in its verify steps and waiting for drafts, and whether those verify steps hold the
# prompts' pass (its first round fed them)
ROUND_COLUMNS = ["rounds", "live_share", "verify_s", "wait_s", "prompts_in_verify"]
CALL_COLUMNS = ["method", "batch_size", "call", "answers", "new_tokens", "wall_s", "tokens_per_s",
                "sequence_tokens_per_s", "decode_tokens_per_s", "identical_to_target", "identical_share",
                "differences_at_near_ties",
                *FORWARD_COLUMNS, *ROUND_COLUMNS]
# What prices a method at b (``bench_table``): the run_ figures of a prediction and the profile timed at b
PRICE_COLUMNS = ["run_profile_tokens_per_s", "run_profile_speedup_vs_ar", "run_profile_t_p", "run_profile_t_b",
                 "run_decode_over_profile_prediction"]
PROFILE_COLUMNS = ["profile_measured_at", "profile_step_ms", "profile_verify_ms"]
# A machine's stored study in data/<machine>/: the sweep's table (sweeps/batches.yaml), else one bench per prompt set
SWEEP_TABLE = "batches.csv"
STUDY_BENCHES = ("batches_humaneval.json", "batches_prose.json")
ROUNDS_TABLE = "batch_rounds.csv"  # the pipeline's rounds timed (sweeps/batch_rounds.yaml)


def label(method: str) -> str:
    """A method's name in the study: the base method, and the backup where a variant sets one (ssd-pipeline:jit)."""
    base, overrides = parse_variant(method)
    return f"{base}:{overrides['backup']}" if "backup" in overrides else base


def point_table(result: dict, prompts: str, **about) -> pd.DataFrame:
    """A bench's result (``ssd.bench.run.run_bench``) as the sweep's table: one row per (method, call) with the call's
    batch size and own rates, the run's per method in ``run_`` columns, and a column for each of `about` (what a
    reader of the kept table needs to know of the run: the machine, the precision, when the profile was timed)."""
    rows = pd.DataFrame(result["rows"])
    if "call" not in rows:
        raise ValueError("the bench's rows carry no call column: a bench from before the batch study")
    calls = pd.DataFrame([summarize(g)[0] | g.iloc[0].reindex(FORWARD_COLUMNS).to_dict()
                          | {"call": call, "answers": len(g)}
                          for (_, call), g in rows.groupby(["method", "call"], sort=False)])
    calls = calls.merge(call_rounds(rows, result.get("spans")), on=["method", "call"], how="left")
    calls = calls.reindex(columns=CALL_COLUMNS)
    run = pd.DataFrame(result["summary"]).set_index("method").reindex(columns=RUN_COLUMNS).add_prefix("run_")
    table = calls.join(run, on="method")
    table.insert(0, "prompts", prompts)
    table.insert(2, "label", table["method"].map(label))
    return table.assign(**about)


def bench_table(result: dict, profiles: dict[int, Profile] | None = None) -> pd.DataFrame:
    """A bench that ran the study's methods at every b side by side (variants M:batch_size=b, one prompt set) as the
    sweep's table (``point_table``), each b priced with the profile timed at it: `profiles` ({b: profile}) and the
    bench's own, which wins for its b (a bench read one profile, so its summary priced that b alone). A method at a
    b with no profile, or with K, B or the backup on auto, gets no prediction."""
    args, precision = result["args"], result["precision"]
    own = Profile.from_dict(result["profile"]) if result.get("profile") else None
    profiles = (profiles or {}) | ({own.batch_size: own} if own else {})
    table = point_table(result, args["prompts"], pair=args["pair"],
                        precision=f"target {precision['target']}, draft {precision['draft']}",
                        machine=capability_line(result["environment"]["capability"]))
    prices = pd.DataFrame([{"method": s["method"], **_prices(s, result["summary"], profiles, args)}
                           for s in result["summary"]], columns=["method", *PRICE_COLUMNS])
    timed = pd.DataFrame([{"batch_size": b, "profile_measured_at": p.measured_at, "profile_step_ms": p.target_at(1),
                           "profile_verify_ms": p.target_at(args["k"] + 1)} for b, p in profiles.items()],
                         columns=["batch_size", *PROFILE_COLUMNS])
    table = table.drop(columns=PRICE_COLUMNS).merge(prices, on="method", how="left")
    return table.merge(timed, on="batch_size", how="left")


def _prices(s: dict, summary: list[dict], profiles: dict[int, Profile], args: dict) -> dict:
    """One summary row's prediction at its b, as the bench prices it since 0cd5d6f (``ssd.bench.summaries``): SSD's
    Theorem 7 on the profile's latencies and the run's own rates; SD's E / (c K + v) over batched AR's measured
    decode rate at the same b (the profile's one-core ratios carry over to SD's two cores, its rates do not)."""
    name, overrides = parse_variant(s["method"])
    k, budget, backup = (overrides.get(f, args[f]) for f in ("k", "budget", "backup"))
    profile = profiles.get(s["batch_size"])
    if profile is None or not s.get("decode_tokens_per_s"):
        return {}
    if name in ("ssd", "ssd-pipeline") and s.get("p_hit") is not None and not any(map(is_auto, (k, budget, backup))):
        price = theorem7_from_profile(profile, k, budget, s["p_hit"], s["e_hit"], s["e_miss"], backup, s["all_hit"])
    elif name == "sd" and s.get("mean_accepted") and not is_auto(k):
        ar = [r for r in summary if parse_variant(r["method"])[0] == "ar" and r["batch_size"] == s["batch_size"]]
        if not ar or not ar[0].get("decode_tokens_per_s"):
            return {}
        price = sd_from_profile(profile, k, s["mean_accepted"] + 1)
        price["profile_tokens_per_s"] = ar[0]["decode_tokens_per_s"] * price["profile_speedup_vs_ar"]
    else:
        return {}
    price["decode_over_profile_prediction"] = s["decode_tokens_per_s"] / price["profile_tokens_per_s"]
    return {c: price.get(c.removeprefix("run_")) for c in PRICE_COLUMNS}


def batch_profiles(folder: str, like: Profile) -> dict[int, Profile]:
    """The profiles among a folder's JSON files (data/<machine>/profiles) that time what `like` times (the pair at
    its precisions, the kind of machine, the cores and the context) at any batch size, by their batch size."""
    return {p.batch_size: p for p in profiles_in(folder) if _timing(p) == _timing(like)}


def _timing(profile: Profile) -> tuple:
    """What decides a profile's numbers, its batch size aside."""
    return (profile.pair, profile.precisions.get("target"), profile.precisions.get("draft"), profile.forward,
            kind_of({"device": "cpu", "capability": profile.capability}), list(profile.verifier_cores),
            list(profile.drafter_cores), profile.context)


def study_files(root: str, machine: str) -> list[str]:
    """The files of a machine's stored study under `root`: its sweep table where it keeps one, else its bench of
    each prompt set (both, or none)."""
    folder = os.path.join(root, machine)
    if os.path.isfile(os.path.join(folder, SWEEP_TABLE)):
        return [os.path.join(folder, SWEEP_TABLE)]
    benches = [os.path.join(folder, name) for name in STUDY_BENCHES]
    return benches if all(os.path.isfile(p) for p in benches) else []


def study_machine(root: str, kind: dict, machine: str = "nearest") -> str:
    """The machine whose stored study to show: `machine`, a folder under `root` that keeps one, or with 'nearest' the
    one nearest `kind` (``ssd.bench.machines.chosen``) among those that do."""
    keeping = [m for m in machines.stored_machines(root) if study_files(root, m)]
    return machines.chosen(root, kind, machine, keeping,
                           f"a batch-size study ({SWEEP_TABLE}, or {' and '.join(STUDY_BENCHES)})")


def stored_study(root: str, machine: str) -> pd.DataFrame:
    """A machine's stored study in the sweep table's columns: its sweep table as kept, or its benches through
    ``bench_table``, each b priced with the profile kept for it (data/<machine>/profiles)."""
    files = study_files(root, machine)
    if not files:
        raise ValueError(f"machine {machine!r}: {os.path.join(root, machine)} keeps no batch-size study "
                         f"({SWEEP_TABLE}, or {' and '.join(STUDY_BENCHES)})")
    if files[0].endswith(".csv"):
        return pd.read_csv(files[0])
    tables = []
    for path in files:
        with open(path) as f:
            result = json.load(f)
        kept = result.get("profile")
        profiles = batch_profiles(os.path.join(root, machine, "profiles"), Profile.from_dict(kept)) if kept else {}
        tables.append(bench_table(result, profiles))
    return pd.concat(tables, ignore_index=True)


def precisions(table: pd.DataFrame) -> tuple[str, str]:
    """The target's and the draft's precision of a study (its precision column, 'target bfloat16, draft int8'), for
    a figure's setting line; a study at several precisions has no one line."""
    labels = sorted(table["precision"].astype(str).unique())
    found = re.fullmatch(r"target (\S+), draft (\S+)", labels[0]) if len(labels) == 1 else None
    if found is None:
        raise ValueError(f"the study's precision column must hold one 'target X, draft Y'; it holds {labels}")
    return found[1], found[2]


def call_rounds(rows: pd.DataFrame, spans: list[dict] | None) -> pd.DataFrame:
    """Per (method, call): its rounds (the most any of its rows ran: the call lasts until its last row is done), the
    live share (its rows' rounds over answers x rounds: below 1 where rows finished early and later rounds ran with
    fewer, which a prediction for a full batch of b does not price) and, from the call's spans (the batch's, the same
    on each of its rows: its first row's are read), the seconds of its verify steps and of its waits for drafts
    (the pipeline's verifier; 0 for a method that never waits), and prompts_in_verify: whether the verify time
    holds the prompts' pass (its first round fed them, as every method's does since 99b94aa; before it the pipeline's
    verifier made a pass of its own for them, a "prefill_s" span)."""
    by_call = rows.groupby(["method", "call"], sort=False)
    out = by_call.agg(rounds=("rounds", "max"), row_rounds=("rounds", "sum"), answers=("rounds", "size"),
                      first=("prompt_id", "first")).reset_index()
    out["live_share"] = out["row_rounds"] / (out["answers"] * out["rounds"])
    out = out.drop(columns=["row_rounds", "answers"])
    frame = pd.DataFrame(spans or [])
    if "call" in frame:
        frame = frame.merge(out[["method", "call", "first"]], on=["method", "call"])
        frame = frame[frame["prompt_id"] == frame["first"]]
    out = out.drop(columns="first")
    if "call" not in frame or frame.empty:  # a bench from before its spans named their call, or none kept
        return out.assign(verify_s=float("nan"), wait_s=float("nan"), prompts_in_verify=None)
    seconds = (frame["end_s"] - frame["start_s"]).groupby([frame["method"], frame["call"], frame["phase"]]).sum()
    phases = seconds.unstack("phase").reindex(columns=["verify_s", "wait_s"])
    apart = frame["phase"].eq("prefill_s").groupby([frame["method"], frame["call"]]).any()
    phases["prompts_in_verify"] = ~apart
    out = out.merge(phases.reset_index(), on=["method", "call"], how="left")
    out.loc[out["verify_s"].notna(), "wait_s"] = out["wait_s"].fillna(0.0)  # timed passes, never a wait: 0
    return out


def by_batch_size(table: pd.DataFrame) -> pd.DataFrame:
    """Per (prompts, label, batch_size): total tokens/s (all calls' tokens over their time: the run's figure) with a
    95% t-interval over calls of the call's tokens/s (none from fewer than MIN_CI_N calls), per-sequence tokens/s,
    decode tokens/s beside its prediction from the profile, and the rates behind it."""
    keys = ["prompts", "label", "batch_size"]
    ci = mean_ci(table, keys, "tokens_per_s").rename(columns={"mean": "call_mean", "n": "calls"})
    first = table.groupby(keys, sort=False).first().reset_index()
    out = first[keys].assign(
        tokens_per_s=first["run_tokens_per_s"], sequence_tokens_per_s=first["run_sequence_tokens_per_s"],
        decode_tokens_per_s=first["run_decode_tokens_per_s"], predicted=first["run_profile_tokens_per_s"],
        measured_over_predicted=first["run_decode_over_profile_prediction"], p_hit=first["run_p_hit"],
        all_hit=first["run_all_hit"], p_hit_to_b=first["run_p_hit"] ** first["batch_size"],
        fast_share=first["run_fast_backup_share"], e_hit=first["run_e_hit"], e_miss=first["run_e_miss"],
        t_p=first["run_profile_t_p"], t_b=first["run_profile_t_b"], identical=first["run_identical_to_target"])
    return out.merge(ci[[*keys, "ci_low", "ci_high", "calls"]], on=keys)


def tokens_table(summary: pd.DataFrame, value: str = "tokens_per_s") -> pd.DataFrame:
    """One prompt set's `value` (from ``by_batch_size``) as rows of methods and a column per b, in the order the
    methods were benched."""
    labels = list(pd.unique(summary["label"]))
    return summary.pivot(index="label", columns="batch_size", values=value).reindex(labels)


def first_b(summary: pd.DataFrame, a: str, b: str, value: str) -> int | None:
    """The smallest batch size at which method `a`'s `value` reaches method `b`'s (None: at none measured)."""
    wide = summary.pivot(index="batch_size", columns="label", values=value).sort_index()
    if a not in wide or b not in wide:
        raise ValueError(f"the summary needs methods {a!r} and {b!r}; it has {sorted(wide.columns)}")
    reached = wide.index[(wide[a] >= wide[b]).to_numpy()]
    return int(reached[0]) if len(reached) else None


def crossover(summary: pd.DataFrame, jit: str = "ssd-pipeline:jit", fast: str = "ssd-pipeline:fast") -> dict:
    """b*, the first batch size at which the fast backup's decode tokens/s reach the jit backup's: measured, and
    predicted by Theorem 7 on each b's profile and each backup's own rates (``predicted``). None: not within the
    batch sizes measured."""
    return {"measured": first_b(summary, fast, jit, "decode_tokens_per_s"),
            "predicted": first_b(summary, fast, jit, "predicted")}


def break_even(summary: pd.DataFrame, method: str = "sd", baseline: str = "ar") -> dict:
    """The first batch size at which `method` is no faster than batched `baseline` (None: faster at every b
    measured), in total and in decode tokens/s."""
    return {value: first_b(summary, baseline, method, value) for value in ("tokens_per_s", "decode_tokens_per_s")}


def theorem17(summary: pd.DataFrame, jit: str = "ssd-pipeline:jit", fast: str = "ssd-pipeline:fast") -> int | None:
    """b* as ``theory.critical_batch_size`` gives it from b = 1 alone (the paper's Theorem 17 in this kit's form):
    the jit run's hit rate, tokens after a hit and after a miss and its profile's T_p and T_b, the fast run's tokens
    after a miss, all held at their b = 1 values while only p_hit^b moves. None: the jit backup stays ahead."""
    one = summary[summary["batch_size"] == 1].set_index("label")
    if jit not in one.index or fast not in one.index:
        raise ValueError(f"theorem17 needs {jit!r} and {fast!r} at b = 1; it has {sorted(one.index)}")
    j = one.loc[jit]
    return critical_batch_size(j["p_hit"], j["e_hit"], j["e_miss"], one.loc[fast, "e_miss"], j["t_p"], j["t_b"])


def auto_over_fixed(summary: pd.DataFrame, auto: str = "ssd-pipeline:auto",
                    fixed: tuple[str, ...] = ("ssd-pipeline:jit", "ssd-pipeline:fast")) -> pd.DataFrame:
    """Per prompt set and b: the auto backup's decode tokens/s over the better fixed backup's, and over jit's; with
    the share of misses auto gave the fast backup. None of them for a table without all three (a sweep may run a
    subset of the backups): no rows."""
    columns = ["better fixed", "auto_over_better", "auto_over_jit", "fast share of misses"]
    if not {auto, *fixed} <= set(summary["label"]):
        return pd.DataFrame(columns=columns, index=pd.MultiIndex.from_tuples([], names=["prompts", "batch_size"]))
    wide = summary.pivot_table(index=["prompts", "batch_size"], columns="label", values="decode_tokens_per_s",
                               sort=False)
    shares = summary[summary["label"] == auto].set_index(["prompts", "batch_size"])["fast_share"]
    best = wide[list(fixed)].max(axis=1)
    return pd.DataFrame({"better fixed": wide[list(fixed)].idxmax(axis=1), "auto_over_better": wide[auto] / best,
                         "auto_over_jit": wide[auto] / wide[fixed[0]], "fast share of misses": shares})


def forward_times(table: pd.DataFrame) -> pd.DataFrame:
    """Per (prompts, label, batch_size): the mean ms of the target's forwards after each call's first (its prompts'
    pass): AR's one-token steps, SD's verify passes, the pipeline verifier's; beside the profile's one-token step and
    verify pass over K + 1 tokens at that b. Where a prediction departs from the measurement, this says how much of
    it the pass itself explains (the profile times one core per model; ar, hf-ar and sd run on both)."""
    keys = ["prompts", "label", "batch_size"]
    g = table.groupby(keys, sort=False)
    sums = g[["target_forward_s", "first_target_forward_s", "target_forwards"]].sum()
    ms = (sums["target_forward_s"] - sums["first_target_forward_s"]) / (sums["target_forwards"] - g.size()) * 1000
    first = g[["profile_step_ms", "profile_verify_ms"]].first()
    out = first.assign(forward_ms=ms, over_profile_verify=ms / first["profile_verify_ms"],
                       profile_v=first["profile_verify_ms"] / first["profile_step_ms"]).reset_index()
    # v as run: a forward over AR's one-token step at the same b and on the same prompts (SD's v on its two cores)
    step = out[out["label"] == "ar"].set_index(["prompts", "batch_size"])["forward_ms"]
    return out.assign(over_ar_step=out["forward_ms"] / step.reindex(
        pd.MultiIndex.from_frame(out[["prompts", "batch_size"]])).to_numpy())


def round_account(table: pd.DataFrame) -> pd.DataFrame:
    """Per (prompts, label, batch_size) of the pipeline, the mean round of its calls in ms as the verifier spent it,
    beside the round its prediction prices.

    Measured (each call's time after its first target forward, the prompts' pass, over its rounds; that pass left
    out of the verify steps where round 0 fed the prompts): the target's forward, the rest of the verify step (the
    host's check: accept/reject, the caches), the wait for the next drafts, and the rest (between rounds, and before
    the first: the drafter's own prompt pass and first drafts). Predicted:
    the profile's verify pass at b times max(1, T_p) + (1 - all_hit) T_b (``theory.pipelined_speedup``), of which
    the wait is all but one pass. With the live share (``call_rounds``) this accounts for measured over predicted
    (kept beside it): ``accounted`` = live_share x predicted round / measured round, since a prediction for a full
    batch of b also assumes every row lives every round; the two agree where the run's tokens per round are what
    the prediction was fed. Only calls whose rounds were timed (a table from before the round columns has none)."""
    keys = ["prompts", "label", "batch_size"]
    missing = [c for c in ROUND_COLUMNS if c not in table]
    timed = table.reindex(columns=[*table.columns, *missing]).dropna(subset=["verify_s"])
    timed = timed[timed["label"].str.startswith("ssd-pipeline")]
    # After the prompts' pass: where round 0's verify step fed the prompts, that pass leaves its verify time too (a
    # table from before prompts_in_verify holds pipeline calls whose verifier passed the prompts apart)
    fused = timed["prompts_in_verify"].astype("boolean").fillna(False).astype(bool)
    timed = timed.assign(decode_s=timed["wall_s"] - timed["first_target_forward_s"],
                         forwards_s=timed["target_forward_s"] - timed["first_target_forward_s"],
                         verify_s=timed["verify_s"] - timed["first_target_forward_s"].where(fused, 0.0),
                         row_rounds=timed["live_share"] * timed["answers"] * timed["rounds"],
                         all_rounds=timed["answers"] * timed["rounds"])
    g = timed.groupby(keys, sort=False)
    sums = g[["decode_s", "forwards_s", "verify_s", "wait_s", "rounds", "row_rounds", "all_rounds"]].sum()
    per_round = sums[["decode_s", "forwards_s", "verify_s", "wait_s"]].div(sums["rounds"], axis=0) * 1000
    out = pd.DataFrame({"live_share": sums["row_rounds"] / sums["all_rounds"], "round_ms": per_round["decode_s"],
                        "forward_ms": per_round["forwards_s"], "wait_ms": per_round["wait_s"],
                        "check_ms": per_round["verify_s"] - per_round["forwards_s"]})
    out["between_ms"] = out["round_ms"] - out[["forward_ms", "check_ms", "wait_ms"]].sum(axis=1)
    out = out[["live_share", "round_ms", "forward_ms", "check_ms", "wait_ms", "between_ms"]]
    run = g[["profile_verify_ms", "run_profile_t_p", "run_profile_t_b", "run_all_hit",
             "run_decode_over_profile_prediction"]].first()
    waits = (run["run_profile_t_p"].clip(lower=1) - 1 + (1 - run["run_all_hit"]) * run["run_profile_t_b"])
    out["predicted_round_ms"] = run["profile_verify_ms"] * (1 + waits)
    out["predicted_pass_ms"] = run["profile_verify_ms"]
    out["predicted_wait_ms"] = run["profile_verify_ms"] * waits
    out["measured_over_predicted"] = run["run_decode_over_profile_prediction"]
    out["accounted"] = out["live_share"] * out["predicted_round_ms"] / out["round_ms"]
    return out.reset_index()
