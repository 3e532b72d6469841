"""Proposers: everything that drafts, behind one interface (as transformers' candidate generators are).

A proposer follows one generate call over a batch of sequences (rows; b = 1 is a batch of one). Each round the loop
asks it for every live row's draft at once, the target verifies them, and the proposer observes each row's verdict:

    drafts = proposer.propose({row: k}, {row: u})  # per row: x_1..x_k, the q [k, V] they were drawn from, the logits
    ... verify ...
    proposer.observe(row, drafts[row], verdict)    # accepted count k and t*: commit them, learn from them

A proposer keeps its own copy of each row's committed tokens (prompt + output so far), advanced by observe; so it can
live in another process than the verifier (``ssd.pipeline.protocol``). Here: the draft model drafting autoregressively
(SD's draft phase, SSD's jit backup) and an n-gram lookup in the context (SSD's fast backup). SSD's cache-with-a-backup,
``ssd.core.speculation.Speculator``, is a proposer too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cached_model import CachedModel
from .sampling import draw, one_hot, probs_from_logits
from .verify import Verdict


@dataclass(frozen=True)
class Draft:
    """One round's draft: what the verifier checks, and what SSD's cache hands over on a hit."""

    tokens: list[int]  # x_1..x_k
    q: torch.Tensor  # [k, V] the distributions they were drawn from (verify needs them to stay lossless)
    logits: torch.Tensor | None  # [k, V] the draft model's logits there (they rank SSD's candidates); None: a lookup
    fan_out: tuple[int, ...] = ()  # SSD: the F_0..F_K the draft was made for (Saguaro down-weighted those sets)
    source: str = "draft"  # who drafted it: "draft" (the model), "ngram", or SSD's "cache"

    def truncated(self, k: int) -> Draft:
        """The first k drafted tokens (near max_new_tokens a round verifies fewer than were drafted)."""
        logits = self.logits[:k] if self.logits is not None else None
        return Draft(self.tokens[:k], self.q[:k], logits, self.fan_out, self.source)


class Proposer:
    """The interface: propose a draft for each row of the batch, observe each row's verdict.

    Rows are the sequences of one batch, named by index (b = 1: row 0). ``propose`` drafts every row it is asked for
    at once (a model proposer: one forward per drafted position over all of them); ``observe`` is one sequence's."""

    def __init__(self, prompts: list[list[int]]):
        self.tokens = [list(p) for p in prompts]  # each row's committed tokens: the context of its next draft

    def propose(self, ks: dict[int, int], us: dict[int, torch.Tensor]) -> dict[int, Draft]:
        """Draft ks[row] tokens after self.tokens[row] for each row; us[row]: [k] uniforms, one per drafted token."""
        raise NotImplementedError

    def observe(self, row: int, draft: Draft, verdict: Verdict) -> None:
        """The verifier accepted verdict.accepted tokens of the row's `draft` and appended t*: commit them."""
        self.tokens[row] += draft.tokens[: verdict.accepted] + [verdict.token]

    def retire(self, row: int) -> None:
        """The row's sequence is finished: it takes no more drafts."""


class DraftModelProposer(Proposer):
    """The draft model drafts autoregressively, one forward a position over all rows, over a KV cache kept across
    rounds. `distribution` is the only thing a subclass changes: the q each token is drawn from (SSD's Saguaro
    reshapes it)."""

    def __init__(self, model, prompts: list[list[int]], temperature: float):
        super().__init__(prompts)
        self.model = CachedModel(model, len(prompts))
        self.temperature = temperature

    def distribution(self, row: int, position: int, logits: torch.Tensor) -> torch.Tensor:
        """q at the row's position-th drafted token, from the draft's logits there: [V] -> [V]."""
        return probs_from_logits(logits, self.temperature)

    def propose(self, ks: dict[int, int], us: dict[int, torch.Tensor]) -> dict[int, Draft]:
        drafted = {row: ([], [], []) for row in ks}  # per row: tokens, q rows [V], logit rows [V]
        for j in range(max(ks.values(), default=0)):
            going = [row for row in ks if ks[row] > j]  # rows with a shorter draft sit this position out
            logits = self.model.logits({row: self.tokens[row] + drafted[row][0] for row in going}, keep=1)
            for row in going:
                tokens, q_rows, logit_rows = drafted[row]
                q = self.distribution(row, j, logits[row][0])  # [V]
                tokens.append(int(draw(q, us[row][j], self.temperature == 0)))
                q_rows.append(q)
                logit_rows.append(logits[row][0])
        return {row: self._draft(*drafted[row]) for row in ks}

    def _draft(self, tokens: list[int], q_rows: list, logit_rows: list) -> Draft:
        if not tokens:
            return Draft([], torch.empty(0, self.model.model.config.vocab_size), None, source="draft")
        return Draft(tokens, torch.stack(q_rows), torch.stack(logit_rows), source="draft")  # [k, V] each

    def observe(self, row: int, draft: Draft, verdict: Verdict) -> None:
        # The cache keeps only the accepted prefix; t* is fed with the next draft.
        self.model.rollback(len(self.tokens[row]) + verdict.accepted, row)
        super().observe(row, draft, verdict)

    def retire(self, row: int) -> None:
        self.model.retire(row)


def ngram_proposal(tokens: list[int], k: int, max_n: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the longest matching suffix.

    Falls back to shorter n-grams, then to repeating the last token; pads a short continuation with its last token.
    """
    if k == 0:  # the last round before max_new_tokens drafts nothing
        return []
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [tokens[-1]] * k


def matched_prefix(proposal: list[int], tokens: list[int]) -> int:
    """How many of the proposal's first tokens equal the tokens: the count a one-hot draft of it keeps when the
    target's tokens are these."""
    return next((i for i, (x, t) in enumerate(zip(proposal, tokens)) if x != t), min(len(proposal), len(tokens)))


class NgramProposer(Proposer):
    """A near-free proposer: an n-gram lookup in the context. As a deterministic proposal its q is one-hot, so
    verifying it stays lossless; it has no logits. device: where the q rows are made (where verify reads them)."""

    def __init__(self, prompts: list[list[int]], vocab_size: int, max_n: int = 3, device=None):
        super().__init__(prompts)
        self.vocab_size, self.max_n, self.device = vocab_size, max_n, device

    def propose(self, ks: dict[int, int], us: dict[int, torch.Tensor]) -> dict[int, Draft]:
        return {row: self._lookup(self.tokens[row], k) for row, k in ks.items()}

    def lookahead(self, row: int, k: int) -> list[int]:
        """The k tokens it would propose for the row now (the first of a longer lookahead are a shorter proposal)."""
        return ngram_proposal(self.tokens[row], k, self.max_n)

    def _lookup(self, tokens: list[int], k: int) -> Draft:
        proposal = ngram_proposal(tokens, k, self.max_n)
        return Draft(proposal, one_hot(proposal, self.vocab_size, self.device), None, source="ngram")  # q: [k, V]
