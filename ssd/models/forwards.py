"""How a model's forward runs: ``eager`` (PyTorch op by op: the exact reference, what the unit tests use) or
``compiled`` (torch.compile: inductor on a CPU, CUDA graphs on a GPU).

Why: eager, a step is a few hundred small ops the host runs one by one around the matrix products. On a GPU that is
most of a small model's step (the H200's eager steps were launch-bound: 18-41 ms against a 0.9 ms memory floor). On
this project's 2-core CPUs the products dominate (137 of the 1.5B bfloat16 target's 173 ms a step), so compiling
buys a few percent there (docs/precision.md, "Compiled forwards"); fewer bytes a weight (``int4``) is the lever.

What compiles: the model's decoder (its ``base_model``) over a block of at most ``MAX_WIDTH`` slots on a KV cache that
already holds its buffers: the target's step and its K + 1 verify pass, the draft's step and its tree pass. A wider
block and a first pass (a prompt's) run eager on the same weights and cache, as does the output layer (on a CPU
inductor would multiply a float32 output layer with MKL, 2.5 times slower than the oneDNN ``ssd.models.kernels``
picks on this project's AMD EPYC).

One graph serves every width, batch and cache bucket (``dynamic=True``; a width of 1 gets its own): a decode meets a
few widths (1, K + 1 and the shorter passes at an answer's end) in a few buckets, and a graph per shape cost some 30 s
each. A compiled model still runs in fixed shapes (``CachedModel``'s ``fixed_shapes``, read off the model's
``fixed_shapes`` attribute set here): attention over the cache's whole bucket, batches and tree branches in
power-of-two buckets, so that the shapes a graph meets are few and a CUDA graph can be replayed.

On a CPU inductor compiles without freezing (weights as constants): with it a later process missed inductor's cache
and took 46 s to its first token against 26 without, for no faster a step at int4. The decoder's float32 layers go
back to torch's ``nn.Linear`` first (the oneDNN layer of ``ssd.models.kernels`` is an op inductor cannot trace). On a
GPU the mode is ``reduce-overhead``: CUDA graphs, which need the cache's buffers at fixed addresses
(``ssd.core.static_cache`` marks them so).

What a compile makes is kept in the user cache (inductor's cache, ``TORCHINDUCTOR_CACHE_DIR``, under ``~/.cache/ssd``
unless the user set the variable): a later process traces the model again but compiles nothing (the offline pair at
int4: about 10 s of tracing a graph; SD meets four, the draft's widths 1 and 2, the target's K + 1 and, at an answer's
end, 1, which took about 2 minutes the first time). Float constants are specialized (``specialize_float``): traced as
symbols, each graph was traced twice. The cache's heads and head size are static (``ssd.core.static_cache``): a head
size equal to a bucket's slots would otherwise share its symbol and hold the graph to that bucket.
"""
from __future__ import annotations

import os
import time

import torch

from ..checks import check_choice
from ..files import cache_dir
from ..names import FORWARDS
from .gguf_store import log
from .kernels import use_torch

MAX_WIDTH = 16  # blocks of at most this many slots run compiled: a step, a verify pass, a tree depth's branches
# Graphs per model before torch runs a new shape eager (and warns): dynamic shapes need a few (a width of 1, then one
# for the rest, and a recompile where a guard on the sizes fails); torch's default of 8 was met by a static-shape bench
MAX_GRAPHS = 32
INDUCTOR_CACHE = "inductor"  # under the user cache
# What the first compile costs, as measured (docs/precision.md, "Compiled forwards"): said before it starts
FIRST_COMPILE = ("the offline pair's two models at int4, SD's four graphs: about 2 minutes on 2 CPU cores the first "
                 "time, 40 s in a later process, which reads inductor's cache but traces again, its first tokens 20 s "
                 "after its start; a tiny model: seconds")


def check_forward(value, parameter: str = "forward") -> str:
    return check_choice(value, parameter, FORWARDS)


def forward_of(model) -> str:
    """eager | compiled: how the model's forward runs."""
    return "compiled" if getattr(model, "compiled_shapes", None) is not None else "eager"


def set_forward(pair, forward: str, progress: bool = True):
    """The pair with both models' forwards run as `forward` says (compiled: in place), and recorded on it."""
    pair.forward = check_forward(forward)
    if forward == "compiled":
        compile_forward(pair.target, "target", progress)
        compile_forward(pair.draft, "draft", progress)
    return pair


def compile_forward(model, role: str = "model", progress: bool = True):
    """The model with its decoder's forward compiled (in place), to run in fixed shapes. role names it in the line
    the first compile prints."""
    if forward_of(model) == "compiled":
        return model
    body = model.base_model
    use_torch(body)
    _keep_inductor_cache_in_user_cache()
    on_gpu = model.device.type == "cuda"
    mode = {"mode": "reduce-overhead"} if on_gpu else {}
    compiled = torch.compile(body.forward, dynamic=True, fullgraph=True, **mode)
    eager, graphs = body.forward, {}

    def forward(*args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is None or ids.shape[1] > MAX_WIDTH or not _allocated(kwargs.get("cache")):
            return eager(*args, **kwargs)
        if not graphs:
            log(progress, f"compiling the {role}'s forward at its first decoding step ({FIRST_COMPILE})")
        start = time.perf_counter()
        with torch._dynamo.config.patch(recompile_limit=MAX_GRAPHS, accumulated_recompile_limit=4 * MAX_GRAPHS,
                                        specialize_float=True):
            out = compiled(*args, **kwargs)
        # the first call at each shape, which made its graph unless one made for another model of the same class in
        # this process serves it (the weights are the graph's inputs, not its constants)
        graphs.setdefault(_shape(kwargs), time.perf_counter() - start)
        return out

    body.forward = forward
    model.fixed_shapes = True  # CachedModel's default for this model: a graph holds its shapes
    model.compiled_shapes = graphs  # (rows, width, slots) run compiled -> seconds the first call at it took
    return model


def _keep_inductor_cache_in_user_cache() -> None:
    # torch writes its default (/tmp/torchinductor_<user>, lost at a reboot) into TORCHINDUCTOR_CACHE_DIR as soon as
    # torch._dynamo is imported, so only a value other than that default is the user's own choice, and stays.
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / INDUCTOR_CACHE)


def graphs_made() -> int:
    """Graphs torch.compile has made in this process (a count torch keeps)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _allocated(cache) -> bool:
    """Whether a forward runs on a KV cache whose buffers exist: the first forward over a cache allocates them, eager
    (a graph is for the passes that repeat, and a CUDA graph needs the buffers' addresses before it is recorded)."""
    return cache is not None and all(getattr(layer, "is_initialized", False) for layer in cache.layers)


def _shape(kwargs) -> tuple:
    """(rows, width, slots attention reads) of a block run compiled."""
    ids, mask = kwargs["input_ids"], kwargs.get("attention_mask")
    return (*ids.shape, mask.shape[-1] if mask is not None else 0)
