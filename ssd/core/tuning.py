"""Choosing K (and B) for the machine: the draft length and budget that maximise predicted tokens per second.

The predictions combine the closed forms of ``ssd.core.theory`` with measured latencies, anything with the three curves
of a ``ssd.core.latencies.Profile``: ``target_at(n)``, the ms of a verify pass over n tokens; ``draft_at(n)``, the ms of
one depth of the pre-speculation tree over n rows, draws included (1: a draft step); ``glue_at(n)``, SSD's glue
step over n new tokens (the draft's logits after them).

- SD (Leviathan et al., Sec. 3): a round drafts K tokens and verifies K + 1 in one pass, and yields
  E = (1 - a^(K+1)) / (1 - a) tokens: K maximises E / (K draft_at(1) + target_at(K + 1)).
- SSD (Theorem 7, in the form of this kit's pipeline: ``ssd.core.theory.pipelined_speedup``): the hit rate a budget B
  buys follows from the outcome probabilities P(k) at acceptance rate a_p, the fan-out F_0..F_K a strategy gives B,
  and the miss rate at each kind of position (``ssd.core.fan_out.MissModel``); pre-speculation costs a glue step over
  the K + 1 tokens a hit leaves unfed and K tree depths over B rows, a jit backup K one-token steps.

- SSD's backup (``--backup auto``): the jit one or the fast one, whichever Theorem 7 at the latencies' batch size b
  predicts faster (a round waits for a jit draft unless all b sequences hit, p_hit^b; a fast miss yields the tokens
  ``Calibrator.fast_tokens`` learnt from the n-gram proposals scored at each miss). See docs/tuning.md.

``Tuner`` puts the choice into a run (``--k auto``, ``--budget auto``, ``--backup auto``): decided before the first
round from a stated prior (acceptance rate ``a_p`` of the config, weighing ``PRIOR_WEIGHT`` tested tokens for SD and
the calibrator's 8 for SSD, and the calibrator's prior miss rates), then again every ``EVERY`` rounds from the run's
own estimates (the acceptance rate, and for SSD the miss rate at each kind of position), so a prompt that moves from
code to prose moves its K and B. The latencies are the profile's (``ssd.bench.profile.cached_profile``: measured once
per machine, pair, precision and core set, then read from the user cache), not the run's own clock: the choices then
depend only on the tokens. The caller fetches them before the run and passes them in an ``Autotune``: a decoding loop
never profiles.

SSD on auto carries its estimates over answers (``Autotune.calibrator``): an answer starts where the last one run with
the same Autotune and settings left them, only the first from the prior. A dozen rounds of
one answer teach a_p but hardly the miss-rate tables, so a tuner that began every answer from the prior spent its
first rounds at the prior's (K, B): replaying the recorded rounds of 16 HumanEval prompts, its choices scored 0.95 of
the best on the set's steady-state surface, carried 0.98, and with the longer memory and heavier prior below 0.998.
With K and B configured (the backup alone on auto) only the choice of backup reads them; the calibrated fan-out
reads the answer's own, as a fixed backup's run does (``ssd.core.speculation.Speculator._estimates``).
SD's tuner reads a_p alone, which an answer's own rounds teach: it starts every answer from the prior. At temperature
0 the tokens are the target's either way; at T > 0 a seed gives the same output for the same sequence of calls with
one Autotune (a new Autotune starts the sequence again).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..checks import is_auto
from .fan_out import Calibrator, MissModel, PowerLaw, allocate, marginal_fan_out, outcome_probabilities, position_kind
from .theory import all_hit_rate, batch_size, expected_tokens, theorem7_from_profile

SD_KS = (1, 2, 3, 4, 5, 6, 7, 8)
SSD_KS = (1, 2, 3, 4, 5, 6, 7, 8)
BUDGETS = (1, 2, 4, 8, 16, 32)
EVERY = 1  # rounds between two decisions: an answer of 48 tokens has only a dozen rounds to move K in
# With K or B on auto the prior a_p counts as this many tested tokens (the calibrator's default is 8): a dozen rounds
# must be enough to carry K from the prior's choice to the text's.
PRIOR_WEIGHT = 1.0
MEMORY = 0.9  # and the acceptance rate follows about the last ten rounds (Calibrator.memory), so K follows the text
# SSD's estimates, carried over answers, follow about the last fifty rounds (four answers of 48 tokens on code): its
# predicted best (K, B) lies on a ridge that moves with a_p, and an estimate over a dozen rounds walked the ridge (on
# code from K 4, B 4 to K 7, B 1 after a few all-accepted rounds, and missed); replaying the recorded rounds, 0.9 put
# over half of the choices on code off its best (K 4, B 4), 0.98 under a third (with the prior at 8 tokens, a tenth).
CARRIED_MEMORY = 0.98
RANK_WINDOW = 1000  # and its miss rates the last this many ranks of each kind (Calibrator.window)


@dataclass(frozen=True)
class Choice:
    """The best candidate and what it is predicted to give."""

    k: int
    budget: int | None  # None for SD
    tokens_per_s: float | None  # predicted decode tokens per second (None: configured, not chosen)
    p_hit: float | None = None  # SSD: the predicted hit rate at this (K, B)
    backup: str | None = None  # SSD: the backup after a miss, "jit" or "fast" (None for SD)


def _check_rate(value: float, name: str) -> float:
    if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"{name} must lie in [0, 1], got {value!r}")
    return float(value)


def _check_candidates(values, name: str) -> tuple[int, ...]:
    values = tuple(values)
    if not values or not all(isinstance(v, int) and v >= 1 for v in values):
        raise ValueError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
    return values


def sd_tokens_per_s(a: float, k: int, latencies) -> float:
    """SD's predicted decode tokens/s at draft length K and per-token acceptance rate a."""
    round_ms = k * latencies.draft_at(1) + latencies.target_at(k + 1)
    return expected_tokens(a, k) / round_ms * 1000


