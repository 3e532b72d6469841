"""A model's precision: its names, and converting a model to one (a float dtype with float32 logits, int8, or the
weight-only int4 and int8w: ``ssd.models.int4``, ``ssd.models.int8_weights``).
What the machine supports is ``ssd.models.capability``; the ``auto`` choice ``ssd.models.auto_precision``.

Precision decides the regime speculation runs in (docs/precision.md, "The regime"). On a CPU a float32 pass over K + 1
tokens costs two or more one-token steps; in bfloat16, on a CPU with native bfloat16 dot products (avx512_bf16,
AMX), it costs about 1.2 steps (with float32 logits), near a GPU's one; an int8 draft costs a fraction of the
target's step. Both ratios decide
what SD and SSD can gain, and both are properties of the machine, so ``auto`` measures them instead of guessing:

auto keeps the pair of precisions that makes SD fastest (``ssd.models.auto_precision``): for the target float32,
bfloat16 where the CPU has native bfloat16 arithmetic, int4 or int8w (a reduced one only if it makes SD at least
``MARGIN`` faster: float32 is the exact reference); for the draft those or int8. The target is what every method must
reproduce: float16 stays one flag away, and int8 is a draft's only (``ssd.checks.check_target_precision``: it rounds
a verify pass's tokens on one activation scale, so no method could reproduce the target's AR). The draft's precision
changes only speed and acceptance, never the output.

The measurement takes about three minutes once per machine, pair and torch version (one thread, context 128); the
decision, its measurements and its reason are kept in the user cache and recorded in every bench JSON and notebook.

int8 is torch's dynamic quantization of the linear layers (weights int8, activations quantized per call), CPU only.
torch 2.13 says that API moves to torchao; torchao 0.18's maintained path was measured on this project's CPUs and
not used: eager ``Int8DynamicActivationInt8WeightConfig`` drafts at 137-150 ms a token against torch.ao's 63-70 ms
(0.5B draft, one thread), and under torch.compile it returned wrong tokens (docs/precision.md).
"""
from __future__ import annotations

import warnings

import torch

from ..checks import check_precision_name
from .capability import check_supported
from . import int4, int8_weights
from .int4 import Int4Linear, found, to_int4
from .int8_weights import Int8WeightLinear, to_int8_weights
from .rescored_logits import RescoredLogits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_ONLY = ("int4", "int8w")  # bfloat16 activations, quantized weights: their own kernels, CPU only


def check_precision(value, parameter: str = "dtype", allow_auto: bool = True) -> str:
    """The precision's name, or a ValueError naming the parameter and what is allowed."""
    if isinstance(value, torch.dtype):
        value = next((name for name, d in DTYPES.items() if d == value), str(value))
    return check_precision_name(value, parameter, allow_auto)


class FloatLogits(torch.nn.Module):
    """A reduced-precision model's output layer kept in float32: the last hidden state is widened and the logits are
    accumulated and kept in float32.

    In bfloat16 the logits of this pair's likeliest tokens (16 to 32) sit on a grid 0.125 apart, so near-ties become
    exact ties broken by token id, and a verify pass over K + 1 tokens breaks them differently from AR's one-token
    pass: with a bfloat16 head 4 of 32 HumanEval prompts left AR's greedy output (every time at a margin of 0 or one
    grid step), with this one none of 32 did (docs/findings.md, wall clock). It costs reading the head's weights in
    float32 (0.93 GB instead of 0.47 for the 1.5B target's untied head).
    """

    def __init__(self, head: torch.nn.Linear):
        super().__init__()
        self.head = head.float()

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden.float())


def convert(model, precision: str, parameter: str = "dtype", *, float_logits: bool = False, int4_levels=None):
    """The model at this precision, in place (int8 replaces the Linear layers).

    float_logits (a target's): at bfloat16 or float16, an untied output layer stays float32 (FloatLogits), so the
    logits are not rounded to the reduced precision. A tied one shares its weights with the input embedding and
    follows the model's precision. int4_levels: at int4, the layers' levels by name from an earlier conversion of the
    same weights, which what is quantized here joins (ssd.models.int4_store keeps them).
    """
    precision = check_precision(precision, parameter, allow_auto=False)
    if precision == "int8":
        return _quantize(model, parameter)
    if precision in WEIGHT_ONLY:
        check_supported(precision, model.device, parameter)
    int4_levels = {} if int4_levels is None else int4_levels
    head = model.get_output_embeddings()
    # the output layer's name keys its int4 levels; found before the layer leaves the model below
    head_name = next((n for n, m in model.named_modules() if m is head), None) if precision == "int4" else None
    keep = float_logits and precision != "float32" and isinstance(head, torch.nn.Linear) and (
        head.weight is not model.get_input_embeddings().weight)
    if keep:
        model.set_output_embeddings(torch.nn.Identity())  # out of the way of the conversion below
    if precision == "int4":  # a draft's output layer too: it changes only what is accepted (ssd.models.int4)
        model.int4_report = to_int4(model, head=not float_logits, levels=int4_levels)
    elif precision == "int8w":
        model.int8w_report = to_int8_weights(model, head=not float_logits)
    else:
        model = model.to(DTYPES[precision])
    if keep:  # weight-only: the reduced layer, its best logits again in float32 (ssd.models.rescored_logits)
        approximate = _reduced_head(precision, head, int4_levels, head_name)
        model.set_output_embeddings(RescoredLogits(head, approximate) if approximate is not None else FloatLogits(head))
    return model


def _reduced_head(precision: str, head: torch.nn.Linear, int4_levels: dict, head_name: str | None):
    """A target's output layer at a weight-only precision, or None (a float precision, or a layer the kernel cannot
    take): its logits then come from a float32 layer."""
    if precision == "int4" and int4.quantizable(head):
        return Int4Linear.from_linear(head, found(int4_levels, head_name, head))[0]
    if precision == "int8w" and int8_weights.quantizable(head):
        return Int8WeightLinear.from_linear(head)[0]
    return None


def _quantize(model, parameter: str):
    if model.device.type != "cpu":
        raise ValueError(f"{parameter}=int8 is CPU-only (torch's dynamic quantization); the model is on "
                         f"{model.device}: use bfloat16 or float16 there")
    model = model.float()
    with warnings.catch_warnings():
        # torch 2.13 announces that this API moves to torchao; torchao is slower here (module docstring).
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)


def precision_of(model) -> str:
    """float32 | bfloat16 | float16 | int8 | int4 | int8w, read off the model itself."""
    if any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules()):
        return "int8"
    if any(isinstance(m, Int4Linear) for m in model.modules()):
        return "int4"
    if any(isinstance(m, Int8WeightLinear) for m in model.modules()):
        return "int8w"
    return check_precision(next(model.parameters()).dtype, "model dtype", allow_auto=False)


def weight_bytes(model) -> int:
    """Bytes the model's weights take in memory (packed int8 weights included)."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for b in model.buffers())
    for m in model.modules():
        if isinstance(m, torch.ao.nn.quantized.dynamic.Linear):  # packed: int8 weight, float bias, no parameters
            weight, bias = m.weight(), m.bias()
            total += weight.numel() * weight.element_size()
            total += bias.numel() * bias.element_size() if bias is not None else 0
    return total


