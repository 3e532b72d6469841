"""A pass replayed from a CUDA graph: how much of a GPU's step is the host launching kernels.

In eager PyTorch a small model's step on a GPU is launch-bound: the host issues some four hundred kernels a step, each
waiting its turn, and the GPU idles between them (on an H200 the offline pair's 1.5B target took about 20 ms a step
against a 0.9 ms memory floor, and its 0.5B draft nearly as long). A CUDA graph records a pass's kernels once and
replays them with one launch. That needs fixed addresses, so the pass runs on transformers' ``StaticCache`` (its
tensors allocated once; the write position a device tensor) rather than the dynamic cache the kit decodes with.

``pass_ms`` times one pass over ``new`` tokens in each of ``batch`` rows after ``context`` cached ones, on a static
cache, eager or replayed from a graph (CUDA only). `make gpu-check` times both for the pair's shapes
(ssd.bench.gpu_check), to measure what a graphed decoder would change; the kit's decoding does not use graphs.
"""
from __future__ import annotations

import torch
from transformers import StaticCache

from ..models.timing import CONTEXT, fixed_ids, round_robin_ms

WARM_UPS = 3  # calls before a capture, off the default stream


def static_pass(model, batch: int, new: int, context: int = CONTEXT):
    """A zero-argument function running one pass over `new` fixed tokens per row after `context` cached ones, on a
    static cache filled once; each call leaves the cache's write position where it found it, so every call (and
    every replay of a graph of it) is the same pass."""
    device = model.device
    cache = StaticCache(config=model.config, max_cache_len=context + new)
    ids = fixed_ids(model, context + new)[None].expand(batch, -1).to(device)
    positions = torch.arange(context + new, device=device)[None].expand(batch, -1)
    with torch.inference_mode():
        model(input_ids=ids[:, :context], cache=cache, position_ids=positions[:, :context], use_cache=True)

    def run() -> torch.Tensor:
        logits = model(input_ids=ids[:, context:], cache=cache, position_ids=positions[:, context:],
                       use_cache=True, logits_to_keep=new).logits
        # transformers (5.24) keeps each layer's write position as a device tensor it advances in place: put it
        # back in place too, which a graph records like any other kernel
        for layer in cache.layers:
            layer.cumulative_length.sub_(new)
        return logits

    return run


def graphed(run):
    """The same pass captured in a CUDA graph: (replay, the output tensor each replay overwrites)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # capture needs the lazy work of a first call done, off the default stream
        for _ in range(WARM_UPS):
            run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    return graph.replay, out


@torch.inference_mode()
def pass_ms(model, batch: int, new: int, *, graph: bool, context: int = CONTEXT, reps: int = 10) -> float:
    """Median ms of one pass over batch x new tokens on a static cache, eager or (graph=True, CUDA) replayed."""
    if graph and model.device.type != "cuda":
        raise ValueError(f"graph=True needs a CUDA device; the model is on {model.device}")
    run = static_pass(model, batch, new, context)
    call = graphed(run)[0] if graph else run
    return round_robin_ms([new], reps, model.device, lambda n: call())[new]