def choose_sd_k(a: float, latencies, ks=SD_KS) -> Choice:
    """The K of SD with the most predicted tokens per second (the smaller K on a tie)."""
    a, ks = _check_rate(a, "a (the acceptance rate)"), _check_candidates(ks, "ks")
    best = max(sorted(ks), key=lambda k: (sd_tokens_per_s(a, k, latencies), -k))
    return Choice(k=best, budget=None, tokens_per_s=sd_tokens_per_s(a, best, latencies))


def predicted_hit_rate(a_p: float, law: PowerLaw | MissModel, k: int, budget: int, strategy: str = "geometric",
                       r: float | None = None) -> float:
    """P(hit) = sum over outcomes k of P(k) (1 - miss_k(F_k)), miss_k the miss rate at that kind of position (one
    power law for both, or a calibrator's ``MissModel``) and F_k the fan-out the strategy gives B (geometric's r: the
    given one, else the power law's; calibrated spreads B by the same miss rates)."""
    model = MissModel.from_law(law) if isinstance(law, PowerLaw) else law
    if strategy == "calibrated":
        fan_out = marginal_fan_out(budget, k, a_p, model)
    else:
        if r is None and not isinstance(law, PowerLaw):
            raise ValueError("r is needed for the geometric fan-out when law is a MissModel")
        fan_out = allocate(strategy, budget, k, a_p=a_p, r=law.r if r is None else r)
    probs = outcome_probabilities(k, a_p)
    return sum(p * (1.0 - model.at(position_kind(j, k), f)) for j, (p, f) in enumerate(zip(probs, fan_out)))


def backups_of(backup: str) -> tuple[str, ...]:
    """The backups a choice weighs: both on auto, else the configured one."""
    return ("jit", "fast") if is_auto(backup) else (backup,)


def ssd_tokens_per_s(a_p: float, law: PowerLaw | MissModel, k: int, budget: int, latencies, *,
                     strategy: str = "geometric", backup: str = "jit", r: float | None = None,
                     fast_tokens: Callable[[int], float] | None = None) -> tuple[float, float]:
    """SSD's predicted steady-state decode tokens/s at (K, B) with this backup, and the hit rate behind it (Theorem 7
    at the latencies' batch size b: a round waits for a jit backup unless all b sequences hit, p_hit^b).

    A hit and a jit miss both yield a round the draft model drafted, E(a_p, K) tokens; a fast miss yields
    fast_tokens(K) (``Calibrator.fast_tokens``; None: E too, the fast backup's best case).
    """
    p_hit = predicted_hit_rate(a_p, law, k, budget, strategy, r)
    e = expected_tokens(a_p, k)
    e_miss = fast_tokens(k) if backup == "fast" and fast_tokens is not None else e
    predicted = theorem7_from_profile(latencies, k, budget, p_hit, e, e_miss, backup,
                                      all_hit_rate(p_hit, batch_size(latencies)))
    return predicted["profile_tokens_per_s"], p_hit


