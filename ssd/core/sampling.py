"""Logits -> probabilities, sampling from explicit random numbers, and the residual of rejection sampling.

Every draw in the kit is a uniform number in [0, 1) turned into a token by the inverse CDF (at temperature 0, where
every distribution is one-hot, that token is the argmax, found as such: ``draw``). The uniforms come from an
explicit CPU ``torch.Generator``: the same seed gives the same tokens on any device, and the functions that consume
them (``sample_from_uniform``, ``ssd.core.verify.verify``) stay pure and testable with hand-picked numbers.

Sampling compares cumulative sums in float64, so a u near a boundary falls the same way everywhere. Apple's MPS has
no float64: there the distribution is sampled on the CPU (``float64_device``), one row of V floats per draw.
"""
from __future__ import annotations

import torch

from ..checks import check_temperature


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Next-token distribution(s) over the last dimension, in float32.

    Temperature 0 is greedy decoding written as a distribution: one-hot on the argmax. Rejection sampling on one-hot
    rows then accepts exactly the drafted tokens that equal the target's argmax and recovers the argmax itself, so
    greedy and sampling share one code path.
    """
    temperature = check_temperature(temperature)
    logits = logits.float()
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    return torch.softmax(logits / temperature, dim=-1)


def uniforms(n: int, generator: torch.Generator) -> torch.Tensor:
    """n uniform numbers in [0, 1) from the (CPU) generator: the only source of randomness in decoding."""
    return torch.rand(n, generator=generator, dtype=torch.float64)


def float64_device(t: torch.Tensor) -> torch.Tensor:
    """t where float64 arithmetic runs: where it is, or the CPU for MPS (which has no float64)."""
    return t.cpu() if t.device.type == "mps" else t


def sample_from_uniform(probs: torch.Tensor, u: torch.Tensor | float) -> torch.Tensor:
    """Inverse-CDF sampling: the first token whose cumulative mass exceeds u * total.

    probs: [..., V] non-negative (need not sum to 1); u: [...] in [0, 1). Tokens of zero mass are never returned.
    """
    probs = float64_device(probs)
    cdf = probs.double().cumsum(-1)
    u = torch.as_tensor(u, dtype=torch.float64, device=probs.device)
    x = (u * cdf[..., -1]).unsqueeze(-1)
    token = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    # u * total can round up to the total itself: no cumulative sum exceeds it, and searchsorted answers V. The last
    # token of positive mass is then the right answer (below the total the first sum above x always has mass). Found
    # only where needed: that scan over V for every row cost the real draft's tree depth at 16 rows at T = 1 about 9%
    # (161 against 177 ms, one thread, one run).
    beyond = token == probs.shape[-1]
    if beyond.any():
        last_positive = probs.shape[-1] - 1 - (probs > 0).flip(-1).int().argmax(-1)
        token = torch.where(beyond, last_positive, token)
    return token


def draw(probs: torch.Tensor, u: torch.Tensor | float, greedy: bool) -> torch.Tensor:
    """sample_from_uniform, or where `greedy` (temperature 0: every row of probs one-hot on its argmax, as
    probs_from_logits makes it) the argmax itself: the same token, whatever u, without a float64 cumulative sum over
    the vocabulary for each row (over 152k tokens and a tree depth's 16 rows that sum cost several times the argmax)."""
    return probs.argmax(-1) if greedy else sample_from_uniform(probs, u)


def sample(probs: torch.Tensor, generator: torch.Generator, greedy: bool = False) -> int:
    """One token from a [V] distribution (greedy: probs one-hot, see draw; the generator advances all the same)."""
    return int(draw(probs, uniforms(1, generator)[0], greedy))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): where the recovered token is drawn after a rejection (Leviathan et al., Alg. 1).

    If p <= q everywhere (only possible when p == q up to rounding, where a rejection has probability ~0) the residual
    has no mass; p itself is then the right distribution.
    """
    r = (p - q).clamp_min(0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(torch.finfo(r.dtype).tiny), p)


def one_hot(tokens: torch.Tensor | list[int], vocab_size: int, device=None) -> torch.Tensor:
    """q for a deterministic proposal: all mass on the proposed token, which keeps rejection sampling lossless.
    Made on `device` (default: the CPU, or where tokens are), where verify reads it."""
    tokens = torch.as_tensor(tokens, dtype=torch.long, device=device)
    return torch.nn.functional.one_hot(tokens, vocab_size).float()


def saguaro(q: torch.Tensor, covered: torch.Tensor, c: float) -> torch.Tensor:
    """Saguaro sampling (Definition 14) on post-temperature probabilities: the covered tokens' mass times C.

    q: [..., V]; covered: [..., F] token ids (the set the cache covers at this position). Lowering q on exactly the
    cached tokens raises the residual max(p - q, 0) there, so a rejection recovers a cached token more often: hit
    rate up, acceptance down as C -> 0. Lossless as long as verify sees this same q. If C = 0 and the covered tokens
    hold all the mass, nothing is left to sample: q is returned unchanged.
    """
    if c == 1.0 or covered.shape[-1] == 0:
        return q
    scale = torch.ones_like(q).scatter_(-1, covered, c)
    w = q * scale
    total = w.sum(-1, keepdim=True)
    return torch.where(total > 0, w / total.clamp_min(torch.finfo(w.dtype).tiny), q)
