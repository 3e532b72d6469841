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

import time
from dataclasses import dataclass

import pandas as pd
import torch

from .cache import Speculation, SpeculationCache
from .decoding import CachedModel, DecodeConfig, Verifier, check_prompt, draft_tokens
from .outcomes import Calibrator, candidates, check_budget, check_strategy, fan_out, rank_of
from .sampling import check_saguaro_c, one_hot, probs_from_logits, sample_from_uniform, saguaro, uniforms
from .trace import SSDRound, Trace

BACKUPS = ("jit", "fast")


@dataclass
class SSDConfig(DecodeConfig):
    budget: int = 16  # B: cached outcomes per round, over all positions
    fan_out: str = "uniform"  # uniform | geometric | calibrated
    saguaro_c: float = 1.0  # C of Saguaro sampling; 1 = plain sampling
    backup: str = "jit"  # jit | fast
    a_p: float = 0.6  # geometric: the acceptance rate; calibrated: its prior
    r: float = 0.5  # geometric: the power-law exponent of the miss rate; calibrated: its prior
    ngram: int = 3  # fast backup: the longest n-gram matched in the context

    def __post_init__(self):
        super().__post_init__()
        check_budget(self.budget)
        check_strategy(self.fan_out)
        self.saguaro_c = check_saguaro_c(self.saguaro_c)
        if self.backup not in BACKUPS:
            raise ValueError(f"backup must be one of {', '.join(BACKUPS)}; got {self.backup!r}")
        if not 0.0 <= self.a_p <= 1.0:
            raise ValueError(f"a_p must lie in [0, 1], got {self.a_p}")
        if not self.r > 0:
            raise ValueError(f"r must be > 0, got {self.r}")
        if not (isinstance(self.ngram, int) and self.ngram >= 1):
            raise ValueError(f"ngram must be an integer >= 1, got {self.ngram!r}")


def check_ssd_config(config, method: str = "ssd") -> None:
    """The SSD methods need the SSD fields (budget, fan-out, C, backup); a plain DecodeConfig lacks them."""
    if not isinstance(config, SSDConfig):
        raise ValueError(f"config must be an SSDConfig for {method}, got {type(config).__name__}")


# ---- drafting ------------------------------------------------------------------------------------------------------


def saguaro_q(logits: torch.Tensor, temperature: float, f: int, c: float) -> torch.Tensor:
    """The draft distribution at a position whose cache holds f candidates: Saguaro down-weights the top f + 1.

    The drafted token is usually the top one and is never a candidate, so the top f + 1 are the tokens the cache
    will cover there (as in the official code). At temperature 0 the greedy draft is left alone.
    logits: [..., V].
    """
    q = probs_from_logits(logits, temperature)
    if temperature == 0 or c == 1.0 or f == 0:
        return q
    return saguaro(q, torch.topk(logits, min(f + 1, logits.shape[-1]), dim=-1).indices, c)


def jit_backup(draft: CachedModel, tokens: list[int], u: torch.Tensor, config: SSDConfig, f: list[int]) -> Speculation:
    """The primary drafter drafts just in time: SD's draft phase."""
    reweight = lambda j, logits, q: saguaro_q(logits, config.temperature, f[j], config.saguaro_c)  # noqa: E731
    drafted, q_rows, logit_rows = draft_tokens(draft, tokens, u, config.temperature, reweight)
    return Speculation(drafted, torch.stack(q_rows), torch.stack(logit_rows), f)


def ngram_proposal(tokens: list[int], k: int, max_n: int) -> list[int]:
    """Prompt lookup: the K tokens that followed the latest earlier occurrence of the longest matching suffix.

    Falls back to shorter n-grams, then to repeating the last token; pads a short continuation with its last token.
    """
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [tokens[-1]] * k


def fast_backup(tokens: list[int], config: SSDConfig, vocab_size: int, f: list[int], device=None) -> Speculation:
    """A near-free proposer; as a deterministic proposal its q is one-hot (made where verify will read it)."""
    proposal = ngram_proposal(tokens, config.k, config.ngram)
    return Speculation(proposal, one_hot(proposal, vocab_size, device), None, f)