def ssd_scores(a_p: float, law: PowerLaw | MissModel, latencies, ks, budgets, backup: str = "jit",
                **options) -> dict:
    """{(K, B, backup): (predicted tokens/s, hit rate)} over the candidates, K then B ascending, jit before fast."""
    a_p = _check_rate(a_p, "a_p (the acceptance rate)")
    ks, budgets = _check_candidates(ks, "ks"), _check_candidates(budgets, "budgets")
    return {(k, b, one): ssd_tokens_per_s(a_p, law, k, b, latencies, backup=one, **options)
            for k in sorted(ks) for b in sorted(budgets) for one in backups_of(backup)}


def choose_ssd_k_budget(a_p: float, law: PowerLaw | MissModel, latencies, ks=SSD_KS, budgets=BUDGETS, *,
                        strategy: str = "geometric", backup: str = "jit", r: float | None = None,
                        fast_tokens: Callable[[int], float] | None = None) -> Choice:
    """The (K, B) of SSD, and on backup="auto" the backup, with the most predicted tokens per second (the smaller K,
    then B, then the jit backup on a tie)."""
    scored = ssd_scores(a_p, law, latencies, ks, budgets, backup, strategy=strategy, r=r, fast_tokens=fast_tokens)
    best = max(scored, key=lambda key: scored[key][0])  # ascending K, B, jit first: max keeps the first of the best
    k, b, backup = best
    return Choice(k=k, budget=b, tokens_per_s=scored[best][0], p_hit=scored[best][1], backup=backup)


# ---- in a run ------------------------------------------------------------------------------------------------------


def on_auto(config) -> bool:
    """Whether the config leaves K, or B or the backup (where it has them), to the tuner."""
    return any(is_auto(value) for value in (config.k, getattr(config, "budget", None), getattr(config, "backup", None)))


class Tuner:
    """The K (and B) of a run's rounds: `decide` once before the first round, then again after every `every`
    rounds, each time from the estimates of that moment. With nothing on auto it keeps the configured values."""

    def __init__(self, decide: Callable[[], Choice], every: int | None = None):
        every = EVERY if every is None else every
        if not (isinstance(every, int) and every >= 1):
            raise ValueError(f"every (rounds between decisions) must be an integer >= 1, got {every!r}")
        self.decide, self.every, self.rounds = decide, every, 0
        self.choice = decide()

    @property
    def k(self) -> int:
        return self.choice.k

    @property
    def budget(self) -> int | None:
        return self.choice.budget

    def step(self) -> None:
        """A round is done: decide again if it is time."""
        self.rounds += 1
        if self.rounds % self.every == 0:
            self.choice = self.decide()


class Autotune:
    """What SD's and SSD's runs on auto learn from, held by the caller and passed to each run (``autotune=``): the
    latency profiles their choices are priced on, by the batch size b they price ({b: ``ssd.core.latencies.Profile``},
    fetched or measured beforehand: ``ssd.bench.profile.cached_profile(pair, batch_size=b)``; a decoding loop never
    profiles), and SSD's estimates carried over answers, by settings (``calibrator``).

    One Autotune kept across the answers of a bench or a notebook carries SSD's estimates from one answer to the next;
    a new one starts them again from the prior. The caller holds one per pair (the estimates are its draft's).
    """

    def __init__(self, profiles: dict | None = None):
        self.profiles = dict(profiles or {})  # {b: the latencies of a round over b rows}
        self.estimates: dict[tuple, Calibrator] = {}  # {settings: the calibrator SSD's runs on them go on updating}

    def profile(self, batch_size: int):
        """The latencies a run of this many rows is priced on."""
        if batch_size not in self.profiles:
            held = ", ".join(str(b) for b in sorted(self.profiles)) or "none"
            raise ValueError(f"autotune holds no latency profile at batch size {batch_size} (it holds {held}): add "
                             f"ssd.bench.profile.cached_profile(pair, batch_size={batch_size})")
        return self.profiles[batch_size]

    def calibrator(self, config) -> Calibrator:
        """The estimates of an SSD run on auto: those the last run on these settings left (the calibrator itself,
        which the run goes on updating), else a new one from the config's prior."""
        settings = (config.temperature, config.saguaro_c, config.a_p, config.r, config.fan_out_strategy, config.backup,
                    config.ngram, str(config.k), str(config.budget))  # not max_new_tokens: the text is the same text
        if settings not in self.estimates:
            # The prior at the calibrator's own weight (8 tested tokens), not PRIOR_WEIGHT: carried, the estimates need
            # not leave it within one answer, and at one token two accepted rounds of the bench's warm-up had put a_p
            # at 0.93 and the tuner at K 7, B 1 for the first answer.
            self.estimates[settings] = Calibrator(prior_a_p=config.a_p, prior_r=config.r, memory=CARRIED_MEMORY,
                                                  window=RANK_WINDOW)
        return self.estimates[settings]


