"""Experiments that return tidy DataFrames: one row per round, per (prompt, setting), or per aggregate; and a pair's
latency profiles at several precisions."""
from __future__ import annotations

import dataclasses
import os

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..bench.methods import get_method
from ..checks import check_strategy, parse_variant
from ..models.loading import load_pair
from ..bench.profile import cached_profile
from ..bench.prompts import encode
from ..core.fan_out import Calibrator, allocate
from ..core.speculation import SSDConfig
from ..bench.frames import final_rounds, rounds_frame
from ..core.tuning import Autotune


def ssd_rounds(pair, prompts, config: SSDConfig, seed: int = 0, progress: bool = True,
               autotune: Autotune | None = None) -> pd.DataFrame:
    """Run SSD on every prompt; one row per round, with prompt_id. Prompt i uses seed + i."""
    return decode(pair, prompts, "ssd", config, seed, progress, autotune)[1]


def calibrator_from(rounds, prior_a_p: float = 0.6, prior_r: float = 0.5) -> Calibrator:
    """A Calibrator fed every round of trace frames (draft_len, accepted, rank where recorded): the a_p and miss rates
    a run over those rounds would end with."""
    calibrator = Calibrator(prior_a_p=prior_a_p, prior_r=prior_r)
    for draft_len, accepted, rank in zip(rounds["draft_len"], rounds["accepted"], rounds["rank"]):
        calibrator.update(int(accepted), int(draft_len), None if rank is None or rank != rank else int(rank))
    return calibrator


def rounds_to_learn_from(path: str, pair, prompts, config: SSDConfig, progress: bool = True
                         ) -> tuple[pd.DataFrame, str]:
    """The SSD rounds a tuner's estimates (``calibrator_from``) are learnt from, and one line saying
    where they came from: those stored at `path` (the rounds CSV ``python -m ssd hit-rates`` wrote on the machine
    whose benches a notebook shows) where it exists, at no cost; else `config` run here on `prompts` (pass path "" to
    run here)."""
    if path and os.path.exists(path):
        rounds = pd.read_csv(path)
        return rounds, f"{path}: {len(rounds)} stored rounds of {rounds['prompt_id'].nunique()} prompts"
    rounds = ssd_rounds(pair, prompts, config, progress=progress)
    return rounds, f"a short SSD run here: {len(rounds)} rounds of {len(prompts)} prompts"


def hit_rate_curves(rounds: pd.DataFrame, budgets, k: int, strategies, a_p: float = 0.6, r: float = 0.5) -> pd.DataFrame:
    """Counterfactual hit rate per (prompt, strategy, budget) from rounds run with the jit backup and C = 1."""
    rows = []
    for prompt_id, frame in rounds.groupby("prompt_id", sort=False):
        for strategy in strategies:
            hits = counted(counterfactual_hits(frame, budgets, k, strategy, a_p=a_p, r=r))
            for budget, g in hits.groupby("budget"):
                rows.append({"prompt_id": prompt_id, "strategy": strategy, "budget": budget, "hit_rate": g.hit.mean(),
                             "rounds": len(g)})
    return pd.DataFrame(rows)


def counted(hits: pd.DataFrame) -> pd.DataFrame:
    """A ``counterfactual_hits`` frame less each run's last round, whose lookup decides nothing (``final_rounds``)."""
    return hits[~hits["final"]]


def decode(pair, prompts, method: str, config, seed: int = 0, progress: bool = True, autotune: Autotune | None = None):
    """Run one method on every prompt (prompt i uses seed + i). On auto the method is priced on the autotune's
    profile at b = 1 and, for SSD, carries its estimates from prompt to prompt in it.

    Returns (runs, rounds, tokens): one row per prompt with the trace's summary figures (acceptance_rate is accepted
    / drafted, a_p the per-token estimate accepted / tested), one row per round, and the new tokens by prompt id.
    """
    run = get_method(method, autotune)
    runs, rounds, tokens = [], [], {}
    for i, prompt in enumerate(tqdm(prompts, desc=method, disable=not progress)):
        new, trace = run(pair, encode(pair.tokenizer, prompt), config, torch.Generator().manual_seed(seed + i))
        tokens[prompt.id] = new
        frame = rounds_frame(trace).assign(prompt_id=prompt.id)
        runs.append({"prompt_id": prompt.id, "method": method, "new_tokens": len(new), "rounds": len(trace.rounds),
                     "acceptance_rate": trace.acceptance_rate, "a_p": fitted_a_p(frame) if trace.drafted else None,
                     "mean_accepted": trace.mean_accepted,
                     "tokens_per_round": trace.tokens_per_round, "hit_rate": trace.hit_rate, "wall_s": trace.wall_s,
                     "tokens_per_s": len(new) / trace.wall_s if trace.wall_s else None})
        if trace.rounds:
            rounds.append(frame)
    return pd.DataFrame(runs), pd.concat(rounds, ignore_index=True) if rounds else pd.DataFrame(), tokens


