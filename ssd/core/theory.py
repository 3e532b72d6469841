"""Closed forms: tokens per round, SD's speedup, Theorem 7 for SSD (fed by a measured trace in
``ssd.bench.summaries.measured_theorem7``).

At batch size b every form counts tokens per sequence and time per round of the batch: a round is free of drafting
only when every sequence hit (the all-hit rate, about p_hit^b), so the forms that charge a miss take ``all_hit``
beside ``p_hit`` (None: one sequence, where the two are one rate).
"""
from __future__ import annotations

import math


def expected_tokens(a: float, k: int) -> float:
    """E = (1 - a^(K+1)) / (1 - a): expected tokens per round at per-token acceptance rate a."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def sd_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """SD over autoregressive: E / (c K + v), with c the draft/target cost ratio per token and v the cost of a verify
    pass over K + 1 tokens in one-token steps (about 1 on a GPU; measure it: ssd.bench.profile)."""
    return expected_tokens(a, k) / (c * k + v)


def all_hit_rate(p_hit: float, b: int) -> float:
    """p_hit^b: how often every one of b sequences hits, if their hits are independent (a measured all-hit rate
    departs from it where they are not: prompts of one kind hit and miss together)."""
    return p_hit**b


def theorem7_speedup(p_hit: float, e_hit: float, e_miss: float, t_p: float, t_b: float,
                     all_hit: float | None = None) -> float:
    """Theorem 7: SSD over autoregressive, latencies in units of one target verify pass.

    [p_hit E_hit + (1 - p_hit) E_miss] / [p_hit max(1, T_p) + (1 - p_hit)(1 + T_b)]: after a hit the next draft is
    ready as soon as both the verify pass and the pre-speculation (T_p) end; after a miss the backup (T_b) drafts
    after the verify pass. At batch size b the round waits for the backup unless every sequence hit, so the
    denominator's weights are the all-hit rate (PAPER.md's batch form, with p_hit^b measured rather than assumed).
    """
    free = p_hit if all_hit is None else all_hit
    return (p_hit * e_hit + (1 - p_hit) * e_miss) / (free * max(1.0, t_p) + (1 - free) * (1 + t_b))


def pipelined_speedup(p_hit: float, e_hit: float, e_miss: float, t_p: float, t_b: float,
                      all_hit: float | None = None) -> float:
    """Theorem 7 for a drafter that finishes its pre-speculation before it reads the outcome, as
    ``ssd.pipeline.protocol``'s does: a miss then waits for it too.

    [p_hit E_hit + (1 - p_hit) E_miss] / [max(1, T_p) + (1 - p_hit) T_b]. While T_p <= 1 this is
    ``theorem7_speedup``; beyond, a miss costs max(1, T_p) + T_b verify passes, where Theorem 7 charges 1 + T_b as if
    the drafter left its tree the moment the outcome came. Over the pipeline's (K, B) grid on 16 HumanEval prompts,
    measured over predicted stayed as even past T_p = 1 as below it with this form; Theorem 7 ran up to 8% high there.
    At batch size b the backup's wait is charged to every round in which some sequence missed: (1 - all_hit) T_b.
    """
    waits = 1 - (p_hit if all_hit is None else all_hit)
    return (p_hit * e_hit + (1 - p_hit) * e_miss) / (max(1.0, t_p) + waits * t_b)


def critical_batch_size(p_hit: float, e_hit: float, e_miss_jit: float, e_miss_fast: float, t_p: float,
                        t_b: float) -> int | None:
    """b*: the smallest batch size at which the fast backup's pipelined tokens per verify pass reach the jit
    backup's, with the latencies held at these values (a profile at each b moves them; compare the two predictions
    there for the full picture). None: the jit backup stays ahead at every b.

    With N = p_hit E_hit + (1 - p_hit) E_miss for each backup and M = max(1, T_p), the fast backup (nothing to wait
    for, fewer tokens after a miss) is ahead once N_fast / M >= N_jit / (M + (1 - p_hit^b) T_b), that is once
    1 - p_hit^b >= theta = M (N_jit - N_fast) / (N_fast T_b): the round waits more often as b grows, and the jit
    backup's extra tokens stop paying for it. This is the paper's Theorem 17 (a critical b* exists; the draft model
    is the better backup below it) in the form of this kit's pipeline.
    """
    n_jit = p_hit * e_hit + (1 - p_hit) * e_miss_jit
    n_fast = p_hit * e_hit + (1 - p_hit) * e_miss_fast
    if n_fast >= n_jit:
        return 1  # the fast backup gives as many tokens and never waits
    if t_b <= 0 or n_fast <= 0:
        return None  # a jit backup that costs nothing, or a fast one that gives nothing
    theta = max(1.0, t_p) * (n_jit - n_fast) / (n_fast * t_b)
    if theta >= 1:
        return None  # even a round that always waits is worth the jit draft's extra tokens
    if p_hit <= 0:
        return 1  # every round waits from b = 1 on
    return max(1, math.ceil(math.log(1 - theta) / math.log(p_hit) - 1e-12))


def theorem7_from_profile(profile, k: int, budget: int, p_hit: float, e_hit: float, e_miss: float,
                          backup: str = "jit", all_hit: float | None = None) -> dict:
    """Theorem 7 with its latencies read off a latency profile (ssd.bench.profile) instead of the run's own rounds, in
    the form of this kit's pipeline (``pipelined_speedup``: the drafter finishes pre-speculating before a miss's
    backup).

    One round's verify pass is the target's pass over K + 1 tokens on the verifier's cores; pre-speculation after a
    hit is SSD's glue step (the draft's logits after t* and the K cached tokens) and K depths of the tree over B
    branch rows on the drafter's cores (T_p); a jit backup is K one-token draft steps (T_b), a fast backup costs
    nothing. The hit rate and tokens per round come from the run.
    A profile at batch size b (``profile.batch_size``: every curve timed over b rows) prices a round of b sequences:
    all_hit is then the rate at which all of them hit (None: p_hit, one sequence), and tokens/s is the batch's total.
    Returns T_p, T_b, tokens per verify pass per sequence and the steady-state tokens/s they predict (no prompt pass
    included: hold it against decode tokens/s).
    """
    verify_ms = profile.target_at(k + 1)
    t_p = (profile.glue_at(k + 1) + k * profile.draft_at(max(budget, 1))) / verify_ms
    t_b = k * profile.draft_at(1) / verify_ms if backup == "jit" else 0.0
    per_verify = pipelined_speedup(p_hit, e_hit, e_miss, t_p, t_b, all_hit)
    return {"profile_t_p": t_p, "profile_t_b": t_b, "profile_tokens_per_verify": per_verify,
            "profile_tokens_per_s": batch_size(profile) * per_verify / verify_ms * 1000}


def sd_from_profile(profile, k: int, e: float, draft_pass: bool = False) -> dict:
    """SD's speed-up over AR at the profile's batch size: E / (c K + v) with E the tokens a round yields per sequence
    (measured), c a draft step over a target step and v a verify pass over K + 1 tokens per sequence in target steps,
    all timed over the profile's b rows (so v grows with b once a pass over b (K + 1) tokens stops costing one
    step). The profile times one core per model; SD runs both on two, so the ratio, not the rate, carries over.
    draft_pass: a round also runs the draft over the K + 1 tokens verified (llama.cpp's drafter does, to keep its
    cache in step; the kit's feeds its draft only the tokens it has not seen), g target steps (the glue curve at
    K + 1): E / (c K + g + v)."""
    step = profile.target_at(1)
    c, v = profile.draft_at(1) / step, profile.target_at(k + 1) / step
    g = profile.glue_at(k + 1) / step if draft_pass else 0.0
    return {"profile_c": c, "profile_v": v, **({"profile_g": g} if draft_pass else {}),
            "profile_speedup_vs_ar": e / (c * k + g + v)}


def batch_size(latencies) -> int:
    """The rows a set of latencies was timed over: a profile's batch_size; 1 for anything else with the three curves
    (``ssd.core.tuning`` takes any such object)."""
    return getattr(latencies, "batch_size", 1)
