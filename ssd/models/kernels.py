"""Which library multiplies a float32 model's matrices on this CPU: torch's default or oneDNN, whichever is faster.

On a CPU torch sends a float32 ``nn.Linear`` to MKL's sgemm. On this project's AMD EPYC (AVX2) that product is slow
for a handful of rows, the shapes decoding lives on: the 1.5B target's MLP projection (8960 x 1536) takes 2.8 ms for
one row but 6 ms for two and 9-19 ms for 4 to 8 (a verify pass, a batch's step), where streaming the weights once
should cost about what one row costs; its output layer (151936 x 1536) 74 ms for one row, 262 ms for five. oneDNN,
which torch also ships, does the same products in 1.9 / 4.4-8.3 ms and 39 / 83 ms (``kernels`` in docs/precision.md).
Which library is faster is a property of the machine (MKL picks its code path by CPU vendor), so it is measured, not
assumed: ``choose`` times a layer shaped like the model's largest (below its output layer) at one row and at eight
with each library, once per process and shape, and keeps oneDNN only if it is at least ``MARGIN`` faster.

The model is unchanged but for the class of its float32 ``nn.Linear`` layers (``OneDNNLinear``: same weights, same
state dict). The output differs from torch's default only by the rounding of a different summation order; every
method and every peer runs the same model, so the greedy identity with AR is unaffected, and the tests check it on
the swapped layers. int8 (torch.ao's packed layers), bfloat16 and float16 layers and GPU models are left as they are;
a reduced-precision target's output layer is float32 (``ssd.models.precision.FloatLogits``) and is timed like any.
"""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

MARGIN = 0.10  # oneDNN must be this much faster than torch's default to be used: the default is the known path
ROWS = (1, 8)  # the rows a layer is timed at: an AR step, a verify pass or a batch's step
REPEATS = 5  # timed calls per library and shape (the fastest counts: the clock only ever adds)

_decisions: dict[tuple, dict] = {}  # (shape, threads) -> the choice made: what bench JSONs record


def available() -> bool:
    """Whether this torch has oneDNN's linear (an x86 or ARM build with mkldnn)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear through oneDNN: x [..., in] -> [..., out]."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class OneDNNLinear(torch.nn.Linear):
    """An nn.Linear whose product runs in oneDNN (a layer's class is swapped in place: ``use_onednn``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and self.weight.requires_grad:  # oneDNN's op has no backward: training keeps torch's
            return F.linear(x, self.weight, self.bias)
        return onednn_linear(x, self.weight, self.bias)


def float32_linears(model) -> list[torch.nn.Linear]:
    """The model's plain float32 nn.Linear layers on a CPU (what the choice is about)."""
    return [m for m in model.modules() if type(m) in (torch.nn.Linear, OneDNNLinear)
            and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]


def choose(model) -> dict | None:
    """Time a layer shaped like the model's largest float32 one below its output layer with each library, and run
    every float32 nn.Linear of the model through the faster (oneDNN only where it is faster by MARGIN). Returns the
    decision (None: nothing to decide)."""
    layers = float32_linears(model)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    body = [m for m in layers if m is not head] or layers
    if not body or not available():
        return None
    probe = max(body, key=lambda m: m.weight.numel())
    decision = decide(tuple(probe.weight.shape), torch.get_num_threads())
    (use_onednn if decision["library"] == "onednn" else use_torch)(model)
    return decision


def decide(shape: tuple[int, int], threads: int) -> dict:
    """The faster library for a [out, in] float32 weight at ROWS rows on `threads` threads, timed once per process
    (random values: the time does not depend on them)."""
    if (shape, threads) not in _decisions:
        _decisions[(shape, threads)] = _timed_choice(shape, threads)
    return _decisions[(shape, threads)]


def _timed_choice(shape: tuple[int, int], threads: int) -> dict:
    weight = torch.randn(shape)
    ms = {"torch": 0.0, "onednn": 0.0}
    for rows in ROWS:
        x = torch.randn(1, rows, shape[1])
        ms["torch"] += _fastest_ms(lambda: F.linear(x, weight))
        if ms["onednn"] == float("inf"):
            continue  # it failed at a smaller row count: no need to fail again
        try:
            ms["onednn"] += _fastest_ms(lambda: onednn_linear(x, weight, None))
        except RuntimeError:  # a build whose oneDNN lacks this product (some ARM builds): torch's it is
            ms["onednn"] = float("inf")
    library = "onednn" if ms["onednn"] <= (1 - MARGIN) * ms["torch"] else "torch"
    return {"library": library, "shape": list(shape), "threads": threads, "rows": list(ROWS),
            "ms": {k: round(v, 3) if v != float("inf") else None for k, v in ms.items()}}


@torch.inference_mode()
def _fastest_ms(call) -> float:
    call()  # the first call pays for allocation (and oneDNN's primitive)
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def use_onednn(model) -> None:
    """Run every float32 nn.Linear of the model through oneDNN (in place; weights untouched)."""
    for layer in float32_linears(model):
        layer.__class__ = OneDNNLinear


def use_torch(model) -> None:
    """Undo use_onednn: every layer back to torch's nn.Linear."""
    for layer in model.modules():
        if type(layer) is OneDNNLinear:
            layer.__class__ = torch.nn.Linear


def library_of(model) -> str:
    """onednn | torch: how the model's float32 layers multiply (torch where it has none)."""
    return "onednn" if any(type(m) is OneDNNLinear for m in model.modules()) else "torch"


def library_line(pair) -> str:
    """What the command line says after loading: "target onednn, draft torch (timed 8960 x 1536 at 1 and 8 rows, 2
    threads: oneDNN 6.6 ms, torch 11.0 ms)"."""
    timed = "; ".join(_timed(d) for d in decisions())
    return f"target {library_of(pair.target)}, draft {library_of(pair.draft)}" + (f" (timed {timed})" if timed else "")


def _timed(decision: dict) -> str:
    ms = {k: "unavailable" if v is None else f"{v:.1f} ms" for k, v in decision["ms"].items()}
    threads = decision["threads"]
    return (f"{decision['shape'][0]} x {decision['shape'][1]} at {' and '.join(map(str, decision['rows']))} rows, "
            f"{threads} thread{'s' * (threads != 1)}: oneDNN {ms['onednn']}, torch {ms['torch']}")


def decisions() -> list[dict]:
    """Every choice this process made (recorded in bench JSONs beside the precisions)."""
    return list(_decisions.values())
