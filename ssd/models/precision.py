"""A model's precision: what the CPU supports, converting a model, and the ``auto`` choice.

Precision decides the regime speculation runs in (docs/precision.md, "The regime"). On a CPU a float32 pass over K + 1
tokens costs two or more one-token steps; in bfloat16, on a CPU with native bfloat16 dot products (avx512_bf16,
AMX), it costs about 1.2 steps (with float32 logits), near a GPU's one; an int8 draft costs a fraction of the
target's step. Both ratios decide
what SD and SSD can gain, and both are properties of the machine, so ``auto`` measures them instead of guessing:

- target: float32, or bfloat16 where the CPU has native bfloat16 arithmetic, whichever verifies K + 1 tokens faster
  (float32 unless bfloat16 is at least ``MARGIN`` faster: float32 is the exact reference). The target stays a
  floating-point model: int8 quantizes activations too and changes its outputs more than rounding does, and the
  target is what every method must reproduce. int8 and float16 remain one flag away.
- draft: float32, bfloat16 (where native) or int8, whichever drafts one token fastest. The draft's precision
  changes only speed and acceptance, never the output.

The measurement takes about a minute once per machine, pair and torch version (one thread, context 128); the
decision, its timings and its reason are kept in the user cache and recorded in every bench JSON and notebook.

int8 is torch's dynamic quantization of the linear layers (weights int8, activations quantized per call), CPU only.
torch 2.13 says that API moves to torchao; torchao 0.18's maintained path was measured on this project's CPUs and
not used: eager ``Int8DynamicActivationInt8WeightConfig`` drafts at 137-150 ms a token against torch.ao's 63-70 ms
(0.5B draft, one thread), and under torch.compile it returned wrong tokens (docs/precision.md).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import warnings
from dataclasses import asdict, dataclass, field

import torch

from ..checks import check_precision_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MARGIN = 0.10  # a reduced-precision target must verify at least 10% faster than float32 to be chosen
AUTO_K = 4  # the draft length the target's verify pass is timed at (K + 1 = 5 tokens)
RULE = 3  # what auto times and how; a new rule measures every machine again (2: targets keep float32 logits;
# 3: float32 timed through the faster matrix library, ssd.models.kernels)
# CPU flags worth recording: the vector ISA, and native low-precision dot products (x86 /proc/cpuinfo, aarch64 names).
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8",
         "amx_fp16", "asimd", "bf16", "i8mm", "sve", "sve2")
NATIVE = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"), "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}


def check_precision(value, parameter: str = "dtype", allow_auto: bool = True) -> str:
    """The precision's name, or a ValueError naming the parameter and what is allowed."""
    if isinstance(value, torch.dtype):
        value = next((name for name, d in DTYPES.items() if d == value), str(value))
    return check_precision_name(value, parameter, allow_auto)


# ---- what the machine supports -------------------------------------------------------------------------------------


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The recorded subset of the CPU's feature flags (empty where /proc/cpuinfo is not readable)."""
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        return ()
    found = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            found.update(value.split())
    return tuple(flag for flag in FLAGS if flag in found)


@functools.cache
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.split(":")[0].strip() in ("model name", "Model name", "CPU part"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device) -> str:
    """'NVIDIA H200', 'Apple MPS' or the CPU's model: what a measurement says it ran on."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "Apple MPS" if device.type == "mps" else cpu_model()


def capability() -> dict:
    """What this CPU offers: torch's vector ISA, the recorded flags, and the native reduced precisions."""
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "flags": list(flags),
        "native": [p for p, needs in NATIVE.items() if any(f in flags for f in needs)],
        "int8_engine": torch.backends.quantized.engine,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
    }


def machine_kind(device="cpu", cap: dict | None = None) -> dict:
    """What decides a measurement's numbers beside the pair and its precisions: the device's type and name (the GPU,
    or the CPU's model) and the CPU's vector ISA and recorded flags. Timings, dates and core counts are left out: they
    never repeat, and a stored result must be recognised on every machine of its kind."""
    return kind_of({"device": str(device), "device_name": device_name(device), "capability": cap or capability()})


def kind_of(environment: dict) -> dict:
    """machine_kind as a stored bench's `environment` record gives it."""
    cap = environment.get("capability", {})
    return {"device": torch.device(environment.get("device", "cpu")).type,
            "device_name": environment.get("device_name") or cap.get("cpu"), "isa": cap.get("isa"),
            "flags": sorted(cap.get("flags", []))}


def kind_line(kind: dict) -> str:
    """'Intel(R) Xeon(R) Processor, AVX512 (avx2, avx512_bf16, ...)' or 'NVIDIA H200': one line for a note."""
    if kind["device"] != "cpu" or not kind["isa"]:
        return kind["device_name"] or "a machine the result did not record"
    return f"{kind['device_name']}, {kind['isa']} ({', '.join(kind['flags']) or 'no recorded flags'})"


def capability_line(cap: dict | None = None) -> str:
    """One line for a figure or a table: 'Intel Xeon ..., AVX512, native bfloat16'."""
    cap = cap or capability()
    native = ", ".join(f"native {p}" for p in cap["native"]) or "no native bfloat16 or float16"
    return f"{cap['cpu']} ({cap['cores']} cores), {cap['isa']}, {native}"


def supported(precision: str, device) -> bool:
    return unsupported_reason(precision, device) is None


