"""The benchmark: methods run side by side on the same prompts, in one process, interleaved per prompt.

Figures worth trusting on a noisy clock are ratios measured in one run, so every method sees each prompt (each turn
of a Spec-Bench row) before the next starts, each of ours next to its transformers peer, and the order rotates from
answer to answer so no method always runs first (answer_order). Beside one summary per method, the bench reports per
category as Spec-Bench does (by_category).

A long bench is resumable: with a checkpoint file it writes every finished prompt's rows there (atomically), and a
run of the same arguments that finds the file skips those prompts. Side by side stays per prompt, so the ratios hold;
SSD's carried estimates (``ssd.core.tuning.Autotune``, one for the whole bench) start again from the prior where a run
resumes.
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ..models import kernels
from ..core.decoding import DecodeConfig, generate_ar
from ..files import write_json
from .stats import MIN_CI_N, mean_ci, speedups
from .lossless import identity_report
from ..models.capability import capability, device_name, kind_line, kind_of, machine_kind
from ..checks import check_at_least, is_auto, parse_variant
from .methods import resolve, tunes
from .prompts import encode
from ..core.theory import measured_theorem7, sd_from_profile, theorem7_from_profile
from ..core.trace import ForwardClock, Trace
from ..core.tuning import Autotune, on_auto, tuned_latencies

# Each of ours next to the transformers peer that does the same job.
PEERS = {"ar": "hf-ar", "sd": "hf-sd"}

# The per-category report's figures (means over answers) and their headers in the printed table.
CATEGORY_VALUES = {"tokens_per_s": "tokens/s", "speedup_vs_ar": "speed-up vs ar", "tokens_per_round": "tokens/round"}


def run_one(method: str, pair, prompt_ids, config: DecodeConfig, seed: int, autotune: Autotune | None = None
            ) -> tuple[list[int], dict, Trace]:
    """One answer of a method (or a variant, ``ssd.bench.methods``) and its row: a batch of one."""
    return run_batch(method, pair, [prompt_ids], config, seed, autotune)[0]


def run_batch(method: str, pair, contexts: list[list[int]], config: DecodeConfig, seed: int,
              autotune: Autotune | None = None) -> list[tuple[list[int], dict, Trace]]:
    """A batch of answers of a method in one call (all its rows share every forward), and a row for each.

    A row's wall_s is the call's: what each sequence of the batch waited. Its tokens_per_s is its share of the
    batch's throughput, new tokens over wall_s / b (over a batch their mean is the batch's total tokens/s; b = 1:
    the answer's own rate); sequence_tokens_per_s is its own rate, new tokens over wall_s (per-sequence latency).
    A method on auto learns from the autotune (and goes on updating it).
    """
    generate, config, _ = resolve(method, config, autotune=autotune)
    generator = torch.Generator().manual_seed(seed)
    with ForwardClock(target=pair.target, draft=pair.draft) as clock:
        start = time.perf_counter()
        answers, traces = generate(pair, contexts, config, generator)
        wall = time.perf_counter() - start
    forwards = _forwards(clock, wall)
    return [(tokens, _row(method, tokens, trace, wall, len(contexts)) | forwards, trace)
            for tokens, trace in zip(answers, traces)]


def _forwards(clock: ForwardClock, wall: float) -> dict:
    """Where a call's time went (the batch's, like wall_s): each model's forwards, their count, the target's first
    (the prompt's pass, fused or not), and the rest (sampling, verification, bookkeeping; for the pipeline, also the
    waits for the drafter, whose forwards run in its own process)."""
    return {"target_forwards": clock.calls["target"], "target_forward_s": clock.seconds["target"],
            "first_target_forward_s": clock.first_s["target"], "draft_forwards": clock.calls["draft"],
            "draft_forward_s": clock.seconds["draft"],
            "outside_forwards_s": wall - clock.seconds["target"] - clock.seconds["draft"]}


def _row(method: str, tokens: list[int], trace: Trace, wall: float, b: int) -> dict:
    drafting = [r for r in trace.rounds if r.draft_len > 0]
    budgets = [r.budget for r in trace.rounds if getattr(r, "budget", None) is not None]
    return {
        "method": method,
        "batch_size": b,
        "new_tokens": len(tokens),
        "wall_s": wall,
        "tokens_per_s": len(tokens) * b / wall,
        "sequence_tokens_per_s": len(tokens) / wall,
        # The paper's measure: tokens over the time after the prompt's pass (fused with the first round: after that
        # round, whose tokens are then the prompt's), for the peers as for ours.
        "prefill_s": trace.prefill_s,
        "prefill_tokens": trace.prefill_tokens,
        "decode_tokens_per_s": (len(tokens) - trace.prefill_tokens) * b / trace.decode_s if trace.decode_s else None,
        "drafted": trace.drafted,
        "accepted": sum(r.accepted for r in trace.rounds),
        "rounds": len(trace.rounds),
        "acceptance_rate": trace.acceptance_rate,
        "mean_accepted": trace.mean_accepted,
        # Tokens per target forward: Spec-Bench's "mean accepted tokens" (1 for AR; None where a peer has no rounds).
        "tokens_per_round": trace.tokens_per_round,
        "hit_rate": trace.hit_rate,
        # SSD at batch b: the share of this sequence's rounds in which every sequence of the batch hit
        "all_hit_rate": trace.all_hit_rate,
        # The K and B the rounds used (the tuner's choices with k or budget "auto"): K over rounds that drafted.
        "drafting_rounds": len(drafting),
        "mean_k": sum(r.draft_len for r in drafting) / len(drafting) if drafting else None,
        "mean_budget": sum(budgets) / len(budgets) if budgets else None,
    }


def batch_size_of(method: str, batch_size: int = 1) -> int:
    """How many prompts a method decodes at once in a bench: its variant's batch_size=, else the bench's."""
    return parse_variant(method)[1].get("batch_size", batch_size)


WARM_UP_TOKENS = 8  # on a CPU; a GPU warms up over a whole answer (warm_up)


def answer_order(methods: list[str], j: int) -> list[str]:
    """The order in which the methods give answer j. Each of ours runs next to its transformers peer (PEERS) where
    both run, as a block: a slow spell of the machine (a minute or so here, hitting every method it overlaps) then
    falls on both answers of a ratio or on neither. Before blocks, ar and hf-ar stood three answers apart in one
    prompt of four, and that quarter of the prompts held 40-81% of the spread of ar / hf-ar in the four peer benches
    on the AVX-512 CPU (data/peers_*.json). The blocks rotate from answer to answer, and within a block the first
    alternates, so no method always runs first or always after the same one."""
    blocks, placed = [], set()
    for method in methods:
        if method in placed:
            continue
        partner = PEERS.get(method) or next((ours for ours, peer in PEERS.items() if peer == method), None)
        block = [method] + ([partner] if partner in methods and partner not in placed else [])
        placed.update(block)
        blocks.append(block)
    turn = j % len(blocks)
    return [m for block in blocks[turn:] + blocks[:turn] for m in (block[::-1] if j % 2 else block)]


def warm_up(pair, contexts: list[list[int]], methods: list[str], config: DecodeConfig, batch_size: int = 1,
            autotune: Autotune | None = None) -> None:
    """One untimed call per method, at its batch size: first calls pay for allocator growth and lazy initialisation.
    On a CPU a short one does; a GPU loads each kernel at its first use and picks kernels by shape as the context
    grows, so there it decodes a whole answer (after 8 tokens, an H200's first timed AR answer in bfloat16 still took
    2.0 s against 0.13 s for the next, in make gpu-check on 2026-12-04). The methods on auto learn from these calls
    too (the bench's autotune), as from every other."""
    tokens = config.max_new_tokens if pair.target.device.type != "cpu" else min(WARM_UP_TOKENS, config.max_new_tokens)
    short = dataclasses.replace(config, max_new_tokens=tokens)
    for method in methods:
        run_batch(method, pair, contexts[: batch_size_of(method, batch_size)], short, 0, autotune)


def run_bench(pair, prompts, methods: list[str], config: DecodeConfig, seed: int = 0, progress: bool = True,
              profile=None, checkpoint: str | None = None, batch_size: int = 1,
              autotune: Autotune | None = None) -> dict:
    """Returns {"rows": [...], "summary": [...], "categories": [...], "peers": [...], "breakdown": [...],
    "spans": [...]}: one row per (method, generated answer), one summary row per method, the per-category report
    (by_category), ours against the transformers peers (against_peers), where each method's time went
    (time_breakdown), and the timed blocks of every answer decoded by this call (Trace.spans_frame's rows with the
    answer's prompt_id; for ssd.analysis.timeline.timeline).

    A prompt with several turns (MT-bench's rows in Spec-Bench) gives one answer, and one row, per turn: its first
    turn under the prompt's id, turn t under "ID/turnT". Each method answers turn t after its own answer to turn t - 1
    (at temperature 0 every lossless method's answer is AR's, so all see the same context).

    Batches: prompts go in groups as large as the largest batch size among the methods (batch_size, or a
    variant's ``batch_size=``); each method answers a group's turn in calls of its own batch size, and every method
    answers it before the next turn or group starts, in an order rotated from group to group (answer_order). Where
    any method batches, the prompts are first ordered by their first turn's length, as a server groups requests, so a
    batch's rows need little left padding in the prompts' pass (compute-bound on a CPU, and padding is paid in full);
    every method gets the same batches. Answer j (over the whole run, in that order) is the first of its call, or alone,
    with seed + j.

    config is shared by every method (an SSDConfig carries what ssd needs; the others ignore those fields). The
    methods on auto (K, B or the backup) are priced on the autotune's profile at their batch size and learn from it:
    one Autotune for the whole bench, so an answer starts from the estimates the last one on its settings left. With a
    latency profile (ssd.bench.profile), or several by the batch size they were timed at ({b: profile}), the summaries of
    SD and the SSD methods at a b one was timed at also hold the prediction it gives. checkpoint: a path where
    the rows so far are kept after each group, and read back by a later run of the same arguments, which goes on
    from the next group (the caller removes it once the result is safe).
    """
    check_at_least(batch_size, "batch_size")
    for p in prompts:  # a template that rewrites answers fails here, not after minutes of decoding
        encode(pair.tokenizer, p, [[]] * (len(p.turns) - 1))
    for m in methods:  # and so does a method on auto with no latencies at its batch size
        if tunes(m, config):
            tuned_latencies(autotune, batch_size_of(m, batch_size))
    size = max(batch_size_of(m, batch_size) for m in methods)
    if size > 1:
        prompts = sorted(prompts, key=lambda p: len(encode(pair.tokenizer, p)))
    identity = _identity(pair, prompts, methods, config, seed, batch_size)
    rows, rounds, done = _resume(checkpoint, identity)
    spans = []
    _say_ragged_end(len(prompts), size)
    if done < len(prompts):
        warm_up(pair, [encode(pair.tokenizer, p) for p in prompts[done : done + size]], methods, config, batch_size,
                autotune)
    j = sum(len(p.turns) for p in prompts[:done])  # the answer's index over the whole run
    bar = tqdm(total=sum(len(p.turns) for p in prompts) * len(methods), initial=j * len(methods), desc="bench",
               disable=not progress)
    for first in range(done, len(prompts), size):
        group = prompts[first : first + size]
        answers = {method: [[] for _ in group] for method in methods}  # each method's answers so far, by prompt
        for turn in range(max(len(p.turns) for p in group)):
            members = [i for i, p in enumerate(group) if turn < len(p.turns)]
            contexts = {method: [encode(pair.tokenizer, group[i], answers[method][i]) for i in members]
                        for method in methods}
            order = answer_order(methods, j)
            turn_rows, runs = _run_turn(pair, [group[i] for i in members], turn, contexts, order, config, seed, j,
                                        profile, bar, batch_size, autotune)
            _report_identity(pair, config, turn_rows, runs, contexts, seed + j)
            for row, (method, i, tokens, trace, frame) in zip(turn_rows, runs):
                answers[method][members[i]].append(_without_eos(tokens, pair.eos_token_ids))
                if frame is not None:
                    rounds.append(frame)
                spans += trace.spans_frame().assign(method=method, prompt_id=row["prompt_id"],
                                                       call=row["call"]).to_dict("records")
            rows += turn_rows
            j += len(members)
        if checkpoint:
            write_json(checkpoint, {"identity": identity, "prompts_done": first + len(group), "rows": rows,
                                    "rounds": [r for f in rounds for r in f.to_dict("records")]})
    bar.close()
    frame = pd.DataFrame(rows)
    summary = summarize(frame, pd.concat(rounds) if rounds else None, profile, config)
    return {"rows": rows, "summary": summary, "categories": by_category(frame), "peers": against_peers(frame),
            "breakdown": time_breakdown(frame).to_dict("records"), "spans": spans}


def _say_ragged_end(n: int, size: int) -> None:
    """Once, where prompts do not divide into batches: the last one is smaller (its rows run at that batch size)."""
    if size > 1 and n % size:
        print(f"[bench] {n} prompts in groups of {size}: the last group holds {n % size}, and its batches are that "
              "small", file=sys.stderr)


def _identity(pair, prompts, methods: list[str], config: DecodeConfig, seed: int, batch_size: int) -> dict:
    """What a checkpoint must match to be resumed: the pair and its precisions, the prompts, methods, seed, batch
    size and every setting."""
    settings = {f.name: repr(getattr(config, f.name)) for f in dataclasses.fields(config)}
    return {"pair": pair.name, "precisions": pair.precisions.label, "prompts": [p.id for p in prompts],
            "methods": list(methods), "seed": seed, "batch_size": batch_size, "config": settings}


def _resume(checkpoint: str | None, identity: dict) -> tuple[list[dict], list[pd.DataFrame], int]:
    """The rows, round frames and number of prompts a checkpoint holds (none if there is no file)."""
    if not checkpoint or not os.path.exists(checkpoint):
        return [], [], 0
    with open(checkpoint) as f:
        state = json.load(f)
    if state.get("identity") != identity:
        differ = sorted(k for k in identity if state.get("identity", {}).get(k) != identity[k])
        raise ValueError(f"checkpoint {checkpoint} holds a bench of other arguments ({', '.join(differ)} differ): "
                         "remove it to start afresh, or run the same arguments to resume")
    rounds = pd.DataFrame(state["rounds"])
    print(f"[bench] resuming from {checkpoint}: {state['prompts_done']} of {len(identity['prompts'])} prompts done",
          file=sys.stderr)
    return state["rows"], [rounds] if len(rounds) else [], state["prompts_done"]


def _run_turn(pair, members: list, turn: int, contexts: dict, order: list[str], config, seed: int, first: int,
              profile, bar, batch_size: int, autotune: Autotune | None):
    """Every method, in the given order, answers one turn of each member prompt from its own contexts, in calls of
    its batch size (the call starting at member i with seed + first + i; first: the index of the turn's first answer
    over the run). A row's ``call`` is the index of its call's first answer: the answers of one call share it.
    Returns the rows and (method, member index, tokens, trace, its frame or None) per answer."""
    rows, runs = [], []
    for method in order:
        b = batch_size_of(method, batch_size)
        for start in range(0, len(members), b):
            bar.set_postfix_str(f"{_answer_id(members[start], turn)} {method}" + (f" x{b}" if b > 1 else ""))
            answered = run_batch(method, pair, contexts[method][start : start + b], config, seed + first + start,
                                 autotune)
            for i, (tokens, row, trace) in enumerate(answered, start=start):
                prompt = members[i]
                # Labelled with the variant, not the trace's method: two variants of one method are summarised apart.
                frame = trace.to_frame().assign(method=method) if trace.rounds else None
                if profile is not None and _is_ssd(method):  # Theorem 7 fed by the profile
                    row["profile_tokens_per_s"] = _profile_prediction(profile, resolve(method, config).config, b,
                                                                      frame)
                rows.append({"prompt_id": _answer_id(prompt, turn), "category": prompt.category, "turn": turn + 1,
                             "prompt_tokens": len(contexts[method][i]), "target_dtype": pair.precisions.target,
                             "draft_dtype": pair.precisions.draft, "call": first + start, **row})
                runs.append((method, i, tokens, trace, frame))
                bar.update()
    return rows, runs


def _answer_id(prompt, turn: int) -> str:
    return prompt.id if turn == 0 else f"{prompt.id}/turn{turn + 1}"


def _without_eos(tokens: list[int], eos) -> list[int]:
    """An answer as the next turn's context holds it: the chat template (or the separator) closes the turn itself."""
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


def _report_identity(pair, config: DecodeConfig, rows: list[dict], runs, contexts: dict, seed: int) -> None:
    """Greedy runs: add to each row whether its tokens equal AR's alone (batch size 1) from the same context (where
    not, the first difference and AR's margin there). AR's own run serves where it ran that context alone; elsewhere
    (no ar among the methods, ar in a batch, or a method whose earlier answer left AR's) an untimed AR run does."""
    keys = [tuple(contexts[method][i]) for method, i, *_ in runs]
    if config.temperature > 0:
        for row in rows:
            row["identical_to_target"] = None
        return
    references = {key: (tokens, trace) for key, (method, _, tokens, trace, _) in zip(keys, runs)
                  if method == "ar" and trace.batch_size == 1}
    for row, key, (_, _, tokens, _, _) in zip(rows, keys, runs):
        if key not in references:
            references[key] = generate_ar(pair, list(key), config, torch.Generator().manual_seed(seed))
        reference, trace = references[key]
        row.update(identity_report(tokens, reference, trace.rounds, pair.precisions.target))


def summarize(rows: pd.DataFrame, rounds: pd.DataFrame | None = None, profile=None, config=None) -> list[dict]:
    """tokens/s = total new tokens / total wall time (long prompts weigh by their length, as a user's clock does);
    decode tokens/s leaves out the prompts' passes (the paper's measure). With a profile (or {b: profile}) and the
    run's config, the SSD methods at a b it was timed at get Theorem 7 fed by its latencies beside the one fed by
    their own rounds, and SD its predicted speed-up over AR at that b."""
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
    tps = {s["method"]: s["tokens_per_s"] for s in summary}
    decode = {s["method"]: s["decode_tokens_per_s"] for s in summary}
    for s in summary:
        s["speedup_vs_ar"] = s["tokens_per_s"] / tps["ar"] if "ar" in tps else None
        s["decode_speedup_vs_ar"] = (s["decode_tokens_per_s"] / decode["ar"]
                                     if decode.get("ar") and s["decode_tokens_per_s"] else None)
        peer = PEERS.get(s["method"])
        s["speedup_vs_peer"] = s["tokens_per_s"] / tps[peer] if peer in tps else None
    for name in tps:
        if rounds is None or not _is_ssd(name):
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
    answers and the means over answers of tokens/s, of the speed-up over AR's answer to the same prompt and turn
    (only with ar among the methods), and of tokens per round (tokens per target forward, Spec-Bench's "mean
    accepted tokens"), each with its 95% Student-t CI (`VALUE_ci`, [low, high]) from MIN_CI_N answers on.

    Spec-Bench's own speed.py divides the mean tokens/s by AR's (a ratio of means, a question's turns pooled) and
    pools its accepted tokens over all rounds; means over answers are what a CI over answers is about.
    """
    rows = _with_speedups(rows)
    both = pd.concat([rows, rows.assign(category="overall")], ignore_index=True)
    keys = ["category", "method"]
    index = pd.MultiIndex.from_product([pd.unique(both["category"]), pd.unique(both["method"])], names=keys)
    table = both.groupby(keys).size().rename("answers").reindex(index).to_frame()
    for value in CATEGORY_VALUES:
        sample = both[[*keys, value]].astype({value: float}).dropna()
        if sample.empty:  # no ar among the methods, or only peers (no rounds)
            table[value], table[f"{value}_ci"] = None, None
            continue
        ci = mean_ci(sample, keys, value).set_index(keys).reindex(index)
        table[value] = ci["mean"]
        # mean_ci gives no interval from fewer than MIN_CI_N answers (NaN).
        table[f"{value}_ci"] = [None if pd.isna(lo) else [float(lo), float(hi)]
                                for lo, hi in zip(ci["ci_low"], ci["ci_high"])]
    # AR's own speed-up is 1 by definition, not a measurement: no interval.
    table.loc[table.index.get_level_values("method") == "ar", "speedup_vs_ar_ci"] = None
    records = table.reset_index().to_dict("records")
    return [{k: None if isinstance(v, float) and pd.isna(v) else v for k, v in r.items()} for r in records]


def against_peers(rows: pd.DataFrame) -> list[dict]:
    """Each of ours over its transformers peer (PEERS) on the same answers, whole call and decode-only: the geometric
    mean over answers of the ratio, with the 95% Student-t interval of the mean log ratio, exponentiated (none from
    fewer than MIN_CI_N answers). One record per (method, measure) whose peer ran."""
    out = []
    for method, peer in PEERS.items():
        for value in ("tokens_per_s", "decode_tokens_per_s"):
            if value not in rows or not {method, peer} <= set(rows["method"]):
                continue
            ratios = speedups(rows[rows["method"].isin([method, peer])].astype({value: float}), peer, value=value)
            logs = ratios.assign(log=np.log(ratios["speedup"])).dropna(subset=["log"])
            if logs.empty:
                continue
            ci = mean_ci(logs, "method", "log").iloc[0]
            out.append({"method": method, "peer": peer, "measure": value, "answers": int(ci["n"]),
                        "geometric_mean": float(np.exp(ci["mean"])),
                        "ci": None if pd.isna(ci["ci_low"]) else [float(np.exp(ci["ci_low"])),
                                                                  float(np.exp(ci["ci_high"]))]})
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
    """Each row's tokens/s over AR's on the same prompt and turn (1 for AR itself); NaN without ar."""
    if "ar" not in set(rows["method"]):
        return rows.assign(speedup_vs_ar=float("nan"))
    ratios = speedups(rows, "ar").rename(columns={"speedup": "speedup_vs_ar"})
    out = rows.merge(ratios, on=["prompt_id", "method"], how="left")
    out.loc[out["method"] == "ar", "speedup_vs_ar"] = 1.0
    return out


def _is_ssd(method: str) -> bool:
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


def _profile_prediction(profile, config, batch_size: int, rounds: pd.DataFrame) -> float | None:
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


def load_rows(path: str) -> pd.DataFrame:
    """The per-(method, prompt) rows of a bench result written by `python -m ssd bench --json PATH`."""
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or "rows" not in result:
        raise ValueError(f"{path} is not a bench result (a JSON object with 'rows'; write one with --json)")
    return pd.DataFrame(result["rows"])


def environment(device="cpu") -> dict:
    import transformers

    return {
        "device": str(device),
        "device_name": device_name(device),  # the GPU's name ('NVIDIA H200'), or the CPU's model
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "capability": capability(),  # the CPU's vector ISA and native reduced precisions: what auto decided from
        "float32_library": kernels.decisions(),  # which library multiplied float32 layers, as timed here (ssd.models.kernels)
    }


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
            digits = 2 if value != "speedup_vs_ar" else 3
            out[header] = [_mean_and_ci(m, ci, digits) for m, ci in zip(frame[value], frame[f"{value}_ci"])]
    caption = f"per category: mean over answers [95% CI over answers, from {MIN_CI_N} answers on]"
    return caption + "\n" + out.to_string(index=False)


def _mean_and_ci(mean, ci, digits: int) -> str:
    if mean is None or pd.isna(mean):
        return ""
    return f"{mean:.{digits}f}" + (f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]" if ci else "")


def stored(path: str, pair) -> dict | None:
    """The bench result stored at `path` (`python -m ssd bench --json PATH`) if it exists and was measured on this pair
    at these precisions (each model's), with "source": the path and "elsewhere": None where it was measured on this
    kind of machine (``ssd.models.capability.machine_kind``), else one line saying where; otherwise None. Timings and the
    auto rule's reason do not count: they never repeat, even on the machine that stored the result."""
    if not (path and os.path.exists(path)):
        return None
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    same = (result.get("args", {}).get("pair") == pair.name and precision.get("target") == pair.precisions.target
            and precision.get("draft") == pair.precisions.draft)
    if not same:
        return None
    there, here = kind_of(result.get("environment", {})), machine_kind(pair.target.device)
    elsewhere = None if there == here else f"measured on another kind of machine ({kind_line(there)}; this one: " \
                                            f"{kind_line(here)}): shown as stored, not re-measured"
    return result | {"source": path, "elsewhere": elsewhere}


def stored_or_run(path: str, pair, prompts, methods: list[str], config: DecodeConfig, *, measure_missing: bool,
                  progress: bool = True, autotune: Autotune | None = None) -> dict | None:
    """The bench result stored at `path` if it was measured on this pair at these precisions (``stored``); otherwise,
    with measure_missing, the same methods run here on `prompts` (not written; the methods on auto with the
    autotune), and without it None: a notebook at its defaults never re-measures a long bench, it shows the stored
    one or says how to measure it. A result carries "source": the path, or "measured here"."""
    found = stored(path, pair)
    if found is not None or not measure_missing:
        return found
    result = run_bench(pair, prompts, methods, config, progress=progress, autotune=autotune)
    return result | {"source": "measured here", "elsewhere": None, "precision": pair.precisions.as_dict()}


def not_stored_line(path: str, pair) -> str:
    """Why `stored` found nothing at `path` for this pair, in one line."""
    if not (path and os.path.exists(path)):
        return f"{path}: not measured yet"
    with open(path) as f:
        result = json.load(f)
    precision = result.get("precision") or {}
    return (f"{path}: measured on {result.get('args', {}).get('pair')} at target {precision.get('target')}, draft "
            f"{precision.get('draft')}, not on {pair.name} at {pair.precisions.label}")
