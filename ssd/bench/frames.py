"""The kit's records as pandas tables: a trace's rounds and its timed spans, a profile's latency curves, and the
tuner's predictions over K (and B). The algorithm (``ssd.core``) keeps plain records; the bench, the analysis and the
notebooks read them as tables through here."""
from __future__ import annotations

from dataclasses import asdict
from typing import Callable

import pandas as pd

from ..core.latencies import Profile
from ..core.fan_out import MissModel, PowerLaw
from ..core.trace import Round, Trace
from ..core.tuning import BUDGETS, SD_KS, SSD_KS, sd_tokens_per_s, ssd_scores
from ..core.verify import target_token_role

# The lane of a timeline each phase runs in: the target's (the pipeline's verifier, rank 0) or the draft's (its
# drafter, rank 1). "prefill_s", the prompts' pass apart from the rounds, is found only in traces stored before every
# method fed its prompts with the first round; it fed both models and is drawn on the target's lane.
LANES = {"prefill_s": "target", "verify_s": "target", "wait_s": "target", "draft_s": "draft", "prespec_s": "draft"}


def rounds_frame(trace: Trace) -> pd.DataFrame:
    """One row per round, with the method and the round index: tidy, ready to concatenate across runs."""
    rows = [{"method": trace.method, "round": i, **asdict(r)} for i, r in enumerate(trace.rounds)]
    kind = type(trace.rounds[0]) if trace.rounds else Round
    return pd.DataFrame(rows, columns=["method", "round", *kind.__dataclass_fields__])


def spans_frame(trace: Trace) -> pd.DataFrame:
    """One row per timed block, for a timeline: method, round, phase, lane (target | draft), start_s, end_s, and the
    round's hit and backup where it has them (SSD)."""
    rounds = trace.rounds
    rows = [{"method": trace.method, "round": s.round, "phase": s.phase, "lane": LANES.get(s.phase, "target"),
             "start_s": s.start_s, "end_s": s.end_s,
             "hit": _of(rounds, s.round, "hit"), "backup": _of(rounds, s.round, "backup")} for s in trace.spans]
    return pd.DataFrame(rows, columns=["method", "round", "phase", "lane", "start_s", "end_s", "hit", "backup"])


def profile_frame(profile: Profile) -> pd.DataFrame:
    """One row per (role, n) of a profile: ms, ratio to the one-token step, and the floor of that step (role glue:
    the draft's glue step, where the profile has it)."""
    return pd.DataFrame(profile.rows())


def sd_curve(a: float, latencies, ks=SD_KS) -> pd.DataFrame:
    """SD's predicted decode tokens/s at each K: one row per K (columns k, tokens_per_s)."""
    return pd.DataFrame({"k": list(ks), "tokens_per_s": [sd_tokens_per_s(a, k, latencies) for k in ks]})


def ssd_surface(a_p: float, law: PowerLaw | MissModel, latencies, ks=SSD_KS, budgets=BUDGETS, *,
                strategy: str = "calibrated", backup: str = "jit", r: float | None = None,
                fast_tokens: Callable[[int], float] | None = None) -> pd.DataFrame:
    """SSD's predicted decode tokens/s and hit rate at each (K, B) and backup (both on "auto"): one row each (columns
    k, budget, backup, tokens_per_s, p_hit), what ``ssd.core.tuning.choose_ssd_k_budget`` takes the best of."""
    scored = ssd_scores(a_p, law, latencies, ks, budgets, backup, strategy=strategy, r=r, fast_tokens=fast_tokens)
    return pd.DataFrame([{"k": k, "budget": b, "backup": one, "tokens_per_s": tps, "p_hit": p_hit}
                         for (k, b, one), (tps, p_hit) in scored.items()])


def final_rounds(rounds: pd.DataFrame) -> pd.Series:
    """Each answer's last round, in a frame that holds each answer's rounds together, in order, from round 0.

    Its lookup is moot: no round follows to use what it finds. And it misses more often than not (0.25-0.44 of
    stored runs' last rounds hit, against 0.74-0.98 of the others): its draft is cut to the room left, and with all
    of the cut draft accepted t* is most often the draft's own next token, which the cache leaves out as a
    rejected one. Counted, it biased hit rates low by 2-6 points on 64- to 128-token answers; every rate leaves it
    out."""
    after = rounds["round"].shift(-1)
    return after.isna() | after.eq(0)


def counted_lookups(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds whose lookup counts in a hit rate: all but each answer's last (``final_rounds``)."""
    return rounds[~final_rounds(rounds)]


def _of(rounds: list[Round], i: int | None, name: str):
    """Round i's field `name`, or None (the prompts' pass, a round past the end, a method without the field)."""
    return getattr(rounds[i], name, None) if i is not None and 0 <= i < len(rounds) else None


def token_roles(rounds) -> list[str]:
    """The role of each new token, round by round: "accepted", or the target's token's role (``ssd.core.verify.ROLES``).

    A round adds new_tokens tokens: the first min(accepted, new_tokens) are accepted drafted tokens, then (if the
    round was not cut before it) the target's token t*. rounds: ``rounds_frame(trace)`` or a Trace.
    """
    if isinstance(rounds, Trace):
        rounds = rounds_frame(rounds)
    missing = [c for c in ("draft_len", "accepted", "new_tokens") if c not in rounds.columns]
    if missing:
        raise ValueError(f"token_roles needs the columns draft_len, accepted, new_tokens; missing {missing}")
    roles: list[str] = []
    for i, (d, k, n) in enumerate(zip(rounds["draft_len"], rounds["accepted"], rounds["new_tokens"])):
        d, k, n = int(d), int(k), int(n)
        if not (0 <= k <= d and 0 <= n <= k + 1):
            raise ValueError(f"round {i}: need 0 <= accepted <= draft_len and 0 <= new_tokens <= accepted + 1, "
                             f"got draft_len={d}, accepted={k}, new_tokens={n}")
        roles += ["accepted"] * min(k, n)
        if n > k:
            roles.append(target_token_role(k, d))
    return roles
