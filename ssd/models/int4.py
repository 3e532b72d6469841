"""The ``int4`` precision: weight-only 4-bit linear layers in groups of 32, run by the kit's own kernel where the CPU
has avx512_bf16 (``ssd.models.int4_kernel``: a verify pass of up to 5 tokens costs about a step) and by torch's
(``aten._weight_int4pack_mm_for_cpu``) elsewhere, the same levels, scales and zeros in both, with the rest of the model
(embeddings, norms, attention, activations) in bfloat16.

Why: on a CPU a decoding step streams every weight once, so its time is the weights' bytes over the memory's
bandwidth. The offline pair's 1.5B target in bfloat16 spent 137 of its 173 ms a step in matrix products (compiled,
this project's AMD EPYC); at 4 bits a weight the same products read a quarter of the bytes (one 8960 x 1536 layer:
0.38 ms a row against 1.47 in bfloat16).

What is kept: the offline pair's weights come from GGUF Q4_K_M files, and Q4_K is itself 4-bit values with a scale
and a minimum per 32 weights: within such a group every weight is ``d * sc * q - dmin * m`` for q in 0..15. torch's
layout is the same shape of thing, ``(q - 8) * scale + zero`` per group of 32, so a Q4_K group maps onto it exactly
with ``scale = d * sc`` and ``zero = 8 * scale - dmin * m``. Both are found again from the float32 weights the kit
caches: a group's minimum is -dmin * m and its maximum 15 * d * sc - dmin * m where it holds a q of 0 and one of 15,
and there only the rounding of scale and zero to bfloat16, which torch's kernel takes, moves a weight; a group that
spans fewer levels gets a finer grid of its own, which rounds each weight by at most half its step. A Q6_K tensor of
the same file (its 64 levels) does not fit 16 and moves further; it is requantized to 16 levels all the same.
``to_int4``'s report (kept as ``model.int4_report``) gives the largest move of a weight, relative to its layer's
largest.

The output layer: a target's is int4 with its 64 best logits a position computed again in float32
(``ssd.models.rescored_logits``); a draft's is plain int4 (the draft's logits change only acceptance, never the
output). A layer whose input width is not a multiple of the group, or its output width of 16, stays bfloat16 (a
target's output layer then float32).

The kernel takes bfloat16 activations only on its vector path (float32 falls to a scalar loop some 30 times slower),
and a CPU only: int4 is refused on a GPU (``ssd.models.capability``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import int4_kernel
from .weight_only import replace_linears

GROUP = 32  # weights per scale and zero: Q4_K's sub-block
LEVELS = 15  # q in 0..LEVELS
MIDDLE = 8  # torch's kernel computes (q - MIDDLE) * scale + zero
OUT_BLOCK = 16  # the kernel packs output rows 16 at a time


@dataclass(frozen=True)
class Levels:
    """One layer's weights in int4, as the kernel takes them: the levels packed (in the layout of ``kernel()``'s
    kernel: torch's [out, in / 2] uint8, which depends on torch's version and the CPU's vector width, or the kit's
    blocks, ssd.models.int4_avx512_bf16.cpp), scales and zeros [in / GROUP, out, 2] bfloat16, and the largest move of
    a weight relative to the layer's largest. What a later load needs to skip the quantizing."""
    packed: torch.Tensor
    scales_and_zeros: torch.Tensor
    moved: float


def kernel() -> str:
    """Which kernel runs int4 on this machine: the kit's where the CPU has avx512_bf16 and it builds
    (ssd.models.int4_kernel), else torch's."""
    return "ssd" if int4_kernel.load() else "torch"


def kit_layout(packed: torch.Tensor) -> bool:
    """Whether packed levels are the kit's blocks (pack: 1-D, scales and zeros inside), not torch's [out, in / 2]."""
    return packed.dim() == 1


def kernel_of(model) -> str | None:
    """ssd | torch: the kernel the model's int4 layers run on (None: it has none), what a latency profile is of."""
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    return None if not layers else "ssd" if kit_layout(layers[0].packed) else "torch"


def pack(q: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    if kernel() == "ssd":
        return torch.ops.ssd_int4.pack(q, scales_and_zeros)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)


