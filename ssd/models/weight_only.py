"""Converting a model's linear layers to a weight-only precision (``int4``, ``int8w``): what the two share."""
from __future__ import annotations

from typing import Callable

import torch


def replace_linears(model, precision: str, *, head: bool, quantizable: Callable, make: Callable) -> dict:
    """Every quantizable linear layer of the model replaced, in place, by ``make(name, layer)`` -> (its replacement,
    the largest move of a weight relative to the layer's largest); the output layer too where head (a tied one is
    copied first, so the input embedding's lookup stays); the rest of the model in bfloat16. Returns the report:
    the layers converted (``<precision>_layers``), those kept, and the largest relative move of a weight."""
    output = model.get_output_embeddings()
    if head and output is not None and output.weight is model.get_input_embeddings().weight:
        output.weight = torch.nn.Parameter(output.weight.detach().clone())
    moved, kept = [], []
    for name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            full_name = f"{name}.{child_name}".lstrip(".")
            if child is output and not head:
                continue
            if quantizable(child):
                layer, move = make(full_name, child)
                setattr(parent, child_name, layer)
                moved.append(move)
            elif type(child) is torch.nn.Linear:
                kept.append(full_name)
    model.to(torch.bfloat16)
    return {f"{precision}_layers": len(moved), "kept_bfloat16": kept, "largest_move": max(moved, default=0.0)}
