"""A target's output layer at a weight-only precision (``int4``, ``int8w``), with float32 logits where they decide.

Why: the weight-only kernels return bfloat16, whose logits grid turns near-ties into exact ties broken differently by
a one-token step and a verify pass, and a float32 layer (``ssd.models.precision.FloatLogits``) would cost the 1.5B
target some 40 of its 90 ms a step at int4. Rescoring only the best few in float32 costs 64 rows of the layer a
position instead of its 151,936.
"""
from __future__ import annotations

import torch


class RescoredLogits(torch.nn.Module):
    """Every logit from the reduced layer (``approximate``: bfloat16 in, bfloat16 out), then the CANDIDATES largest of
    each position computed again in float32 from the float32 weights (their rows gathered: 64 x 1536 floats a
    position for the 1.5B target).

    A greedy choice is then FloatLogits' own wherever its token is among the reduced layer's 64 best, and the top two's
    margin is float32's, so a one-token step and a verify pass break a near-tie as the float32 layer does, not on the
    bfloat16 grid. The logits outside the candidates stay the reduced layer's: at temperature > 0 this model's
    distribution is that mixture, the same in every pass and every method, as a target's must be."""

    CANDIDATES = 64

    def __init__(self, head: torch.nn.Linear, approximate: torch.nn.Module):
        super().__init__()
        self.approximate = approximate
        self.register_buffer("exact", head.weight.detach().float())  # [V, hidden]
        self.register_buffer("exact_bias", head.bias.detach().float() if head.bias is not None else None)

    @property
    def weight(self) -> torch.Tensor:
        return self.exact

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.approximate(hidden.to(torch.bfloat16)).float()  # [..., V]
        top = logits.topk(min(self.CANDIDATES, logits.shape[-1]), dim=-1).indices  # [..., C]
        exact = (self.exact[top] @ hidden.float()[..., None])[..., 0]  # [..., C]
        if self.exact_bias is not None:
            exact = exact + self.exact_bias[top]
        return logits.scatter(-1, top, exact)