def tree_mask(prefix_visible: torch.Tensor, depth: int, dtype) -> torch.Tensor:
    """Additive [1, 1, N, base + (depth + 1) N] mask for the depth-th forward over N branches.

    Branch b sees the prefix columns prefix_visible[b] marks and its own nodes of depths 0..depth; tree columns are
    laid out depth by depth, N per depth. Made on prefix_visible's device, in the model's dtype.
    """
    n, device = prefix_visible.shape[0], prefix_visible.device
    own = torch.eye(n, dtype=torch.bool, device=device).repeat(1, depth + 1)
    visible = torch.cat([prefix_visible, own], dim=1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[None, None]


@torch.inference_mode()
def draft_tree(draft: CachedModel, prefix_len: int, outcomes, u: torch.Tensor, config: SSDConfig, f: list[int]):
    """Draft K tokens for every outcome (k, t) at once: K forwards, each over all N branches in one row.

    The draft's cache holds prefix + x_1..x_K. Branch (k, t) continues prefix + x_1..x_k + t, so its nodes see the
    prefix and the first k chain tokens, then their own earlier nodes. Returns one Speculation per outcome.
    """
    model, base, device = draft.model, draft.length, draft.device
    # Made on the draft's device once: only the uniforms come in per depth, the tokens go out once at the end.
    ks = torch.tensor([k for k, _ in outcomes], device=device)
    feed = torch.tensor([t for _, t in outcomes], device=device)
    prefix_visible = torch.arange(base, device=device)[None, :] < (prefix_len + ks)[:, None]
    tokens, q_rows, logit_rows = [], [], []
    for depth in range(config.k):
        out = model(
            input_ids=feed[None].to(device),  # a no-op, but on MPS, which samples on the CPU (ssd.sampling)
            attention_mask=tree_mask(prefix_visible, depth, model.dtype),
            position_ids=(prefix_len + ks + depth)[None],
            cache=draft.cache,
            use_cache=True,
        )
        logits = out.logits[0].float()  # [N, V]
        q = saguaro_q(logits, config.temperature, f[depth], config.saguaro_c)
        feed = sample_from_uniform(q, u[depth].expand(len(outcomes)))
        tokens.append(feed)
        q_rows.append(q)
        logit_rows.append(logits)
    draft.rollback(base)
    tokens, q_rows, logit_rows = torch.stack(tokens, 1).tolist(), torch.stack(q_rows, 1), torch.stack(logit_rows, 1)
    return [Speculation(tokens[i], q_rows[i], logit_rows[i], f) for i in range(len(outcomes))]


def prespeculate(draft: CachedModel, tokens: list[int], block: Speculation, u: torch.Tensor, config: SSDConfig,
                 f_next: list[int]):
    """Fill the cache for the round about to be verified.

    Returns the speculations by outcome and the [K + 1, V] draft logits that rank the candidates at positions
    0..K (the last row, after x_K, costs the one extra "glue" forward).
    """
    K = len(block.tokens)
    # The glue step: feed the draft (all of it if it was a proposal, whose logits we lack) and look one past it.
    glue = draft.logits(tokens + block.tokens, keep=1 if block.logits is not None else K + 1)
    rows = glue if block.logits is None else torch.cat([block.logits, glue])
    outcomes = [
        (k, t)
        for k in range(K + 1)
        for t in candidates(rows[k], block.fan_out[k], exclude=block.tokens[k] if k < K else None)
    ]
    if not outcomes:
        return {}, rows
    speculations = draft_tree(draft, len(tokens), outcomes, u, config, f_next)
    return dict(zip(outcomes, speculations)), rows


def truncate(block: Speculation, n: int) -> Speculation:
    """The first n drafted tokens (near max_new_tokens a round drafts fewer than K)."""
    logits = block.logits[:n] if block.logits is not None else None
    return Speculation(block.tokens[:n], block.q[:n], logits, block.fan_out)


# ---- the two sides ------------------------------------------------------------------------------------------------


class Speculator:
    """The draft side of SSD: the fan-out, pre-speculation, the cache and the backups.

    It lives wherever the draft model lives: beside the verifier in ``generate_ssd``, on its own device in
    ``ssd.pipeline``. It keeps its own copy of the committed tokens, advanced by each round's outcome.
    """

    def __init__(self, draft_model, prompt_ids: list[int], config: SSDConfig, vocab_size: int):
        self.draft = CachedModel(draft_model)
        self.tokens = list(prompt_ids)
        self.config = config
        self.vocab_size = vocab_size
        self.cache = SpeculationCache()
        self.calibrator = Calibrator(prior_a_p=config.a_p, prior_r=config.r) if config.fan_out == "calibrated" else None
        self.rank_rows = None  # draft logits ranking the candidates of the round being verified

    def fan_out(self) -> list[int]:
        c = self.config
        return fan_out(c.fan_out, c.budget, c.k, a_p=c.a_p, r=c.r, calibrator=self.calibrator)

    def estimates(self) -> tuple[float, float]:
        """The a_p and r the fan-out strategy uses now."""
        return (self.calibrator.a_p, self.calibrator.r) if self.calibrator else (self.config.a_p, self.config.r)

    def backup(self, u_draft: torch.Tensor, f: list[int]) -> Speculation:
        if self.config.backup == "fast":
            return fast_backup(self.tokens, self.config, self.vocab_size, f, self.draft.device)
        return jit_backup(self.draft, self.tokens, u_draft, self.config, f)

    def prespeculate(self, block: Speculation, u_draft: torch.Tensor, f_next: list[int]) -> None:
        """Fill the cache with the next round's draft for every predicted outcome of `block`'s round."""
        entries, self.rank_rows = {}, None
        if self.config.budget > 0:
            entries, self.rank_rows = prespeculate(self.draft, self.tokens, block, u_draft, self.config, f_next)
        self.cache.fill(entries)

    def advance(self, block: Speculation, outcome: tuple[int, int], draft_len: int, u_draft, f_next, last: bool):
        """Commit the round's outcome; return (next block or None if last, hit, rank of t*, backup used or None)."""
        k, t_star = outcome
        rank = None
        if self.rank_rows is not None:
            excluded = block.tokens[k] if k < len(block.tokens) else None
            rank = rank_of(t_star, self.rank_rows[k], excluded) if t_star != excluded else None
        if self.calibrator:
            self.calibrator.update(k, draft_len, rank)
        self.draft.rollback(len(self.tokens) + k)
        self.tokens += block.tokens[:k] + [t_star]
        found = self.cache.lookup(outcome) if self.config.budget > 0 else None
        if last:
            return None, found is not None, rank, None
        if found is not None:
            return found, True, rank, None
        return self.backup(u_draft, f_next), False, rank, self.config.backup


def round_uniforms(generator: torch.Generator, k: int, draft_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each round draws K uniforms to draft the next round and draft_len + 1 to verify this one, whatever happens:
    the stream, and so the tokens, do not depend on hits, budget or fan-out (and two ranks can share it)."""
    return uniforms(k, generator), uniforms(draft_len + 1, generator)


def generate_ssd(pair, prompt_ids, config: SSDConfig, generator: torch.Generator):
    """SSD in one process. Lossless: every round is verified exactly as in SD, against the q it was drawn from."""
    check_ssd_config(config)
    prompt_ids = check_prompt(pair, prompt_ids, config)
    speculator = Speculator(pair.draft, prompt_ids, config, pair.vocab_size)
    verifier = Verifier(pair.target, prompt_ids, config, pair.eos_token_ids)
    trace = Trace("ssd", prompt_len=len(prompt_ids))
    start = time.perf_counter()
    verifier.target.prefill(prompt_ids)
    speculator.draft.prefill(prompt_ids)
    trace.prefill_s = time.perf_counter() - start
    block = speculator.backup(uniforms(config.k, generator), speculator.fan_out())
    done = False
    while not done:
        k_round = verifier.draft_len()
        u_draft, u_verify = round_uniforms(generator, config.k, k_round)
        a_p, r = speculator.estimates()
        f_next = speculator.fan_out()
        t0 = time.perf_counter()
        speculator.prespeculate(block, u_draft, f_next)  # on two devices this overlaps the verify pass below
        t1 = time.perf_counter()
        this = truncate(block, k_round)
        verdict, emitted, done = verifier.verify(this.tokens, this.q, u_verify)
        t2 = time.perf_counter()
        block, hit, rank, backup = speculator.advance(block, verdict.outcome, k_round, u_draft, f_next, last=done)
        t3 = time.perf_counter()
        trace.rounds.append(
            SSDRound(k_round, verdict.accepted, verdict.token, len(emitted), draft_s=t3 - t2, verify_s=t2 - t1,
                     prespec_s=t1 - t0, hit=hit, rank=rank, fan_out=tuple(this.fan_out), a_p=a_p, r=r, backup=backup)
        )
    trace.wall_s = time.perf_counter() - start
    return verifier.new, trace


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
    rows, run, calibrator = [], -1, None
    for row in rounds.itertuples():
        if row.round == 0:
            run, calibrator = run + 1, Calibrator(prior_a_p=a_p, prior_r=r)
        rank = None if pd.isna(row.rank) else int(row.rank)
        for b in budgets:
            if strategy == "calibrated":
                f = calibrator.fan_out(b, k)
            else:
                f = fan_out(strategy, b, k, a_p=a_p, r=r)
            rows.append({"run": run, "round": row.round, "budget": b, "hit": rank is not None and rank <= f[row.accepted]})
        calibrator.update(row.accepted, row.draft_len, rank)
    return pd.DataFrame(rows)
