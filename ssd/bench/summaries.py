"""A bench's summaries: per method (tokens/s, speed-ups over AR and over the transformers peer, acceptance, hit rates,
the profile's prediction beside the measurement, greedy identity), per Spec-Bench category, ours against the peers,
where each method's time went; and their printed tables."""
from __future__ import annotations


import numpy as np
import pandas as pd

from .stats import MIN_CI_N, geometric_mean_ci, mean_ci, speedups
from ..checks import is_auto, parse_variant
from ..names import ENGINE_AR
from .methods import resolve
from ..core.theory import sd_from_profile, theorem7_from_profile, theorem7_speedup
from .frames import counted_lookups
from ..core.tuning import on_auto


# Each of ours next to the transformers peer that does the same job.
PEERS = {"ar": "hf-ar", "sd": "hf-sd"}
# The methods a bench runs next to each other, as a block (run.answer_order): ours and its peer, llama.cpp's two.
PARTNERS = {**PEERS, "llamacpp-sd": "llamacpp-ar"}
# The ratios against_peers also reports: llama.cpp's SD over its own AR (the bar of a speculative method on that
# engine), and llama.cpp's AR over ours (how far apart the two engines' kernels are).
COMPARED = {**{ours: [peer] for ours, peer in PEERS.items()}, "llamacpp-sd": ["llamacpp-ar"], "llamacpp-ar": ["ar"]}

# The per-category report's figures and their headers in the printed table: rates as means over answers, the
# speed-ups (RATIO_VALUES) as geometric means of per-answer ratios, decode first (the paper's measure).
CATEGORY_VALUES = {"tokens_per_s": "tokens/s", "decode_speedup_vs_ar": "speed-up vs ar, decode",
                   "speedup_vs_ar": "speed-up vs ar, whole call", "tokens_per_round": "tokens/round"}
RATIO_VALUES = ("decode_speedup_vs_ar", "speedup_vs_ar")


def measured_theorem7(rounds: pd.DataFrame, ar_step_s: float | None = None) -> dict:
    """Theorem 7 with every input measured on SSD rounds (one frame, or several runs concatenated).

    E_hit / E_miss are the tokens of rounds whose draft came from a hit / a backup; T_p and T_b the mean
    pre-speculation and backup times over the mean verify time of rounds after the first (whose pass also processes
    the prompt). The theorem counts time in verify passes, which on a GPU cost about one autoregressive step; on a
    CPU a pass over K + 1 tokens costs more, so the speedup over AR is rescaled by ar_step_s / verify_s. Rounds of a
    batch (one row per round and sequence, each sequence's rounds together) carry ``all_hit``, whether every sequence
    hit that round: its mean is the all-hit rate the denominator needs (the hit rate where the column is missing, as
    in frames stored before batches). Both rates leave out each answer's last round, whose lookup decides nothing
    (``ssd.bench.frames.final_rounds``).
    """
    previous_hit = rounds.groupby(rounds["round"].eq(0).cumsum())["hit"].shift(1, fill_value=False).astype(bool)
    # A run's first verify pass also processes the whole prompt: leave it out of the cost of one verify pass.
    decode = rounds[rounds["round"] > 0] if (rounds["round"] > 0).any() else rounds
    verify_s = decode["verify_s"].mean()
    backups = rounds.loc[rounds["backup"].notna(), "draft_s"]
    looked_up = counted_lookups(rounds)
    out = {
        "p_hit": float(looked_up["hit"].astype(bool).mean()),
        "e_hit": float(rounds.loc[previous_hit, "new_tokens"].mean()) if previous_hit.any() else 0.0,
        "e_miss": float(rounds.loc[~previous_hit, "new_tokens"].mean()),
        "t_p": float(rounds["prespec_s"].mean() / verify_s),
        "t_b": float(backups.mean() / verify_s) if len(backups) else 0.0,
        "verify_s": float(verify_s),
    }
    known = looked_up["all_hit"].dropna() if "all_hit" in rounds else ()
    out["all_hit"] = float(known.astype(bool).mean()) if len(known) else out["p_hit"]
    out["tokens_per_verify"] = theorem7_speedup(out["p_hit"], out["e_hit"], out["e_miss"], out["t_p"], out["t_b"],
                                                out["all_hit"])
    out["predicted_speedup_vs_ar"] = out["tokens_per_verify"] * ar_step_s / verify_s if ar_step_s else None
    return out