def sweep_field(pair, prompts, method: str, config, field: str, values, seed: int = 0, progress: bool = True,
                autotune: Autotune | None = None):
    """decode() once per value of one config field (K, temperature, Saguaro's C, ...), each with the autotune.

    Returns (runs, rounds, tokens): the frames with a column named after the field, and tokens[value][prompt_id].
    """
    runs, rounds, tokens = [], [], {}
    for value in values:
        r, rr, tokens[value] = decode(pair, prompts, method, dataclasses.replace(config, **{field: value}), seed,
                                      progress, autotune)
        runs.append(r.assign(**{field: value}))
        rounds.append(rr.assign(**{field: value}))
    return pd.concat(runs, ignore_index=True), pd.concat(rounds, ignore_index=True), tokens


# ---- fan-out analyses on recorded SSD rounds (notebooks 02, 03) --------------------------------------------------


def fitted_a_p(rounds: pd.DataFrame) -> float:
    """a_p by the truncated-geometric maximum likelihood: accepted / tested, where a round that rejects tested one
    token more than it accepted (accepted / drafted is biased low: untested tokens after a rejection count)."""
    tested = rounds.accepted + (rounds.accepted < rounds.draft_len)
    return float(rounds.accepted.sum() / tested.sum())


def estimates_apart(rounds: pd.DataFrame, budgets, k: int, a_p: float = 0.6, r: float = 0.5) -> pd.DataFrame:
    """The calibrated fan-out with the backup-drafted rounds' estimates kept apart from the cache-drafted ones' (the
    paper's two fan-out lists) against one set for both: counterfactual hit rate per (prompt, budget, apart), with
    the share of rounds the backup drafted. Exact for runs with the jit backup and C = 1 (``counterfactual_hits``)."""
    rows = []
    for prompt_id, frame in rounds.groupby("prompt_id", sort=False):
        for apart in (False, True):
            hits = counterfactual_hits(frame, budgets, k, "calibrated", a_p=a_p, r=r, apart=apart)
            for budget, g in hits.groupby("budget"):  # the last round's draft is backed or not like any other's
                rows.append({"prompt_id": prompt_id, "budget": budget, "apart": apart,
                             "hit_rate": counted(g).hit.mean(), "backed": g.backed.mean()})
    return pd.DataFrame(rows)


def ap_sensitivity(rounds: pd.DataFrame, budget: int, k: int, a_ps, r: float) -> pd.DataFrame:
    """Counterfactual hit rate per (prompt, assumed a_p) of the geometric fan-out at one budget, plus uniform's rows
    (assumed_a_p NaN): what believing the wrong acceptance rate costs."""
    rows = []
    for prompt_id, frame in rounds.groupby("prompt_id", sort=False):
        for a_p in a_ps:
            hits = counted(counterfactual_hits(frame, [budget], k, "geometric", a_p=a_p, r=r))
            rows.append({"prompt_id": prompt_id, "strategy": "geometric", "assumed_a_p": a_p, "hit_rate": hits.hit.mean()})
        hits = counted(counterfactual_hits(frame, [budget], k, "uniform"))
        rows.append({"prompt_id": prompt_id, "strategy": "uniform", "assumed_a_p": float("nan"), "hit_rate": hits.hit.mean()})
    return pd.DataFrame(rows)


def profiles_at(pair_name: str, precisions, *, verifier_cores="0", drafter_cores="1", progress: bool = True,
                stored: str | None = None):
    """The pair's profile at each (target, draft) precision, one pair in memory at a time (from the user cache where
    measured before, or `stored`'s profile of this kind of machine): how the regime moves with precision. Returns
    {label: Profile}."""
    out = {}
    for target, draft in dict.fromkeys(precisions):  # once each, in order
        pair = load_pair(pair_name, target_dtype=target, draft_dtype=draft, progress=progress)
        out[pair.precisions.label] = cached_profile(pair, verifier_cores=verifier_cores, drafter_cores=drafter_cores,
                                                    progress=progress, stored=stored)
        del pair
    return out


# ---- a bench of method variants (notebook 07) ----------------------------------------------------------------------


VARIANT_COLUMNS = ["method", "base", "k", "budget", "decode_tokens_per_s", "tokens_per_s", "mean_k", "mean_budget",
                   "acceptance_rate", "hit_rate", "identical_to_target"]


