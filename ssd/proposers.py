"""Proposers: everything that drafts, behind one interface (as transformers' candidate generators are).

A proposer follows one generate call. Each round the loop asks it for a draft of k tokens, the target verifies the
draft, and the proposer observes the verdict:

    draft = proposer.propose(k, u)        # x_1..x_k, the q [k, V] they were drawn from, the draft's logits
    ... verify ...
    proposer.observe(draft, verdict)      # accepted count k and t*: commit them, learn from them

A proposer keeps its own copy of the committed tokens (prompt + output so far), advanced by observe; so it can live
in another process than the verifier (``ssd.protocol``). Here: the draft model drafting autoregressively (SD's draft
phase, SSD's jit backup) and an n-gram lookup in the context (SSD's fast backup). SSD's cache-with-a-backup,
``ssd.ssd.Speculator``, is a proposer too.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .cached_model import CachedModel
from .sampling import one_hot, probs_from_logits, sample_from_uniform
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
    """The interface: propose a draft of k tokens, observe the round's verdict."""

    def __init__(self, prompt_ids: list[int]):
        self.tokens = list(prompt_ids)  # the committed tokens: the context of the next draft

    def propose(self, k: int, u: torch.Tensor) -> Draft:
        """Draft k tokens after self.tokens; u: [k] uniforms, one per drafted token, to draw with."""
        raise NotImplementedError

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        """The verifier accepted verdict.accepted tokens of `draft` and appended t*: commit them."""
        self.tokens += draft.tokens[: verdict.accepted] + [verdict.token]


class DraftModelProposer(Proposer):
    """The draft model drafts autoregressively, one forward a token, over a KV cache kept across rounds.

    `distribution` is the only thing a subclass changes: the q each token is drawn from (SSD's Saguaro reshapes it).
    """

    def __init__(self, model, prompt_ids: list[int], temperature: float):
        super().__init__(prompt_ids)
        self.model = CachedModel(model)
        self.temperature = temperature

    def distribution(self, position: int, logits: torch.Tensor) -> torch.Tensor:
        """q at the position-th drafted token, from the draft's logits there: [V] -> [V]."""
        return probs_from_logits(logits, self.temperature)

    def propose(self, k: int, u: torch.Tensor) -> Draft:
        drafted, q_rows, logit_rows = [], [], []
        for j in range(k):
            logits = self.model.logits(self.tokens + drafted, keep=1)[0]  # [V]
            q = self.distribution(j, logits)  # [V]
            drafted.append(int(sample_from_uniform(q, u[j])))
            q_rows.append(q)
            logit_rows.append(logits)
        if not drafted:
            return Draft([], torch.empty(0, self.model.model.config.vocab_size), None, source="draft")
        return Draft(drafted, torch.stack(q_rows), torch.stack(logit_rows), source="draft")  # [k, V] each

    def observe(self, draft: Draft, verdict: Verdict) -> None:
        # The cache keeps only the accepted prefix; t* is fed with the next draft.
        self.model.rollback(len(self.tokens) + verdict.accepted)
        super().observe(draft, verdict)


def ngram_proposal(tokens: list[int], k: int, max_n: int) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the longest matching suffix.

    Falls back to shorter n-grams, then to repeating the last token; pads a short continuation with its last token.
    """
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == suffix:
                follow = tokens[start + n : start + n + k]
                return follow + [follow[-1]] * (k - len(follow))
    return [tokens[-1]] * k


class NgramProposer(Proposer):
    """A near-free proposer: an n-gram lookup in the context. As a deterministic proposal its q is one-hot, so
    verifying it stays lossless; it has no logits. device: where the q rows are made (where verify reads them)."""

    def __init__(self, prompt_ids: list[int], vocab_size: int, max_n: int = 3, device=None):
        super().__init__(prompt_ids)
        self.vocab_size, self.max_n, self.device = vocab_size, max_n, device

    def propose(self, k: int, u: torch.Tensor) -> Draft:
        proposal = ngram_proposal(self.tokens, k, self.max_n)
        return Draft(proposal, one_hot(proposal, self.vocab_size, self.device), None, source="ngram")  # q: [k, V]