def summarize(rows: pd.DataFrame, rounds: pd.DataFrame | None = None, profile=None, config=None) -> list[dict]:
    """tokens/s = total new tokens / total wall time (long prompts weigh by their length, as a user's clock does);
    decode tokens/s leaves out the prompts' passes (the paper's measure). Every speed-up is a geometric mean of
    per-answer ratios with its 95% interval (``ratios``), not a ratio of these totals. With a profile (or {b:
    profile}) and the run's config, the SSD methods at a b it was timed at get Theorem 7 fed by its latencies beside
    the one fed by their own rounds, and SD its predicted speed-up over AR at that b."""
    summary = []
    for method, g in rows.groupby("method", sort=False):
        drafted = g["drafted"].sum()
        budgeted = g.dropna(subset=["mean_budget"]) if "mean_budget" in g else g.iloc[:0]
        summary.append(
            {
                "method": method,
                "prompts": len(g),
                "new_tokens": int(g["new_tokens"].sum()),
                "batch_size": int(_batch_sizes(g).max()),
                "wall_s": float(_machine_s(g).sum()),
                "tokens_per_s": float(g["new_tokens"].sum() / _machine_s(g).sum()),
                # the sequences' own rate: each answer's tokens over what it waited (per-sequence latency)
                "sequence_tokens_per_s": float(g["new_tokens"].sum() / g["wall_s"].sum()),
                "decode_tokens_per_s": _decode_rate(g),
                "all_hit_rate": _mean_of(g, "all_hit_rate"),
                "acceptance_rate": float(g["accepted"].sum() / drafted) if drafted else None,
                "mean_accepted": float(g["accepted"].sum() / g.loc[g["drafted"] > 0, "rounds"].sum()) if drafted else None,
                "mean_k": float(drafted / g["drafting_rounds"].sum()) if drafted and "drafting_rounds" in g else None,
                "mean_budget": (float((budgeted["mean_budget"] * budgeted["rounds"]).sum() / budgeted["rounds"].sum())
                                if len(budgeted) else None),
                "identical_to_target": bool(g["identical_to_target"].all()) if g["identical_to_target"].notna().all() else None,
                **_differences(g),
            }
        )
    rates = answer_rates(rows)  # once: every method's ratios pair its answers with another's
    for s in summary:
        s.update(_ratios(rates, s["method"]))
    tps = {s["method"]: s["tokens_per_s"] for s in summary}
    for name in tps:
        if rounds is None or not is_ssd(name):
            continue
        # Theorem 7 from what the method's rounds measured: for ssd, what drafting and verifying on two devices would
        # give; for ssd-pipeline, the prediction to hold against its measured speedup_vs_ar.
        ar_step_s = 1 / tps["ar"] if "ar" in tps else None
        ssd = next(s for s in summary if s["method"] == name)
        measured = measured_theorem7(rounds[rounds.method == name], ar_step_s)
        ssd["hit_rate"] = measured["p_hit"]  # over the counted lookups (trace.final_rounds), as each row's
        backed = rounds.loc[(rounds.method == name) & rounds["backup"].notna(), "backup"]
        ssd["fast_backup_share"] = float((backed == "fast").mean()) if len(backed) else None  # of the misses
        ssd.update(measured)
        fixed = resolve(name, config).config if config is not None else None
        priced = _pricing(profile, fixed, ssd["batch_size"]) if fixed is not None else None
        if priced is not None:
            ssd.update(theorem7_from_profile(priced, fixed.k, fixed.budget, ssd["p_hit"], ssd["e_hit"],
                                             ssd["e_miss"], fixed.backup, ssd["all_hit"]))
            if ssd["decode_tokens_per_s"]:
                ssd["decode_over_profile_prediction"] = ssd["decode_tokens_per_s"] / ssd["profile_tokens_per_s"]
    if profile is not None and config is not None:
        for s in summary:
            _add_sd_prediction(s, summary, profile, config)
    return summary


def ratios(rows: pd.DataFrame, method: str) -> dict:
    """The method's speed-ups, in the kit's one convention (``stats.geometric_mean_ci``): over AR (decode tokens/s,
    the paper's measure, and the whole call), over its transformers peer (whole call: transformers times no prompt
    pass apart) and, for another engine's methods, over that engine's AR. Each is the geometric mean over the answers
    both methods gave of the per-answer ratio, with its 95% interval in FIELD_ci (None from fewer than MIN_CI_N
    answers); None where the other method did not run or no answer pairs. AR over itself is 1, no interval."""
    return _ratios(answer_rates(rows), method)