def variant_summary(summary) -> pd.DataFrame:
    """A bench's summary (its JSON's "summary") with each method variant's settings in columns: base (the method),
    k and budget as the variant set them ("auto", an integer, or None where it set nothing), and the K and B its
    rounds used on average (mean_k, mean_budget)."""
    rows = []
    for s in summary:
        base, overrides = parse_variant(s["method"])
        rows.append({"method": s["method"], "base": base, "k": overrides.get("k"), "budget": overrides.get("budget"),
                     "decode_tokens_per_s": s.get("decode_tokens_per_s"), "tokens_per_s": s.get("tokens_per_s"),
                     "mean_k": s.get("mean_k"), "mean_budget": s.get("mean_budget"),
                     "acceptance_rate": s.get("acceptance_rate"), "hit_rate": s.get("hit_rate"),
                     "identical_to_target": s.get("identical_to_target")})
    return pd.DataFrame(rows, columns=VARIANT_COLUMNS)  # the columns even of no summary: a notebook with nothing stored


def auto_against_fixed(variants: pd.DataFrame, base: str, default: str) -> dict:
    """The auto variant of a method against its fixed ones in a bench (``variant_summary``): its decode tokens/s, the
    best fixed variant's and the default's (the method label `default`), and the two ratios."""
    rows = variants[variants["base"] == base]
    auto = rows[(rows["k"] == "auto") | (rows["budget"] == "auto")]
    fixed = rows[~rows.index.isin(auto.index)]
    if len(auto) != 1 or fixed.empty or default not in set(fixed["method"]):
        raise ValueError(f"variants need one auto variant of {base}, fixed ones and the default {default!r}; "
                         f"got {list(rows['method'])}")
    auto, best = auto.iloc[0], fixed.loc[fixed["decode_tokens_per_s"].idxmax()]
    default_tps = fixed.loc[fixed["method"] == default, "decode_tokens_per_s"].item()
    return {"auto": auto["method"], "auto_tokens_per_s": auto["decode_tokens_per_s"], "mean_k": auto["mean_k"],
            "mean_budget": auto["mean_budget"], "best_fixed": best["method"],
            "best_fixed_tokens_per_s": best["decode_tokens_per_s"],
            "auto_over_best": auto["decode_tokens_per_s"] / best["decode_tokens_per_s"],
            "default": default, "default_tokens_per_s": default_tps,
            "auto_over_default": auto["decode_tokens_per_s"] / default_tps}


def timeline_summary(spans: pd.DataFrame) -> pd.DataFrame:
    """What a timeline (ssd.analysis.timeline.timeline) shows, in numbers, per method over its rounds after the first
    (which feeds the target its prompts; in older traces a prompts' pass apart, also left out): the mean ms per round of
    each phase (verify, wait, draft steps or pre-speculation, lookup and backups: draft_s), the share of the decode time
    each lane worked (waits are not work), and the share in which both worked at once: 0 where the models take turns
    (SD), above 0 where the drafter works while the verifier verifies.
    spans: ``spans_frame`` rows (one call per method; ssd.bench.run.run_bench's "spans" for one prompt)."""
    rows = []
    for method, g in spans[spans["round"] > 0].groupby("method", sort=False):
        decode_s = g["end_s"].max() - g["start_s"].min()
        work = g[g["phase"] != "wait_s"]
        lanes = {lane: _merged(work[work["lane"] == lane]) for lane in ("target", "draft")}
        rounds = g["round"].nunique()
        ms = (g["end_s"] - g["start_s"]).groupby(g["phase"]).sum() * 1000 / rounds
        rows.append({"method": method, "rounds": rounds, "decode_s": decode_s,
                     **{f"{phase[:-2]}_ms": ms.get(phase, 0.0) for phase in ("verify_s", "wait_s", "draft_s",
                                                                               "prespec_s")},
                     **{f"{lane}_busy": _length(covered) / decode_s for lane, covered in lanes.items()},
                     "both_busy": _length(_overlap(lanes["target"], lanes["draft"])) / decode_s})
    return pd.DataFrame(rows)


