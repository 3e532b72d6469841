"""Single-process SSD (Kumar, Dao & May, Alg. 1): pre-speculate every predicted outcome, look up, back up on a miss.

Per round: the draft for this round (x_1..x_K and its q) is ready. Before the target verifies it, the draft model
*pre-speculates*: for every predicted outcome (k, t) it drafts the next round's K tokens, all branches of one depth
in one forward over a token tree (shared prefix KV, one 4D attention mask). On two devices this overlaps the verify
pass (``ssd.pipeline.launch``); here the phases run one after the other and the trace times each, so Theorem 7 can say
what the overlap would give. After verification, a hit takes the next draft from the cache: the draft phase is
skipped. A miss calls a backup: ``jit`` (the draft model drafts now, as SD does), ``fast`` (an n-gram proposal
from the context, verified as q = one-hot, so it stays lossless) or ``auto``: each round the one the tuner predicts
faster at the batch size (``ssd.core.tuning``), from the profile, the hit rate and the tokens each backup's round would
give. What a fast round would give is scored at every miss, whichever backup drafted it: the n-gram proposal there
against the tokens the target went on to produce (``SequenceState.note_miss``).

Randomness: each round draws the same uniforms whatever happens (K for drafting the next round, K + 1 for verify;
``ssd.core.round.Draws``).
All branches and the jit backup share the next round's K draft uniforms, so the draft of round r + 1 is the same
tokens whether it came from the cache or from the jit backup. With the jit backup and C = 1 the trajectory is then
independent of the budget B, which is what makes the counterfactual hit rates exact
(``ssd.analysis.experiments.counterfactual_hits``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .cache import SpeculationCache
from .cached_model import CachedModel
from .decoding import DecodeConfig, Verifier, batch_traces, batchable, check_prompts
from ..checks import check_at_least, check_ssd, is_auto
from .fan_out import Calibrator, allocate, candidates, rank_of
from .proposers import Draft, DraftModelProposer, NgramProposer, Proposer, matched_prefix
from .round import DrafterSide, Draws, InProcess, VerifierSide, verify_rounds
from .trace import Unclocked
from .tuning import SSD_KS, Autotune, on_auto, ssd_tuner, tuned_latencies
from .tree import draft_tree, saguaro_q
from .verify import Verdict

FAST_HORIZON = max(SSD_KS)  # tokens of the n-gram proposal scored at a miss: enough for every K the tuner weighs


@dataclass
class SSDConfig(DecodeConfig):
    budget: int | str = 16  # B: cached outcomes per round, over all positions; "auto": chosen with K (ssd.core.tuning)
    fan_out_strategy: str = "uniform"  # how B is spread over the positions: uniform | geometric | calibrated
    saguaro_c: float = 1.0  # C of Saguaro sampling; 1 = plain sampling
    # jit | fast | auto (the one predicted faster at the batch size, re-decided each round; the command line's
    # default). jit here: a fixed backup needs no profile, and at C = 1 keeps SSD's tokens SD's, draw for draw
    backup: str = "jit"
    # a_p (DecodeConfig's): geometric's acceptance rate; calibrated's prior, and auto's
    r: float = 0.5  # geometric: the power-law exponent of the miss rate; calibrated: its prior
    ngram: int = 3  # fast backup: the longest n-gram matched in the context

    def __post_init__(self):
        super().__post_init__()
        check_ssd(self.budget, self.fan_out_strategy, self.saguaro_c, self.backup, self.r)
        check_at_least(self.ngram, "ngram")
        self.saguaro_c = float(self.saguaro_c)


def check_ssd_config(config, method: str = "ssd") -> None:
    """The SSD methods need the SSD fields (budget, fan-out, C, backup); a plain DecodeConfig lacks them."""
    if not isinstance(config, SSDConfig):
        raise ValueError(f"config must be an SSDConfig for {method}, got {type(config).__name__}")


# ---- drafting ------------------------------------------------------------------------------------------------------


class SaguaroDrafter(DraftModelProposer):
    """The draft model drafting for SSD: the jit backup, and the owner of the draft's KV cache, which the tree
    pre-speculation extends and rolls back. A row's q is Saguaro's for `fan_out[row]`, the F_0..F_K of the round its
    drafts are for, which the Speculator sets each round."""

    def __init__(self, model, prompts: list[list[int]], config: SSDConfig):
        super().__init__(model, prompts, config.temperature)
        self.c = config.saguaro_c
        self.fan_out: dict[int, tuple[int, ...]] = {}

    def distribution(self, row: int, position: int, logits: torch.Tensor) -> torch.Tensor:
        return saguaro_q(logits, self.temperature, self.fan_out[row][position], self.c)


def branch_drafts(draft: CachedModel, tokens: dict[int, list[int]], blocks: dict[int, Draft],
                  u: dict[int, torch.Tensor], temperature: float, c: float, fan_out: dict[int, tuple[int, ...]]
                  ) -> tuple[dict[int, dict], dict[int, torch.Tensor]]:
    """The next round's draft for every predicted outcome of each row's round (`blocks[row]`), drafted after
    `tokens[row]`: one glue forward and one token tree over all the rows.

    Returns, by row, the drafts by outcome and the [K + 1, V] draft logits that rank the candidates at positions
    0..K (the last row, after x_K, costs the one extra "glue" forward).
    """
    # The glue step: feed the draft (all of it if it was a lookup, whose logits we lack) and look one past it.
    glue = draft.logits({row: tokens[row] + b.tokens for row, b in blocks.items()},
                        keep={row: 1 if b.logits is not None else len(b.tokens) + 1 for row, b in blocks.items()})
    rows = {row: glue[row] if b.logits is None else torch.cat([b.logits, glue[row]]) for row, b in blocks.items()}
    outcomes = {row: _outcomes(b, rows[row]) for row, b in blocks.items()}  # [K + 1, V] ranking rows above
    outcomes = {row: branches for row, branches in outcomes.items() if branches}
    drafts = draft_tree(draft, {row: len(tokens[row]) for row in outcomes}, outcomes, u, temperature, c,
                        fan_out) if outcomes else {}
    return {row: dict(zip(outcomes.get(row, ()), drafts.get(row, ()))) for row in blocks}, rows


def _outcomes(block: Draft, rows: torch.Tensor) -> list[tuple[int, int]]:
    """The predicted outcomes (k, t) of a round: F_k candidates at each position k of its draft, ranked by rows."""
    K = len(block.tokens)
    return [(k, t) for k in range(K + 1)
            for t in candidates(rows[k], block.fan_out[k], exclude=block.tokens[k] if k < K else None)]


# ---- SSD's proposer ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Lookup:
    """What the cache made of one round's outcome."""

    hit: bool  # the outcome (k, t*) was cached
    rank: int | None  # rank of t* among the candidates at position k; None where nothing was ranked