def levels_of(weight: torch.Tensor) -> Levels:
    q, scales_and_zeros = quantize(weight)
    moved = (dequantize(q, scales_and_zeros) - weight).abs().max() / weight.abs().max().clamp(min=1e-30)
    return Levels(pack(q, scales_and_zeros), scales_and_zeros, float(moved))


def found(levels: dict[str, Levels], name: str, layer: torch.nn.Linear) -> Levels:
    """The named layer's levels from levels, else quantized now and added to it."""
    if name not in levels:
        levels[name] = levels_of(layer.weight.detach().float())
    return levels[name]


class Int4Linear(torch.nn.Module):
    """y = x W^T + b with W in 4-bit groups: packed weights (torch's [out, in / 2] uint8, or the kit's blocks, 1-D:
    ``pack``), scales and zeros [in / GROUP, out, 2] bfloat16, bias bfloat16. Takes and returns bfloat16."""

    def __init__(self, packed: torch.Tensor, scales_and_zeros: torch.Tensor | None, bias: torch.Tensor | None,
                 in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)
        self.register_buffer("bias", bias)

    @classmethod
    def from_linear(cls, layer: torch.nn.Linear, levels: Levels | None = None) -> tuple["Int4Linear", float]:
        """The layer in int4, and the largest change of one of its weights relative to its largest weight. levels:
        this layer's, kept from an earlier conversion of the same weights (ssd.models.int4_store), else found here."""
        levels = levels or levels_of(layer.weight.detach().float())
        bias = layer.bias.detach().to(torch.bfloat16) if layer.bias is not None else None
        own = kit_layout(levels.packed)  # the kit's blocks hold their scales and zeros
        return (cls(levels.packed, None if own else levels.scales_and_zeros, bias, layer.in_features,
                    layer.out_features), levels.moved)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if kit_layout(self.packed):  # the kit's blocks: its kernel
            y = torch.ops.ssd_int4.mm(flat, self.packed, self.out_features)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_and_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group={GROUP}"


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] float32 -> (q [out, in] int32 in 0..LEVELS, scales and zeros [in / GROUP, out, 2] bfloat16):
    each group's minimum and maximum span the 16 levels (a Q4_K group's own scale and minimum, where it uses q = 0 and
    q = 15)."""
    out, width = weight.shape
    groups = weight.reshape(out, width // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)  # [out, in / GROUP]
    scale = ((high - low) / LEVELS).clamp(min=torch.finfo(torch.float32).tiny)
    zero = low + MIDDLE * scale
    # the levels from the scale and zero as the kernel will read them (bfloat16), so their rounding is not doubled
    scale_b, zero_b = scale.to(torch.bfloat16).float(), zero.to(torch.bfloat16).float()
    q = ((groups - zero_b[..., None]) / scale_b[..., None] + MIDDLE).round().clamp(0, LEVELS)
    scales_and_zeros = torch.stack([scale_b, zero_b], -1).transpose(0, 1).contiguous().to(torch.bfloat16)
    return q.reshape(out, width).to(torch.int32), scales_and_zeros


def dequantize(q: torch.Tensor, scales_and_zeros: torch.Tensor) -> torch.Tensor:
    """The float32 weights [out, in] the kernel multiplies by."""
    out, width = q.shape
    scale, zero = (scales_and_zeros[..., i].float().t()[..., None] for i in (0, 1))  # [out, in / GROUP, 1]
    return ((q.reshape(out, width // GROUP, GROUP) - MIDDLE) * scale + zero).reshape(out, width)


def quantizable(layer) -> bool:
    return (type(layer) is torch.nn.Linear and layer.in_features % GROUP == 0 and layer.out_features % OUT_BLOCK == 0
            and layer.weight.device.type == "cpu")


def to_int4(model, *, head: bool, levels: dict[str, Levels] | None = None) -> dict:
    """The model's linear layers in int4, in place, and the rest in bfloat16; head: the output layer too (else it is
    left as it is). Returns the report: layers converted, kept, and the largest relative move of a weight.

    levels: by layer name, each layer's int4 levels from an earlier conversion of the same weights; a layer not in
    it is quantized here and added to it (the caller keeps it: ssd.models.int4_store)."""
    levels = {} if levels is None else levels
    return replace_linears(model, "int4", head=head, quantizable=quantizable,
                           make=lambda name, layer: Int4Linear.from_linear(layer, found(levels, name, layer)))