def _ratios(rates: pd.DataFrame, method: str) -> dict:
    """``ratios`` from each answer's rates (``answer_rates``)."""
    out = {}
    over = {"speedup_vs_ar": ("ar", "tokens_per_s"), "decode_speedup_vs_ar": ("ar", "decode_tokens_per_s"),
            "speedup_vs_peer": (PEERS.get(method), "tokens_per_s")}
    own_ar = ENGINE_AR.get(method)  # another engine's methods, over that engine's AR
    if own_ar is not None and own_ar != method and own_ar in set(rates["method"]):
        over |= {"speedup_vs_engine_ar": (own_ar, "tokens_per_s"),
                 "decode_speedup_vs_engine_ar": (own_ar, "decode_tokens_per_s")}
    for field, (baseline, value) in over.items():
        ci = _paired_ratio(rates, method, baseline, value)
        out[field], out[f"{field}_ci"] = (None, None) if ci is None else (ci["mean"], _interval(ci))
    return out


def resummarised(result: dict) -> dict:
    """A stored bench (its JSON as a dict) with every speed-up in the one convention, from its rows, which stay as
    they are: each method's ``ratios`` in its summary, the per-category report and the peers. The summary's other
    figures (rates, acceptance, Theorem 7 from rounds a file does not keep) stay as stored."""
    rows = pd.DataFrame(result["rows"])
    rates = answer_rates(rows)
    summary = [{**s, **_ratios(rates, s["method"])} for s in result["summary"]]
    return {**result, "summary": summary, "categories": by_category(rows), "peers": against_peers(rows)}


def answer_rates(rows: pd.DataFrame) -> pd.DataFrame:
    """Each answer's whole-call and decode tokens/s, the machine's (a batch's call time over its b rows, as
    ``summarize``'s totals): the row's own where it has them (decode over the method's own clock after its prompt's
    pass), else from its tokens and times. Decode is NaN where the answer did not time its prompt's pass, or had no
    token after it (a short answer whose first round gave it all: no decode to measure, not a rate of zero). Answers
    pair by prompt_id, or where rows carry none (a method called by hand) by their order within each method."""
    b = _batch_sizes(rows)
    answer = rows["prompt_id"] if "prompt_id" in rows else rows.groupby("method").cumcount().astype(str)
    whole = rows["tokens_per_s"] if "tokens_per_s" in rows else rows["new_tokens"] / (rows["wall_s"] / b)
    if "decode_tokens_per_s" in rows:
        decode = rows["decode_tokens_per_s"]
    elif "prefill_s" in rows:
        prefill_tokens = rows["prefill_tokens"].fillna(0) if "prefill_tokens" in rows else 0
        decode = (rows["new_tokens"] - prefill_tokens) / ((rows["wall_s"] - rows["prefill_s"].astype(float)) / b)
    else:
        decode = pd.Series(float("nan"), index=rows.index)
    return pd.DataFrame({"prompt_id": answer, "method": rows["method"], "tokens_per_s": whole.astype(float),
                         "decode_tokens_per_s": decode.astype(float).where(lambda rate: rate > 0)})


def paired_ratio(rows: pd.DataFrame, method: str, baseline: str, value: str = "decode_tokens_per_s") -> dict | None:
    """A bench's rows: one method over another (any two, another engine's AR included) answer by answer, the kit's
    one convention (``stats.geometric_mean_ci``: mean, ci_low, ci_high, n); None where nothing pairs."""
    return _paired_ratio(answer_rates(rows), method, baseline, value)


def _paired_ratio(rates: pd.DataFrame, method: str, baseline: str | None, value: str) -> dict | None:
    """``stats.geometric_mean_ci`` of method's value over baseline's on the same answers (AR over itself: 1 over its
    answers, no interval); None where nothing pairs."""
    both = rates[rates["method"].isin([method, baseline])].dropna(subset=[value])
    if baseline is None or baseline not in set(both["method"]):
        return None
    if method == baseline:
        return {"mean": 1.0, "ci_low": float("nan"), "ci_high": float("nan"), "n": int(len(both))}
    paired = speedups(both, baseline, value=value)["speedup"]
    return geometric_mean_ci(paired) if len(paired) else None


