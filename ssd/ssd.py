"""Single-process SSD (Kumar, Dao & May, Alg. 1): pre-speculate every predicted outcome, look up, back up on a miss.

Per round: the draft for this round (x_1..x_K and its q) is ready. Before the target verifies it, the draft model
*pre-speculates*: for every predicted outcome (k, t) it drafts the next round's K tokens, all branches of one depth
in one forward over a token tree (shared prefix KV, one 4D attention mask). On two devices this overlaps the verify
pass (``ssd.pipeline``); here the phases run one after the other and the trace times each, so Theorem 7 can say
what the overlap would give. After verification, a hit takes the next draft from the cache: the draft phase is
skipped. A miss calls a backup: ``jit`` (the draft model drafts now, as SD does) or ``fast`` (an n-gram proposal
from the context, verified as q = one-hot, so it stays lossless).

Randomness: each round draws the same uniforms whatever happens (K for drafting the next round, K + 1 for verify).
All branches and the jit backup share the next round's K draft uniforms, so the draft of round r + 1 is the same
tokens whether it came from the cache or from the jit backup. With the jit backup and C = 1 the trajectory is then
independent of the budget B, which is what makes the counterfactual hit rates of ``counterfactual_hits`` exact.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import torch

from .cache import SpeculationCache
from .cached_model import CachedModel
from .decoding import Checked, DecodeConfig, Verifier, check_prompt
from .outcomes import Calibrator, allocate, candidates, check_budget, check_strategy, rank_of
from .proposers import Draft, DraftModelProposer, NgramProposer, Proposer
from .sampling import check_saguaro_c, uniforms
from .names import BACKUPS
from .trace import SSDRound, Stopwatch, Trace
from .tuning import carried_calibrator, is_auto, on_auto, ssd_tuner, with_latencies
from .tree import draft_tree, saguaro_q
from .verify import Verdict

BACKUP_OF = {"draft": "jit", "ngram": "fast"}  # the backup each proposer's drafts come from, by Draft.source


@dataclass
class SSDConfig(DecodeConfig):
    budget: int | str = 16  # B: cached outcomes per round, over all positions; "auto": chosen with K (ssd.tuning)
    fan_out_strategy: str = "uniform"  # how B is spread over the positions: uniform | geometric | calibrated
    saguaro_c: float = 1.0  # C of Saguaro sampling; 1 = plain sampling
    backup: str = "jit"  # jit | fast
    # a_p (DecodeConfig's): geometric's acceptance rate; calibrated's prior, and auto's
    r: float = 0.5  # geometric: the power-law exponent of the miss rate; calibrated: its prior
    ngram: int = 3  # fast backup: the longest n-gram matched in the context

    def __post_init__(self):
        super().__post_init__()
        if not is_auto(self.budget):
            check_budget(self.budget)
        check_strategy(self.fan_out_strategy)
        self.saguaro_c = check_saguaro_c(self.saguaro_c)
        if self.backup not in BACKUPS:
            raise ValueError(f"backup must be one of {', '.join(BACKUPS)}; got {self.backup!r}")
        if not self.r > 0:
            raise ValueError(f"r must be > 0, got {self.r}")
        if not (isinstance(self.ngram, int) and self.ngram >= 1):
            raise ValueError(f"ngram must be an integer >= 1, got {self.ngram!r}")


def check_ssd_config(config, method: str = "ssd") -> None:
    """The SSD methods need the SSD fields (budget, fan-out, C, backup); a plain DecodeConfig lacks them."""
    if not isinstance(config, SSDConfig):
        raise ValueError(f"config must be an SSDConfig for {method}, got {type(config).__name__}")


# ---- drafting ------------------------------------------------------------------------------------------------------


class SaguaroDrafter(DraftModelProposer):
    """The draft model drafting for SSD: the jit backup, and the owner of the draft's KV cache, which the tree
    pre-speculation extends and rolls back. Its q is Saguaro's for `fan_out`, the F_0..F_K of the round its drafts
    are for, which the Speculator sets each round."""

    def __init__(self, model, prompt_ids: list[int], config: SSDConfig):
        super().__init__(model, prompt_ids, config.temperature)
        self.c = config.saguaro_c
        self.fan_out: tuple[int, ...] = ()

    def distribution(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        return saguaro_q(logits, self.temperature, self.fan_out[position], self.c)


def branch_drafts(draft: CachedModel, tokens: list[int], block: Draft, u: torch.Tensor, temperature: float,
                  c: float, fan_out) -> tuple[dict, torch.Tensor]:
    """The next round's draft for every predicted outcome of `block`'s round, drafted after `tokens`.

    Returns the drafts by outcome and the [K + 1, V] draft logits that rank the candidates at positions 0..K (the
    last row, after x_K, costs the one extra "glue" forward).
    """
    K = len(block.tokens)
    # The glue step: feed the draft (all of it if it was a lookup, whose logits we lack) and look one past it.
    glue = draft.logits(tokens + block.tokens, keep=1 if block.logits is not None else K + 1)  # [1 or K + 1, V]
    rows = glue if block.logits is None else torch.cat([block.logits, glue])  # [K + 1, V]
    outcomes = [
        (k, t)
        for k in range(K + 1)
        for t in candidates(rows[k], block.fan_out[k], exclude=block.tokens[k] if k < K else None)
    ]
    if not outcomes:
        return {}, rows
    drafts = draft_tree(draft, len(tokens), outcomes, u, temperature, c, fan_out)
    return dict(zip(outcomes, drafts)), rows


# ---- SSD's proposer ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lookup:
    """What the cache made of one round's outcome."""

    hit: bool  # the outcome (k, t*) was cached
    rank: int | None  # rank of t* among the candidates at position k; None where nothing was ranked


