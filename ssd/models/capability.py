"""What the machine supports: the CPU's model and capability flags (the vector ISA, native bfloat16 and float16
dot products), a GPU's name, the machine kind every stored result records, and which precisions run where."""
from __future__ import annotations

import functools
import os
import platform
import re

import torch


# CPU flags worth recording: the vector ISA, and native low-precision dot products (x86 /proc/cpuinfo, aarch64 names).
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8",
         "amx_fp16", "asimd", "bf16", "i8mm", "sve", "sve2")
# The flag that names a CPU's folder in data/, strongest first: the one that decides what a verify pass costs there.
SLUG_FEATURES = (("amx_bf16", "amx"), ("avx512_bf16", "avx512-bf16"), ("avx512f", "avx512"), ("sve", "sve"),
                 ("bf16", "neon-bf16"), ("asimd", "neon"), ("avx2", "avx2"))
NATIVE = {"bfloat16": ("avx512_bf16", "amx_bf16", "bf16"), "float16": ("avx512_fp16", "amx_fp16", "asimdhp")}




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


def kind_slug(kind: dict) -> str:
    """The folder name of a kind of machine in data/: its vendor and model words, and for a CPU the feature that
    decides its regime (AMX, avx512_bf16, AVX-512, AVX2): 'intel-xeon-amx', 'amd-epyc-avx2', 'nvidia-h200'."""
    name = re.sub(r"\((r|tm)\)|\bprocessor\b|\bcpu\b|@.*", " ", (kind.get("device_name") or "unrecorded").lower())
    base = "-".join(re.findall(r"[a-z0-9]+", name)[:4]) or "unrecorded"
    if kind.get("device") != "cpu":
        return base
    flags = set(kind.get("flags") or [])
    feature = next((slug for flag, slug in SLUG_FEATURES if flag in flags), (kind.get("isa") or "cpu").lower())
    return f"{base}-{feature}"


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
    if precision == "int4" and device.type != "cpu":
        return "int4 runs on CPUs only (torch's int4 CPU kernel); use bfloat16 or float16 there"
    if precision == "int8w" and device.type != "cpu":
        return "int8w runs on CPUs only (torch's weight-only int8 CPU kernel); use bfloat16 or float16 there"
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