def _interval(ci: dict) -> list[float] | None:
    return None if np.isnan(ci["ci_low"]) else [ci["ci_low"], ci["ci_high"]]


def _add_sd_prediction(s: dict, summary: list[dict], profile, config) -> None:
    """SD's speed-up over AR predicted from the profile (``theory.sd_from_profile``) with the tokens its rounds
    yielded, and the decode rate it predicts: the measured decode rate of AR at the same batch size times that
    speed-up (the profile's one-core rates do not carry over to SD's two cores; its ratios do, roughly, as far as the
    draft's step gains from the second core what the target's does: docs/findings.md, the batch-size study).
    Only K prices SD's rounds: a backup on auto, which SD has not, leaves its prediction in place."""
    if parse_variant(s["method"])[0] != "sd" or s["mean_accepted"] is None or not s["decode_tokens_per_s"]:
        return
    fixed = resolve(s["method"], config).config
    ar = [r for r in summary if parse_variant(r["method"])[0] == "ar" and r["batch_size"] == s["batch_size"]]
    priced = None if is_auto(fixed.k) else _profile_at(profile, s["batch_size"])  # SD's rounds: what K makes them
    if not ar or not ar[0]["decode_tokens_per_s"] or priced is None:
        return
    s.update(sd_from_profile(priced, fixed.k, s["mean_accepted"] + 1))
    s["profile_tokens_per_s"] = ar[0]["decode_tokens_per_s"] * s["profile_speedup_vs_ar"]
    s["decode_over_profile_prediction"] = s["decode_tokens_per_s"] / s["profile_tokens_per_s"]


def by_category(rows: pd.DataFrame) -> list[dict]:
    """Spec-Bench's report: for each category (in the rows' order), then "overall", and each method, the number of
    answers; the means over answers of tokens/s and of tokens per round (tokens per target forward, Spec-Bench's
    "mean accepted tokens"); and the speed-up over AR's answer to the same prompt and turn (only with ar among the
    methods), of decode and of whole-call tokens/s, each the geometric mean of the per-answer ratios, the kit's one
    convention (``stats.geometric_mean_ci``). Each figure has its 95% Student-t CI (`VALUE_ci`, [low, high]; of the
    mean log for a speed-up) from MIN_CI_N answers on.

    Spec-Bench's own speed.py divides the mean tokens/s by AR's (a ratio of means, a question's turns pooled) and
    pools its accepted tokens over all rounds; figures over answers are what a CI over answers is about.
    """
    rows = _with_speedups(rows)
    both = pd.concat([rows, rows.assign(category="overall")], ignore_index=True)
    keys = ["category", "method"]
    index = pd.MultiIndex.from_product([pd.unique(both["category"]), pd.unique(both["method"])], names=keys)
    table = both.groupby(keys).size().rename("answers").reindex(index).to_frame()
    for value in CATEGORY_VALUES:
        sample = both[[*keys, value]].astype({value: float}).dropna()
        if sample.empty:  # no ar among the methods, or only peers (no rounds, or no decode time)
            table[value], table[f"{value}_ci"] = None, None
            continue
        ratio = value in RATIO_VALUES
        if ratio:  # ratios multiply: their mean and interval are taken of the logs
            sample[value] = np.log(sample[value])
        ci = mean_ci(sample, keys, value).set_index(keys).reindex(index)
        if ratio:
            ci[["mean", "ci_low", "ci_high"]] = np.exp(ci[["mean", "ci_low", "ci_high"]])
        table[value] = ci["mean"]
        # mean_ci gives no interval from fewer than MIN_CI_N answers (NaN).
        table[f"{value}_ci"] = [None if pd.isna(lo) else [float(lo), float(hi)]
                                for lo, hi in zip(ci["ci_low"], ci["ci_high"])]
    # AR's own speed-up is 1 by definition, not a measurement: no interval.
    for value in RATIO_VALUES:
        table.loc[table.index.get_level_values("method") == "ar", f"{value}_ci"] = None
    records = table.reset_index().to_dict("records")
    return [{k: None if isinstance(v, float) and pd.isna(v) else v for k, v in r.items()} for r in records]


