"""Timing a model's forward passes: the primitive every latency measurement of the kit is made of (the precision
``auto`` picks, the latency profiles of ``ssd.bench.profile``, the CUDA-graph check)."""
from __future__ import annotations

import statistics
import time

import torch

from ..core.cached_model import CachedModel
from .devices import synchronize

CONTEXT = 128  # tokens already in the KV cache when a pass is timed


def round_robin_ms(sizes, reps: int, device, run, undo=lambda n: None) -> dict[int, float]:
    """Median milliseconds of run(n) for each n in sizes; undo(n), untimed, puts the state back after each. The sizes
    are timed round-robin, one warm-up round first, so that a slow spell of the machine falls on all of them alike:
    the ratios between sizes are what a curve is for."""
    times = {n: [] for n in sizes}
    for rep in range(reps + 1):
        for n in sizes:
            synchronize(device)
            start = time.perf_counter()
            run(n)
            synchronize(device)
            if rep:
                times[n].append(time.perf_counter() - start)
            undo(n)
    return {n: 1000 * statistics.median(t) for n, t in times.items()}


def fixed_ids(model, length: int) -> torch.Tensor:
    """Any fixed tokens of the model's vocabulary: time is what counts."""
    return torch.arange(length) * 7919 % min(model.config.vocab_size, 30_000)


@torch.inference_mode()
def curve_ms(model, sizes, *, context: int = CONTEXT, reps: int = 3, batch: int = 1) -> dict[int, float]:
    """Median milliseconds of one causal forward over n new tokens (a verify pass over K + 1 = n tokens) in each of
    `batch` rows after `context` cached tokens, for each n in sizes (``round_robin_ms``): through the decoding loops'
    own cache and forward (``CachedModel.logits``, the static cache in its shapes), each pass rolled back after."""
    cached = CachedModel(model, rows=batch)
    ids = fixed_ids(model, context + max(sizes)).tolist()
    rows = range(batch)
    cached.extend(dict.fromkeys(rows, ids[:context]))

    def undo(n):
        for row in rows:
            cached.rollback(context, row)

    return round_robin_ms(sizes, reps, model.device,
                          lambda n: cached.logits(dict.fromkeys(rows, ids[: context + n]), keep=n), undo=undo)


def forward_ms(model, new: int, *, context: int = CONTEXT, reps: int = 3) -> float:
    """curve_ms at one size."""
    return curve_ms(model, [new], context=context, reps=reps)[new]
