"""The ``int8w`` precision: weight-only int8 linear layers (one bfloat16 scale per output row), run by torch's own CPU
kernel (``aten._weight_int8pack_mm``), with the rest of the model (embeddings, norms, attention, activations) in
bfloat16.

Why beside ``int4`` and ``int8``: ``int8`` (torch.ao's dynamic quantization) rounds the activations to int8 too, so a
model at int8 computes something other than the float model; ``int8w`` keeps the activations bfloat16 and moves each
weight by at most half its row's step (a 127th of the row's largest), at half of bfloat16's bytes a weight where int4
reads a quarter with a coarser grid (a weight moved up to 6.4% of its layer's largest, docs/precision.md).

The output layer: a target's is int8w with its best logits computed again in float32
(``ssd.models.rescored_logits``), as at int4; a draft's is plain int8w. A layer whose input width is not a multiple
of ``WIDTH_BLOCK`` stays bfloat16: torch 2.13's kernel crashed the process on such widths (8, 24, 40 and 50
measured), where 16, 32, 48, 64 and 896 ran. CPU only (``ssd.models.capability``).
"""
from __future__ import annotations

import torch

from .weight_only import replace_linears

LEVELS = 127  # q in -LEVELS..LEVELS: symmetric, so a row's scale alone gives its weights
WIDTH_BLOCK = 16  # the kernel's input width must be a multiple of this


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] float32 -> (q [out, in] int8, scales [out] bfloat16): each row's largest weight is
    LEVELS steps, the step rounded to bfloat16 before the levels are found (the kernel reads it so)."""
    scales = (weight.abs().amax(1) / LEVELS).clamp(min=torch.finfo(torch.float32).tiny).to(torch.bfloat16)
    q = (weight / scales.float()[:, None]).round().clamp(-LEVELS, LEVELS).to(torch.int8)
    return q, scales


def dequantize(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float32 weights [out, in] the kernel multiplies by."""
    return q.float() * scales.float()[:, None]


class Int8WeightLinear(torch.nn.Module):
    """y = x W^T + b with W int8 [out, in] and a bfloat16 scale per output row, bias bfloat16. Takes and returns
    bfloat16."""

    def __init__(self, weight_int8: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear) -> tuple["Int8WeightLinear", float]:
        """The layer at int8w, and the largest change of one of its weights relative to its largest weight."""
        weight = layer.weight.detach().float()
        q, scales = quantize(weight)
        moved = float((dequantize(q, scales) - weight).abs().max() / weight.abs().max().clamp(min=1e-30))
        bias = layer.bias.detach().to(torch.bfloat16) if layer.bias is not None else None
        return cls(q, scales, bias), moved

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def quantizable(layer) -> bool:
    return (type(layer) is torch.nn.Linear and layer.in_features % WIDTH_BLOCK == 0
            and layer.weight.device.type == "cpu")


def to_int8_weights(model, *, head: bool) -> dict:
    """The model's linear layers at int8w, in place, and the rest in bfloat16; head: the output layer too (else it is
    left as it is). Returns the report: layers converted, kept, and the largest relative move of a weight."""
    return replace_linears(model, "int8w", head=head, quantizable=quantizable,
                           make=lambda name, layer: Int8WeightLinear.from_linear(layer))