def against_peers(rows: pd.DataFrame) -> list[dict]:
    """Each of ours over its transformers peer (PEERS), and llama.cpp's SD over its AR and its AR over ours
    (COMPARED), on the same answers, whole call and decode-only: the geometric mean over answers of the ratio, with
    the 95% Student-t interval of the mean log ratio, exponentiated (none from fewer than MIN_CI_N answers). One
    record per (method, measure) whose peer ran."""
    out, rates = [], answer_rates(rows)
    for method, peer in [(m, p) for m, peers in COMPARED.items() for p in peers]:
        for value in ("tokens_per_s", "decode_tokens_per_s"):
            ci = _paired_ratio(rates, method, peer, value) if method in set(rows["method"]) else None
            if ci is not None:
                out.append({"method": method, "peer": peer, "measure": value, "answers": ci["n"],
                            "geometric_mean": ci["mean"], "ci": _interval(ci)})
    return out


def peers_table(records: list[dict]) -> str:
    if not records:
        return ""
    lines = [f"  {r['method']} / {r['peer']}, {r['measure']}: {_mean_and_ci(r['geometric_mean'], r['ci'], 3)} "
             f"({r['answers']} answers)" for r in records]
    return "against the peers: geometric mean over answers [95% CI]\n" + "\n".join(lines)


BREAKDOWN = {"wall_s": "wall", "prefill_s": "to first tokens", "first_target_forward_s": "prompt pass",
             "target_forward_s": "target forwards", "draft_forward_s": "draft forwards",
             "outside_forwards_s": "outside forwards"}


def time_breakdown(rows: pd.DataFrame) -> pd.DataFrame:
    """Where each method's time went, per answer (a batch's call time over its b rows): the whole call, the time to
    the first tokens (prefill_s: the prompt's pass, fused or apart), the target's first forward (the prompt's pass,
    or with it the first verification where fused), every target and draft forward, and the rest; with the forward
    counts, and the time outside the forwards per target forward (host work per round)."""
    out = []
    for method, g in rows.groupby("method", sort=False):
        b = _batch_sizes(g)
        row = {"method": method, "answers": len(g)}
        for column, name in BREAKDOWN.items():
            row[f"{name} s"] = float((g[column] / b).mean()) if column in g and g[column].notna().all() else None
        for model in ("target", "draft"):
            row[f"{model} forwards"] = float((g[f"{model}_forwards"] / b).mean()) if f"{model}_forwards" in g else None
        per_forward = g["outside_forwards_s"] / g["target_forwards"] if "target_forwards" in g else None
        row["outside ms per target forward"] = float(per_forward.mean() * 1000) if per_forward is not None else None
        out.append(row)
    return pd.DataFrame(out)


def _with_speedups(rows: pd.DataFrame) -> pd.DataFrame:
    """Each row's whole-call and decode tokens/s over AR's on the same prompt and turn (1 for AR itself); NaN without
    ar, or (decode) where an answer did not time its prompt's pass."""
    if "ar" not in set(rows["method"]):
        return rows.assign(speedup_vs_ar=float("nan"), decode_speedup_vs_ar=float("nan"))
    rates, out = answer_rates(rows), rows
    for field, value in (("speedup_vs_ar", "tokens_per_s"), ("decode_speedup_vs_ar", "decode_tokens_per_s")):
        timed = rates.dropna(subset=[value])
        paired = (speedups(timed, "ar", value=value) if "ar" in set(timed["method"])
                  else pd.DataFrame(columns=["prompt_id", "method", "speedup"]))
        out = out.merge(paired.rename(columns={"speedup": field}), on=["prompt_id", "method"], how="left")
        out.loc[out["method"] == "ar", field] = 1.0 if "ar" in set(timed["method"]) else float("nan")
    return out


def is_ssd(method: str) -> bool:
    """An SSD method or a variant of one: its rounds feed Theorem 7."""
    return parse_variant(method)[0] in ("ssd", "ssd-pipeline")


def _profile_at(profile, batch_size: int):
    """The profile timed at this batch size (its passes cost what a round of b rows costs; a b = 1 profile would
    price a batched round as one sequence's), or None. profile: one profile, or several by the batch size they were
    timed at ({b: profile})."""
    if isinstance(profile, dict):
        return profile.get(batch_size)
    return profile if profile is not None and profile.batch_size == batch_size else None


def _pricing(profile, config, batch_size: int):
    """The profile that prices this SSD config's rounds over batch_size rows, or None: K, B and the backup fixed (on
    auto they change from round to round, and a mix of backups' rounds has no one price), timed at that batch size."""
    return None if on_auto(config) else _profile_at(profile, batch_size)