class SequenceState:
    """One sequence's share of SSD: its speculation cache, its estimates (calibrator) and tuner, and its round in
    flight. At batch b each row keeps its own; only the draft model's forwards are shared, and on auto the estimates
    carried over answers (``Speculator._estimates``) and the latencies the tuner prices its choices on."""

    def __init__(self, config: SSDConfig, calibrator: Calibrator | None, tuned_on: Calibrator | None = None,
                 latencies=None):
        self.cache = SpeculationCache()
        self.calibrator = calibrator  # the fan-out's estimates (None: a strategy that reads none)
        self.tuned_on = tuned_on or calibrator  # the tuner's: the same, or the carried ones (Speculator._estimates)
        self.tuner = ssd_tuner(config, self.tuned_on, latencies)
        self.learners = tuple(c for c in (calibrator, tuned_on) if c)  # what each round's outcome teaches
        self.config = config
        self.f_next = self.next_fan_out(self.tuner.k)  # the F_0..F_K the drafts made now are for
        self.block: Draft | None = None  # the whole K-token draft of the round being verified
        self.found: Draft | None = None  # the cached draft for the last outcome, if it hit
        self.rank_rows = None  # [K + 1, V] draft logits ranking the candidates of the round being verified
        self.last_lookup: Lookup | None = None  # what the cache made of the last outcome
        self.fast_pending: list[tuple[int, list[int]]] = []  # (where, the n-gram proposal there) per miss, unscored
        self.undecided = False  # observed a round the tuner has not yet decided after

    def next_fan_out(self, k: int) -> tuple[int, ...]:
        """F_0..F_K of a round of K drafted tokens, from the strategy, the tuner's B and, calibrated, the estimates."""
        c = self.config
        return tuple(allocate(c.fan_out_strategy, self.tuner.budget, k, a_p=c.a_p, r=c.r, calibrator=self.calibrator))

    def estimates(self) -> tuple[float, float]:
        """The a_p and r the fan-out strategy uses now."""
        if self.config.fan_out_strategy == "calibrated":
            return self.calibrator.a_p, self.calibrator.r
        return self.config.a_p, self.config.r

    def predicted(self) -> bool:
        """Did this round's pre-speculation predict anything (a budget above 0)?"""
        return sum(self.block.fan_out) > 0

    def observe(self, verdict: Verdict) -> None:
        """Learn from the outcome (k, t*) (calibrated fan-out, the tuner) and look it up in the cache."""
        k, t_star = verdict.outcome
        rank = None
        if self.rank_rows is not None:
            excluded = self.block.tokens[k] if k < len(self.block.tokens) else None
            rank = rank_of(t_star, self.rank_rows[k], excluded) if t_star != excluded else None
        for estimates in self.learners:
            estimates.update(k, verdict.draft_len, rank, model_drafted=self.block.source != "ngram")
        self.undecided = True
        self.found = self.cache.lookup(verdict.outcome) if self.predicted() else None
        self.last_lookup = Lookup(hit=self.found is not None, rank=rank)

    def decide(self) -> None:
        """The tuner's turn after an observed round. ``Speculator.propose`` calls it once every row's outcome is in:
        rows that share estimates (on auto) then make the same choice, and a round never backs one row's miss with
        the n-gram while it waits for another's jit draft anyway."""
        if self.undecided:
            self.tuner.step()
            self.undecided = False

    @property
    def backup(self) -> str:
        """The backup that drafts this row's next round if it missed: the configured one, or on auto the tuner's."""
        return self.tuner.choice.backup

    def note_miss(self, start: int, proposal: list[int]) -> None:
        """The row missed after `start` tokens: keep the fast backup's proposal there, scored once the text is past
        it (where there are estimates to learn it: only the tuner reads them)."""
        if self.tuned_on:
            self.fast_pending.append((start, proposal))

    def score_fast(self, tokens: list[int]) -> None:
        """Each kept proposal the committed tokens now reach past: the calibrator learns how many of its first tokens
        the target produced, what a fast round there would have accepted (``Calibrator.update_fast``)."""
        waiting = []
        for start, proposal in self.fast_pending:
            if len(tokens) >= start + len(proposal):
                self.tuned_on.update_fast(matched_prefix(proposal, tokens[start:]))
            else:
                waiting.append((start, proposal))
        self.fast_pending = waiting