def unsupported_reason(precision: str, device) -> str | None:
    """Why a precision cannot run on a device (None: it can). float32 runs everywhere; bfloat16 and float16 run on
    any CPU, if slowly where not native."""
    device = torch.device(device)
    if precision == "int8" and device.type != "cpu":
        return "int8 runs on CPUs only (torch's dynamic quantization); use bfloat16 or float16 there"
    if precision == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 arithmetic (before Ampere); use float16 or float32"
    if precision == "bfloat16" and device.type == "mps" and not _mps_bfloat16():
        return "MPS has bfloat16 from macOS 14 on; use float16 or float32"
    return None


def check_supported(precision: str, device, parameter: str) -> None:
    """A ValueError naming the parameter where the precision cannot run on the device."""
    reason = unsupported_reason(precision, device)
    if reason:
        raise ValueError(f"{parameter}={precision} is not supported on {device}: {reason}")


def _mps_bfloat16() -> bool:
    try:
        torch.ones(1, dtype=torch.bfloat16, device="mps")
        return True
    except (RuntimeError, TypeError):
        return False


def accelerator_precision(device) -> str | None:
    """What auto runs both models at on a GPU: bfloat16 on CUDA where the GPU has it (else float16), float16 on MPS
    (its bfloat16 needs macOS 14); None on a CPU, where auto measures instead. A GPU verifies K + 1 tokens in about
    one step at any of these precisions, so no timing is needed to decide."""
    device = torch.device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "float16" if device.type == "mps" else None


def accelerator_auto(device, cap: dict) -> Precisions | None:
    """auto's decision on a GPU (accelerator_precision for both models), or None on a CPU."""
    chosen = accelerator_precision(device)
    if chosen is None:
        return None
    return fixed(chosen, chosen, cap, why=f"auto on {device} ({device_name(device)}; the GPU default, no timing)")


# ---- converting a model --------------------------------------------------------------------------------------------


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


def convert(model, precision: str, parameter: str = "dtype", *, float_logits: bool = False):
    """The model at this precision, in place (int8 replaces the Linear layers).

    float_logits (a target's): at bfloat16 or float16, an untied output layer stays float32 (FloatLogits), so the
    logits are not rounded to the reduced precision. A tied one shares its weights with the input embedding and
    follows the model's precision.
    """
    precision = check_precision(precision, parameter, allow_auto=False)
    if precision == "int8":
        return _quantize(model, parameter)
    head = model.get_output_embeddings()
    keep = float_logits and precision != "float32" and isinstance(head, torch.nn.Linear) and (
        head.weight is not model.get_input_embeddings().weight)
    if keep:
        model.set_output_embeddings(torch.nn.Identity())  # out of the way of the conversion below
    model = model.to(DTYPES[precision])
    if keep:
        model.set_output_embeddings(FloatLogits(head))
    return model


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
    """float32 | bfloat16 | float16 | int8, read off the model itself."""
    if any(type(m).__module__.startswith("torch.ao.nn.quantized") for m in model.modules()):
        return "int8"
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


# ---- the choice ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Precisions:
    """What a pair runs at, and why: recorded in every bench JSON and notebook."""

    target: str
    draft: str
    reason: str
    capability: dict = field(default_factory=dict)
    measured_ms: dict | None = None  # the auto rule's timings: {"target": {precision: ms}, "draft": {...}}

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        return f"target {self.target}, draft {self.draft}"


def candidates(role: str, device, cap: dict) -> list[str]:
    """The precisions auto considers for a role on this device."""
    native_bf16 = "bfloat16" in cap["native"] if torch.device(device).type == "cpu" else supported("bfloat16", device)
    floats = ["float32"] + (["bfloat16"] if native_bf16 else [])
    if role == "target":
        return floats
    return floats + (["int8"] if supported("int8", device) else [])


def choose(target_ms: dict[str, float], draft_ms: dict[str, float], cap: dict) -> Precisions:
    """The auto rule on measured times (ms): target_ms a (K + 1)-token verify pass, draft_ms a one-token step."""
    if "float32" not in target_ms or not draft_ms:
        raise ValueError("auto needs the target's float32 time and at least one draft time")
    fastest = min(target_ms, key=target_ms.get)
    target = fastest if target_ms[fastest] <= (1 - MARGIN) * target_ms["float32"] else "float32"
    draft = min(draft_ms, key=draft_ms.get)
    times = lambda ms: ", ".join(f"{p} {v:.0f} ms" for p, v in ms.items())  # noqa: E731
    reason = (f"auto: target {target} (a {AUTO_K + 1}-token verify pass, one thread: {times(target_ms)}; a reduced "
              f"precision must be {MARGIN:.0%} faster than float32), draft {draft} (a one-token step: "
              f"{times(draft_ms)}); CPU {capability_line(cap)}")
    return Precisions(target, draft, reason, cap, {"target": dict(target_ms), "draft": dict(draft_ms)})


def fixed(target: str, draft: str, cap: dict | None = None, why: str = "as asked") -> Precisions:
    cap = cap or capability()
    return Precisions(target, draft, f"{why}: target {target}, draft {draft}; CPU {capability_line(cap)}", cap)


def decision_path(cache_root, pair_name: str, device, cap: dict):
    """Where auto's decision for this pair, device and machine is kept: a change of any of them measures again."""
    key = json.dumps([pair_name, str(device), cap["cpu"], cap["isa"], cap["flags"], cap["torch"], MARGIN, AUTO_K, RULE])
    return cache_root / "precision" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_decision(path) -> Precisions | None:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        return Precisions(**json.loads(path.read_text()))
    return None


def save_decision(path, decision: Precisions) -> None:
    from ..files import atomic_path  # files imports pandas; keep this module light to import

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(str(path)) as tmp, open(tmp, "w") as f:
        json.dump(decision.as_dict(), f, indent=1)