def profile_prediction(profile, config, batch_size: int, rounds: pd.DataFrame) -> float | None:
    """Theorem 7's steady-state tokens/s with the profile's latencies and these rounds' hit rates and tokens (None
    where no profile prices these rounds: ``_pricing``)."""
    priced = _pricing(profile, config, batch_size)
    if priced is None:
        return None
    own = measured_theorem7(rounds)
    return theorem7_from_profile(priced, config.k, config.budget, own["p_hit"], own["e_hit"], own["e_miss"],
                                 config.backup, own["all_hit"])["profile_tokens_per_s"]


def _differences(g: pd.DataFrame) -> dict:
    """Greedy runs: the share of prompts identical to AR, and whether every difference sat at a near-tie."""
    if g["identical_to_target"].isna().any():
        return {}
    out = {"identical_share": float(g["identical_to_target"].astype(bool).mean())}
    differ = g[~g["identical_to_target"].astype(bool)]
    if len(differ) and "near_tie" in g:
        out["differences_at_near_ties"] = bool(differ["near_tie"].eq(True).all())
        out["largest_margin_at_difference"] = float(differ["margin_at_difference"].max())
    return out


def _batch_sizes(g: pd.DataFrame) -> pd.Series:
    """Each row's batch size (1 in results stored before batches)."""
    return g["batch_size"].fillna(1) if "batch_size" in g else pd.Series(1, index=g.index)


def _machine_s(g: pd.DataFrame) -> pd.Series:
    """Each answer's share of the machine's time: its call's wall time over the call's batch size (b answers shared
    it), so total new tokens over their sum is the total tokens/s."""
    return g["wall_s"] / _batch_sizes(g)


def _mean_of(g: pd.DataFrame, column: str) -> float | None:
    values = g[column].dropna() if column in g else []
    return float(values.mean()) if len(values) else None


def _decode_rate(g: pd.DataFrame) -> float | None:
    """New tokens after the prompts' passes over the machine's time after them; None if a row did not time its
    prefill. (Rows stored before prefill_tokens existed had none: their passes made no token.)"""
    if "prefill_s" not in g or g["prefill_s"].isna().any():
        return None
    prefill_tokens = g["prefill_tokens"].fillna(0) if "prefill_tokens" in g else 0
    return float((g["new_tokens"] - prefill_tokens).sum() / ((g["wall_s"] - g["prefill_s"]) / _batch_sizes(g)).sum())


def summary_table(summary: list[dict]) -> str:
    columns = ["method", "batch_size", "new_tokens", "wall_s", "tokens_per_s", "sequence_tokens_per_s",
               "speedup_vs_ar", "decode_tokens_per_s",
               "decode_speedup_vs_ar", "speedup_vs_peer",
               "acceptance_rate", "mean_accepted", "mean_k", "mean_budget", "hit_rate", "all_hit_rate", "t_p", "t_b",
               "predicted_speedup_vs_ar",
               "profile_tokens_per_s", "decode_over_profile_prediction", "identical_share", "differences_at_near_ties"]
    frame = pd.DataFrame(summary).reindex(columns=columns).dropna(axis=1, how="all")
    return frame.to_string(index=False, float_format=lambda x: f"{x:.3f}")


def category_table(categories: list[dict]) -> str:
    """by_category's report, a row per category and method and the overall rows, each figure as mean [95% CI]; a set
    of one category (HumanEval, prose) shows only the overall rows, which are the same numbers."""
    frame = pd.DataFrame(categories)
    if frame["category"].nunique() == 2:
        frame = frame[frame["category"] == "overall"]
    out = frame[["category", "method", "answers"]].copy()
    for value, header in CATEGORY_VALUES.items():
        if frame[value].notna().any():
            digits = 3 if value in RATIO_VALUES else 2
            out[header] = [_mean_and_ci(m, ci, digits) for m, ci in zip(frame[value], frame[f"{value}_ci"])]
    caption = (f"per category: tokens/s and tokens/round mean over answers, speed-ups geometric mean of per-answer "
               f"ratios [95% CI over answers, from {MIN_CI_N} answers on]")
    return caption + "\n" + out.to_string(index=False)


def _mean_and_ci(mean, ci, digits: int) -> str:
    if mean is None or pd.isna(mean):
        return ""
    return f"{mean:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")