class Speculator(Proposer):
    """SSD's proposer: the speculation cache with a backup, fed by pre-speculation, for each row of a batch.

    A round: ``propose`` hands out each row's draft (from its cache after a hit, else from the backup: all the rows
    that missed in one batched draft); while the target verifies them, ``prespeculate`` drafts the next round for
    every predicted outcome of every row (one token tree); ``observe`` commits a row's outcome and looks it up
    (``sequences[row].last_lookup`` then says hit or miss). It always drafts K tokens and hands out the first k
    (fewer near max_new_tokens): the cache is filled for the whole draft. Each row's K and B are its tuner's
    (``ssd.core.tuning``): the configured ones, or on auto re-decided as the run goes from the estimates (on auto
    carried over the answers run with the same ``Autotune``, ``Autotune.calibrator``, and shared by the batch's rows)
    and priced on the autotune's profile at the batch's size; a new K applies from the next round's uniforms (``k``), a
    new B from the next pre-speculation's fan-out. It lives wherever the draft model lives: beside the verifier in
    ``generate_ssd``, on its own device in ``ssd.pipeline.protocol``.
    """

    def __init__(self, draft_model, prompts: list[list[int]], config: SSDConfig, vocab_size: int,
                 autotune: Autotune | None = None):
        # No Proposer.__init__: the committed tokens are the drafter's (``tokens`` below), kept in one place.
        self.config = config
        latencies = tuned_latencies(autotune, len(prompts)) if on_auto(config) else None  # fails before any forward
        self.drafter = SaguaroDrafter(draft_model, prompts, config)
        ngram = NgramProposer(prompts, vocab_size, config.ngram, device=self.drafter.model.device)
        self.backups = {"jit": self.drafter, "fast": ngram}
        self.sequences = [SequenceState(config, *self._estimates(autotune), latencies) for _ in prompts]

    def _estimates(self, autotune: Autotune | None) -> tuple[Calibrator | None, Calibrator | None]:
        """(the fan-out's estimates, the tuner's where they are others). On auto the tuner reads the estimates the
        last answer run with this autotune on these settings left (``Autotune.calibrator``), and so does the fan-out
        where K or B is on auto (the tuner chose them for those estimates). With the backup alone on auto the fan-out
        reads the row's own, as with nothing on auto: the run is then, round for round, the run of the backup it
        picks (a fan-out that read the carried estimates ran 2% more rounds than jit's on prose for the same
        tokens)."""
        c = self.config
        own = Calibrator(prior_a_p=c.a_p, prior_r=c.r) if c.fan_out_strategy == "calibrated" else None
        if not on_auto(c):
            return own, None
        carried = autotune.calibrator(c)
        return (carried, None) if is_auto(c.k) or is_auto(c.budget) else (own, carried)

    @property
    def model(self) -> CachedModel:
        return self.drafter.model

    @property
    def tokens(self) -> list[list[int]]:
        """Each row's committed tokens: the drafter's copy, which its observe advances."""
        return self.drafter.tokens

    def k(self, row: int = 0) -> int:
        """K of the row's next drafts: how many draft uniforms its next round draws."""
        return self.sequences[row].tuner.k

    def estimates(self, row: int = 0) -> tuple[float, float]:
        """The a_p and r the row's fan-out strategy uses now."""
        return self.sequences[row].estimates()

    def propose(self, rooms: dict[int, int], us: dict[int, torch.Tensor]) -> dict[int, Draft]:
        """Each row's next draft, cut to rooms[row] tokens: the cached one after a hit, else its backup's, drafted
        with us[row] ([K] uniforms); the rows that missed are drafted together, by backup."""
        for row in rooms:  # every row's outcome of the round is in (observe): the tuners decide on them all
            self.sequences[row].decide()
        missed = [row for row in rooms if self.sequences[row].found is None]
        backed = {}
        for row in missed:
            self.drafter.fan_out[row] = self.sequences[row].f_next
            self.sequences[row].note_miss(len(self.tokens[row]), self.backups["fast"].lookahead(row, FAST_HORIZON))
        for name, backup in self.backups.items():
            rows = [row for row in missed if self.sequences[row].backup == name]
            if rows:
                backed |= backup.propose({row: len(us[row]) for row in rows}, {row: us[row] for row in rows})
        for row in rooms:
            seq = self.sequences[row]
            seq.block = seq.found if seq.found is not None else replace(backed[row], fan_out=seq.f_next)
        return {row: self.sequences[row].block.truncated(room) for row, room in rooms.items()}

    def prespeculate(self, us: dict[int, torch.Tensor]) -> None:
        """Fill each row's cache with the next round's draft for every predicted outcome of its round (us[row]: [K]
        uniforms, the ones a backup would draft the row's next round with)."""
        for row, u in us.items():
            seq = self.sequences[row]
            seq.f_next, seq.rank_rows = seq.next_fan_out(len(u)), None
        predicting = [row for row in us if self.sequences[row].predicted()]
        entries, ranking = {}, {}
        if predicting:
            entries, ranking = branch_drafts(
                self.model, {row: self.tokens[row] for row in predicting},
                {row: self.sequences[row].block for row in predicting}, us, self.config.temperature,
                self.config.saguaro_c, {row: self.sequences[row].f_next for row in predicting})
        for row in us:
            self.sequences[row].rank_rows = ranking.get(row)
            self.sequences[row].cache.fill(entries.get(row, {}))

    def observe(self, row: int, draft: Draft, verdict: Verdict) -> None:
        """Commit the row's outcome (k, t*), learn from it and look it up in its cache."""
        self.sequences[row].observe(verdict)
        self.drafter.observe(row, draft, verdict)
        self.backups["fast"].observe(row, draft, verdict)
        if self.sequences[row].fast_pending:
            self.sequences[row].score_fast(self.tokens[row])

    def last_lookup(self, row: int = 0) -> Lookup:
        return self.sequences[row].last_lookup

    def retire(self, row: int) -> None:
        self.drafter.retire(row)
        self.sequences[row].fast_pending = []  # the text ended before them: left unscored