def tuned_latencies(autotune: Autotune | None, batch_size: int):
    """The latencies a run on auto over batch_size rows is priced on: its autotune's (without one it fails at once,
    before any round)."""
    if autotune is None:
        raise ValueError(f"k, budget or backup is 'auto' but no autotune was given: pass autotune=Autotune("
                         f"{{{batch_size}: ssd.bench.profile.cached_profile(pair, batch_size={batch_size})}}) "
                         "(ssd.core.tuning.Autotune)")
    return autotune.profile(batch_size)


def sd_tuner(config, calibrator: Calibrator, latencies=None) -> Tuner:
    """SD's K: the configured one, or (k='auto') the best, priced on the latencies, from the calibrator's acceptance
    rate."""
    if not is_auto(config.k):
        return Tuner(lambda: Choice(config.k, None, None))
    _check_latencies(latencies)
    return Tuner(lambda: choose_sd_k(calibrator.a_p, latencies))


class DraftLengths:
    """SD's K for each row of a batch: the configured K, or (k="auto") each row's tuner's, priced on the latencies at
    the batch's size and re-decided from the row's own acceptance rate after every round it observes (SD reads no
    carried estimates: each answer starts from the prior a_p)."""

    def __init__(self, config, rows: int, autotune: Autotune | None = None):
        latencies = tuned_latencies(autotune, rows) if is_auto(config.k) else None  # fails before any forward
        self.calibrators = [Calibrator(prior_a_p=config.a_p, prior_weight=PRIOR_WEIGHT, memory=MEMORY)
                            for _ in range(rows)]
        self.tuners = [sd_tuner(config, calibrator, latencies) for calibrator in self.calibrators]

    def k(self, row: int) -> int:
        return self.tuners[row].k

    def observe(self, row: int, verdict) -> None:
        """Learn the row's acceptance from its round's verdict, and decide its next K."""
        self.calibrators[row].update(verdict.accepted, verdict.draft_len, None)
        self.tuners[row].step()


def ssd_tuner(config, calibrator: Calibrator, latencies=None) -> Tuner:
    """SSD's (K, B, backup): each configured, or on auto the best (Theorem 7 priced on the latencies, at their batch
    size) from the calibrator's a_p, miss rates and, for the fast backup, the tokens its n-gram proposals would have
    kept."""
    if not on_auto(config):
        return Tuner(lambda: Choice(config.k, config.budget, None, backup=config.backup))
    _check_latencies(latencies)
    ks = SSD_KS if is_auto(config.k) else (config.k,)
    budgets = BUDGETS if is_auto(config.budget) else (config.budget,)

    def decide() -> Choice:  # the miss rates are the calibrator's whatever the strategy that spends B
        # once per K, not per (K, B): each is a pass over up to RANK_WINDOW scored misses, every round and row
        fast = {k: calibrator.fast_tokens(k) for k in ks} if "fast" in backups_of(config.backup) else {}
        return choose_ssd_k_budget(calibrator.a_p, calibrator.miss_model(), latencies, ks, budgets,
                                   strategy=config.fan_out_strategy, backup=config.backup, r=config.r,
                                   fast_tokens=fast.__getitem__)
    return Tuner(decide)


def _check_latencies(latencies) -> None:
    if latencies is None:
        raise ValueError("k, budget or backup is 'auto' but no latencies were given: pass the profile the choice is "
                         "priced on (ssd.core.tuning.Autotune.profile)")
