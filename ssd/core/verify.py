"""The accept / recover / bonus step of speculative decoding, as one pure function.

Words (as in vLLM's rejection sampler): the draft proposes K tokens; token i is *accepted* with probability
min(1, p_i(x_i) / q_i(x_i)); at the first rejection a *recovered* token is drawn from the residual
norm(max(p_k - q_k, 0)); if all K are accepted, a *bonus* token is drawn from p_K (the target's distribution after the
last drafted token). The output is distributed exactly as sampling from p alone (Leviathan et al. 2023, Thm 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .sampling import draw, float64_device, residual

# The roles of an output token: a drafted token the target accepted, or the target's own token t*, which is recovered
# (from the residual at the first rejection), bonus (after all K were accepted) or, without a draft (AR), target.
ROLES = ("accepted", "recovered", "bonus", "target")


def target_token_role(accepted: int, draft_len: int) -> str:
    """The role of t* in a round that accepted `accepted` of `draft_len` drafted tokens."""
    return "target" if draft_len == 0 else "bonus" if accepted == draft_len else "recovered"


@dataclass(frozen=True)
class Verdict:
    """The outcome of one round: (k, t*) in the paper's words."""

    accepted: int  # k: how many drafted tokens were accepted, 0..K
    token: int  # t*: the token the target appended (recovered if k < K, bonus if k == K)
    draft_len: int  # K of this round

    @property
    def role(self) -> str:
        """t*'s role: recovered, bonus, or target (no draft)."""
        return target_token_role(self.accepted, self.draft_len)

    @property
    def outcome(self) -> tuple[int, int]:
        return self.accepted, self.token


def verify(
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    accept_u: torch.Tensor,
    sample_u: float,
    greedy: bool = False,
) -> Verdict:
    """Rejection-sample one round.

    draft_tokens: [K] the drafted tokens x_1..x_K (K may be 0)
    q:            [K, V] the draft distributions they were drawn from (one-hot rows for a deterministic proposal)
    p:            [K+1, V] the target distributions at the same positions, plus one after the last drafted token
    accept_u:     [K] uniforms in [0, 1), one per drafted token
    sample_u:     one uniform in [0, 1) for the recovered or bonus token
    greedy:       temperature 0 (p one-hot): the token is p's argmax, the same token found without sampling
    """
    draft_tokens = torch.as_tensor(draft_tokens, dtype=torch.long, device=p.device)
    K = draft_tokens.numel()
    if q.shape[0] != K or p.shape[0] != K + 1 or len(accept_u) != K:
        raise ValueError(
            f"verify expects q [K, V], p [K+1, V], accept_u [K]; got K={K}, q {tuple(q.shape)}, p {tuple(p.shape)}, "
            f"accept_u {len(accept_u)}"
        )
    rows = torch.arange(K, device=p.device)
    p_x, q_x = float64_device(p[rows, draft_tokens]).double(), float64_device(q[rows, draft_tokens]).double()
    # u < p/q written without the division: q_x > 0 for any token the draft could have proposed.
    accepted_mask = torch.as_tensor(accept_u, dtype=torch.float64, device=p_x.device) * q_x < p_x
    rejected = (~accepted_mask).nonzero()
    k = int(rejected[0]) if len(rejected) else K
    # Greedy (p one-hot on the target's argmax a): a rejected token is not a, so the residual max(p - q, 0) has its
    # mass on a alone, and the token is p's argmax either way (sampling.draw), without the residual's passes over V.
    dist = residual(p[k], q[k]) if k < K and not greedy else p[k]
    return Verdict(accepted=k, token=int(draw(dist, sample_u, greedy)), draft_len=K)