class Speculator(Proposer):
    """SSD's proposer: the speculation cache with a backup, fed by pre-speculation.

    A round: ``propose`` hands out the draft (from the cache after a hit, else from the backup); while the target
    verifies it, ``prespeculate`` drafts the next round for every predicted outcome; ``observe`` commits the outcome
    and looks it up (``last_lookup`` then says hit or miss). It always drafts K tokens and hands out the first k
    (fewer near max_new_tokens): the cache is filled for the whole draft. K and B are its tuner's (``ssd.tuning``):
    the configured ones, or on auto re-decided as the run goes from the calibrator's estimates (carried over the
    answers of the process: ``ssd.tuning.carried_calibrator``); a new K applies from
    the next round's uniforms (``k``), a new B from the next pre-speculation's fan-out. It lives wherever the draft
    model lives: beside the verifier in ``generate_ssd``, on its own device in ``ssd.protocol``.
    """

    def __init__(self, draft_model, prompt_ids: list[int], config: SSDConfig, vocab_size: int):
        # No Proposer.__init__: the committed tokens are the drafter's (``tokens`` below), kept in one place.
        self.config = config
        self.drafter = SaguaroDrafter(draft_model, prompt_ids, config)
        self.backup = (self.drafter if config.backup == "jit" else
                       NgramProposer(prompt_ids, vocab_size, config.ngram, device=self.drafter.model.device))
        self.cache = SpeculationCache()
        if on_auto(config):  # the estimates the process's last answer on these settings left (ssd.tuning)
            self.calibrator = carried_calibrator(draft_model, config)
        elif config.fan_out_strategy == "calibrated":
            self.calibrator = Calibrator(prior_a_p=config.a_p, prior_r=config.r)
        else:
            self.calibrator = None
        self.tuner = ssd_tuner(config, self.calibrator)
        self.f_next = self.next_fan_out(self.k)  # the F_0..F_K the drafts made now are for
        self.block: Draft | None = None  # the whole K-token draft of the round being verified
        self.found: Draft | None = None  # the cached draft for the last outcome, if it hit
        self.rank_rows = None  # [K + 1, V] draft logits ranking the candidates of the round being verified
        self.last_lookup: Lookup | None = None  # what the cache made of the last outcome

    @property
    def model(self) -> CachedModel:
        return self.drafter.model

    @property
    def tokens(self) -> list[int]:
        """The committed tokens: the drafter's copy, which its observe advances."""
        return self.drafter.tokens

    @property
    def k(self) -> int:
        """K of the next round's drafts: how many draft uniforms the next round draws."""
        return self.tuner.k

    def next_fan_out(self, k: int) -> tuple[int, ...]:
        """F_0..F_K of a round of K drafted tokens, from the strategy, the tuner's B and, calibrated, the estimates."""
        c = self.config
        return tuple(allocate(c.fan_out_strategy, self.tuner.budget, k, a_p=c.a_p, r=c.r, calibrator=self.calibrator))

    def estimates(self) -> tuple[float, float]:
        """The a_p and r the fan-out strategy uses now."""
        if self.config.fan_out_strategy == "calibrated":
            return self.calibrator.a_p, self.calibrator.r
        return self.config.a_p, self.config.r

    def propose(self, k: int, u: torch.Tensor) -> Draft:
        """The next draft: the cached one after a hit, else the backup's, drafted with u ([K] uniforms)."""
        if self.found is not None:
            self.block = self.found
        else:
            self.drafter.fan_out = self.f_next
            self.block = replace(self.backup.propose(len(u), u), fan_out=self.f_next)
        return self.block.truncated(k)

    def prespeculate(self, u: torch.Tensor) -> None:
        """Fill the cache with the next round's draft for every predicted outcome of this round (u: [K] uniforms,
        the ones a backup would draft the next round with)."""
        self.f_next = self.next_fan_out(len(u))
        entries, self.rank_rows = {}, None
        if sum(self.block.fan_out) > 0:  # the candidates of this round's outcomes
            entries, self.rank_rows = branch_drafts(self.model, self.tokens, self.block, u, self.config.temperature,
                                                    self.config.saguaro_c, self.f_next)
        self.cache.fill(entries)

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        """Commit the outcome (k, t*), learn from it (calibrated fan-out) and look it up in the cache."""
        k, t_star = verdict.outcome
        rank = None
        if self.rank_rows is not None:
            excluded = self.block.tokens[k] if k < len(self.block.tokens) else None
            rank = rank_of(t_star, self.rank_rows[k], excluded) if t_star != excluded else None
        if self.calibrator:
            self.calibrator.update(k, verdict.draft_len, rank)
        self.tuner.step()
        self.drafter.observe(draft, verdict)
        if self.backup is not self.drafter:
            self.backup.observe(draft, verdict)
        self.found = self.cache.lookup(verdict.outcome) if sum(self.block.fan_out) > 0 else None
        self.last_lookup = Lookup(hit=self.found is not None, rank=rank)