def phase_apart(spans: pd.DataFrame, longer: str, shorter: str, phase: str = "verify_s",
                level: float = 0.99) -> pd.DataFrame:
    """Whether one method's phase (ms per round, rounds after the first) is longer than another's beyond the rounds'
    spread: each method's mean with a Student-t interval at `level` over its rounds, and `apart` True where the
    longer one's interval lies wholly above the shorter one's. A claim about a live timing is checked on this, not on
    two means that noise can reorder. spans: as for timeline_summary."""
    from ..bench.stats import mean_ci

    g = spans[(spans["round"] > 0) & (spans["phase"] == phase) & spans["method"].isin([longer, shorter])]
    per_round = ((g["end_s"] - g["start_s"]) * 1000).groupby([g["method"], g["round"]]).sum().rename("ms")
    table = mean_ci(per_round.reset_index(), "method", "ms", level).set_index("method").reindex([longer, shorter])
    table["apart"] = bool(table.loc[longer, "ci_low"] > table.loc[shorter, "ci_high"])  # False where either is NaN
    return table


def sd_has_more_cores(verifier_cores) -> bool:
    """Whether SD in this process runs on more threads than the pipeline's verifier rank has cores: the premise of
    "one core against two". Not so where the caller gave the process one thread (make test gives each worker's
    kernels their share of the cores: one on two cores)."""
    from ..models.cores import parse_cores

    return torch.get_num_threads() > len(parse_cores(verifier_cores, "verifier_cores"))


def _merged(spans: pd.DataFrame) -> list[tuple[float, float]]:
    """The time the spans cover, as sorted disjoint intervals."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(zip(spans["start_s"], spans["end_s"])):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def _overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The intervals where two sorted disjoint interval lists both hold."""
    return [(max(s, t), min(e, f)) for s, e in a for t, f in b if max(s, t) < min(e, f)]


def _length(intervals) -> float:
    return sum(end - start for start, end in intervals)


# ---- counterfactual hit rates: what one run says of every budget and strategy ------------------------------------


def counterfactual_hits(rounds: pd.DataFrame, budgets, k: int, strategy: str, a_p: float = 0.6, r: float = 0.5,
                        apart: bool = False) -> pd.DataFrame:
    """Would each round have hit at budget B under a fan-out strategy? One run gives the whole curve.

    A round hits iff the rank of t* among the candidates at its position is within F_k. When the trajectory does
    not depend on what is cached -- the jit backup with C = 1, see ssd.core.speculation's docstring -- the ranks a
    run records are those of a run at any other budget or strategy, so one run at any B > 0 answers for every B and
    every strategy: uniform; geometric with the given a_p and r; calibrated, its estimates replayed from the recorded
    k and ranks, starting from the prior (a_p, r). With Saguaro C < 1 the draft distribution depends on the cached
    sets, and with the fast backup a miss changes the next draft: there each B is its own run.

    apart (calibrated): the rounds whose draft came from the backup (at this B: the round before missed, or the
    run's first round) learn and are allocated from estimates of their own, the cache-drafted ones from theirs (the
    paper's two fan-out lists); otherwise one set of estimates serves both.

    rounds: SSD rounds of one or more runs (each run starts at round 0). Returns one row per (run, round, budget)
    with columns run, round, final (the run's last round, whose lookup a hit rate leaves out: ``final_rounds``),
    budget, backed (the round's draft came from the backup at this B) and hit.
    """
    check_strategy(strategy)
    sources = ("cached", "backed") if apart else ("cached",)
    rows, run = [], -1
    for row, final in zip(rounds.itertuples(), final_rounds(rounds)):
        if row.round == 0:
            run, shared = run + 1, Calibrator(prior_a_p=a_p, prior_r=r)
            estimates = {(b, s): Calibrator(prior_a_p=a_p, prior_r=r) if apart else shared
                         for b in budgets for s in sources}
            planned, hit_before = _fan_outs(estimates, strategy, k, a_p, r), {b: False for b in budgets}
        # Round r's fan-out was chosen while round r - 1 was being verified (its pre-speculation): from the rounds
        # before r - 1, as in generate_ssd.
        current, planned = planned, _fan_outs(estimates, strategy, k, a_p, r)
        rank = None if pd.isna(row.rank) else int(row.rank)
        for b in budgets:
            source = "cached" if hit_before[b] or not apart else "backed"
            hit = rank is not None and rank <= current[(b, source)][row.accepted]
            rows.append({"run": run, "round": row.round, "final": final, "budget": b, "backed": not hit_before[b],
                         "hit": hit})
            if apart:
                estimates[(b, source)].update(row.accepted, row.draft_len, rank)
            hit_before[b] = hit
        if not apart:
            shared.update(row.accepted, row.draft_len, rank)
    return pd.DataFrame(rows)


def _fan_outs(estimates: dict, strategy: str, k: int, a_p: float, r: float) -> dict:
    """The fan-out each (budget, source) of ``counterfactual_hits`` would spend now, from its estimates."""
    return {(b, source): allocate(strategy, b, k, a_p=a_p, r=r, calibrator=calibrator)
            for (b, source), calibrator in estimates.items()}