@batchable
def generate_ssd(pair, prompts, config: SSDConfig, generator: torch.Generator, autotune: Autotune | None = None,
                 clock=None):
    """SSD in one process, over a batch: the drafter's and the verifier's side of each round (``ssd.core.round``),
    linked in-process, so the phases run one after the other. Lossless: every round is verified exactly as in SD,
    against the q it was drawn from. On auto (K, B or the backup) the autotune gives the latencies and carries the
    estimates. clock: what times the phases (``ssd.clock.Stopwatch``; None: nothing)."""
    check_ssd_config(config)
    prompts = check_prompts(pair, prompts, config)
    draws = Draws(generator)  # both sides' uniforms, drawn once
    clock = clock or Unclocked()
    drafter = DrafterSide(Speculator(pair.draft, prompts, config, pair.vocab_size, autotune), draws, clock.side())
    verifier = Verifier(pair.target, prompts, config, pair.eos_token_ids)
    traces = batch_traces("ssd", prompts)
    # The target's prompts go in with the first verify pass (one target forward fewer, as in SD), the draft's in a pass
    # of their own before the first drafts, as the pipeline's drafter makes them.
    with clock.whole(*traces):
        drafter.start(prompts, {row: verifier.room(row) for row in verifier.live})
        verify_rounds(VerifierSide(verifier, draws, traces, clock, pair.vocab_size), InProcess(drafter))
    return verifier.new, traces