def round_uniforms(generator: torch.Generator, k: int, draft_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each round draws K uniforms to draft the next round and draft_len + 1 to verify this one, whatever happens:
    the stream, and so the tokens, do not depend on hits, budget or fan-out (and two ranks can share it)."""
    return uniforms(k, generator), uniforms(draft_len + 1, generator)


def generate_ssd(pair, prompt_ids, config: SSDConfig, generator: torch.Generator):
    """SSD in one process. Lossless: every round is verified exactly as in SD, against the q it was drawn from."""
    check_ssd_config(config)
    prompt_ids = check_prompt(pair, prompt_ids, config)
    config = with_latencies(pair, config)
    speculator = Speculator(pair.draft, prompt_ids, config, pair.vocab_size)
    verifier = Verifier(pair.target, prompt_ids, config, pair.eos_token_ids)
    trace, watch = Trace("ssd", prompt_len=len(prompt_ids)), Stopwatch()
    with watch.whole(trace):
        watch.prefill(trace, prompt_ids, verifier.target, speculator.model)
        draft = speculator.propose(verifier.room(), uniforms(speculator.k, generator))
        done = False
        while not done:
            u_draft, u_verify = round_uniforms(generator, speculator.k, len(draft.tokens))
            a_p, r = speculator.estimates()
            with watch("prespec_s"):
                speculator.prespeculate(u_draft)  # on two devices this overlaps the verify pass below
            with watch("verify_s"):
                checked = verifier.check(draft, u_verify)
            done = checked.done
            with watch("draft_s"):  # the lookup, and the backup after a miss
                speculator.observe(draft, checked.verdict)
                following = None if done else speculator.propose(verifier.room(), u_draft)
            lookup = speculator.last_lookup
            trace.rounds.append(ssd_round(checked, lookup, draft, following, a_p, r, **watch.take()))
            draft = following
    return verifier.new, trace


def backup_used(following: Draft | None) -> str | None:
    """The backup that drafted the next round after a miss ("jit" or "fast"); None after a hit or the last round."""
    return None if following is None or following.source == "cache" else BACKUP_OF[following.source]


def ssd_round(checked: Checked, lookup: Lookup, draft: Draft, following: Draft | None, a_p: float, r: float,
              **seconds) -> SSDRound:
    """The trace's record of one SSD round; `following` is the next round's draft (None after the last)."""
    v = checked.verdict
    return SSDRound(draft_len=v.draft_len, accepted=v.accepted, token=v.token, new_tokens=len(checked.emitted),
                    hit=lookup.hit, rank=lookup.rank, fan_out=draft.fan_out, budget=sum(draft.fan_out), a_p=a_p, r=r,
                    backup=backup_used(following), **seconds)


# ---- counterfactual hit rates ------------------------------------------------------------------------------------


def counterfactual_hits(rounds: pd.DataFrame, budgets, k: int, strategy: str, a_p: float = 0.6, r: float = 0.5,
                        ) -> pd.DataFrame:
    """Would each round have hit at budget B under a fan-out strategy? One run gives the whole curve.

    A round hits iff the rank of t* among the candidates at its position is within F_k. When the trajectory does
    not depend on what is cached -- the jit backup with C = 1, see the module docstring -- the ranks a run records
    are those of a run at any other budget or strategy, so one run at any B > 0 answers for every B and every
    strategy: uniform; geometric with the given a_p and r; calibrated, its estimates replayed from the recorded k and
    ranks, starting from the prior (a_p, r). With Saguaro C < 1 the draft distribution depends on the cached sets,
    and with the fast backup a miss changes the next draft: there each B is its own run.

    rounds: SSD rounds of one or more runs (each run starts at round 0). Returns one row per (run, round, budget)
    with columns run, round, budget, hit.
    """
    check_strategy(strategy)

    def fan_outs(calibrator) -> dict[int, list[int]]:
        return {b: allocate(strategy, b, k, a_p=a_p, r=r, calibrator=calibrator) for b in budgets}

    rows, run, calibrator, planned = [], -1, None, {}
    for row in rounds.itertuples():
        if row.round == 0:
            run, calibrator = run + 1, Calibrator(prior_a_p=a_p, prior_r=r)
            planned = fan_outs(calibrator)
        # Round r's fan-out was chosen while round r - 1 was being verified (its pre-speculation): from the rounds
        # before r - 1, as in generate_ssd.
        current, planned = planned, fan_outs(calibrator)
        rank = None if pd.isna(row.rank) else int(row.rank)
        for b in budgets:
            hit = rank is not None and rank <= current[b][row.accepted]
            rows.append({"run": run, "round": row.round, "budget": b, "hit": hit})
        calibrator.update(row.accepted, row.draft_len, rank)
    return pd.DataFrame(rows)
