"""Closed forms: tokens per round, SD's speedup, Theorem 7 for SSD, and Theorem 7 fed by a measured trace."""
from __future__ import annotations

import pandas as pd


def expected_tokens(a: float, k: int) -> float:
    """E = (1 - a^(K+1)) / (1 - a): expected tokens per round at per-token acceptance rate a."""
    return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def sd_speedup(a: float, k: int, c: float, v: float = 1.0) -> float:
    """SD over autoregressive: E / (c K + v), with c the draft/target cost ratio per token and v the cost of a verify
    pass over K + 1 tokens in one-token steps (about 1 on a GPU; measure it: ssd.profile)."""
    return expected_tokens(a, k) / (c * k + v)


def theorem7_speedup(p_hit: float, e_hit: float, e_miss: float, t_p: float, t_b: float) -> float:
    """Theorem 7: SSD over autoregressive, latencies in units of one target verify pass.

    [p_hit E_hit + (1 - p_hit) E_miss] / [p_hit max(1, T_p) + (1 - p_hit)(1 + T_b)]: after a hit the next draft is
    ready as soon as both the verify pass and the pre-speculation (T_p) end; after a miss the backup (T_b) drafts
    after the verify pass.
    """
    return (p_hit * e_hit + (1 - p_hit) * e_miss) / (p_hit * max(1.0, t_p) + (1 - p_hit) * (1 + t_b))


def pipelined_speedup(p_hit: float, e_hit: float, e_miss: float, t_p: float, t_b: float) -> float:
    """Theorem 7 for a drafter that finishes its pre-speculation before it reads the outcome, as ``ssd.protocol``'s
    does: a miss then waits for it too.

    [p_hit E_hit + (1 - p_hit) E_miss] / [max(1, T_p) + (1 - p_hit) T_b]. While T_p <= 1 this is
    ``theorem7_speedup``; beyond, a miss costs max(1, T_p) + T_b verify passes, where Theorem 7 charges 1 + T_b as if
    the drafter left its tree the moment the outcome came. Over the pipeline's (K, B) grid on 16 HumanEval prompts,
    measured over predicted stayed as even past T_p = 1 as below it with this form; Theorem 7 ran up to 8% high there.
    """
    return (p_hit * e_hit + (1 - p_hit) * e_miss) / (max(1.0, t_p) + (1 - p_hit) * t_b)


def measured_theorem7(rounds: pd.DataFrame, ar_step_s: float | None = None) -> dict:
    """Theorem 7 with every input measured on SSD rounds (one frame, or several runs concatenated).

    E_hit / E_miss are the tokens of rounds whose draft came from a hit / a backup; T_p and T_b the mean
    pre-speculation and backup times over the mean verify time of rounds after the first (whose pass also processes
    the prompt). The theorem counts time in verify passes, which on
    a GPU cost about one autoregressive step; on a CPU a pass over K + 1 tokens costs more, so the speedup over AR
    is rescaled by ar_step_s / verify_s.
    """
    previous_hit = rounds.groupby(rounds["round"].eq(0).cumsum())["hit"].shift(1, fill_value=False).astype(bool)
    # A run's first verify pass also processes the whole prompt: leave it out of the cost of one verify pass.
    decode = rounds[rounds["round"] > 0] if (rounds["round"] > 0).any() else rounds
    verify_s = decode["verify_s"].mean()
    backups = rounds.loc[rounds["backup"].notna(), "draft_s"]
    out = {
        "p_hit": float(rounds["hit"].astype(bool).mean()),
        "e_hit": float(rounds.loc[previous_hit, "new_tokens"].mean()) if previous_hit.any() else 0.0,
        "e_miss": float(rounds.loc[~previous_hit, "new_tokens"].mean()),
        "t_p": float(rounds["prespec_s"].mean() / verify_s),
        "t_b": float(backups.mean() / verify_s) if len(backups) else 0.0,
        "verify_s": float(verify_s),
    }
    out["tokens_per_verify"] = theorem7_speedup(out["p_hit"], out["e_hit"], out["e_miss"], out["t_p"], out["t_b"])
    out["predicted_speedup_vs_ar"] = out["tokens_per_verify"] * ar_step_s / verify_s if ar_step_s else None
    return out


def theorem7_from_profile(profile, k: int, budget: int, p_hit: float, e_hit: float, e_miss: float,
                          backup: str = "jit") -> dict:
    """Theorem 7 with its latencies read off a latency profile (ssd.profile) instead of the run's own rounds, in the
    form of this kit's pipeline (``pipelined_speedup``: the drafter finishes pre-speculating before a miss's backup).

    One round's verify pass is the target's pass over K + 1 tokens on the verifier's cores; pre-speculation after a
    hit is SSD's glue step (the draft's logits after t* and the K cached tokens) and K depths of the tree over B
    branch rows on the drafter's cores (T_p); a jit backup is K one-token draft steps (T_b), a fast backup costs
    nothing. The hit rate and tokens per round come from the run.
    Returns T_p, T_b, tokens per verify pass and the steady-state tokens/s they predict (no prompt pass included:
    hold it against decode tokens/s).
    """
    verify_ms = profile.target_at(k + 1)
    t_p = (profile.glue_at(k + 1) + k * profile.draft_at(max(budget, 1))) / verify_ms
    t_b = k * profile.draft_at(1) / verify_ms if backup == "jit" else 0.0
    per_verify = pipelined_speedup(p_hit, e_hit, e_miss, t_p, t_b)
    return {"profile_t_p": t_p, "profile_t_b": t_b, "profile_tokens_per_verify": per_verify,
            "profile_tokens_per_s": per_verify / verify_ms * 1000}
