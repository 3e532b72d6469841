"""Where the models run: a device name checked and made a torch.device, in one place.

``auto`` is CUDA where this torch sees an NVIDIA GPU, else Apple's MPS, else the CPU. A device that is named but not
there fails at once with one line naming the parameter (a CPU build of torch sees no GPU, whatever the machine has).

What each kind of device runs at by default lives in ``ssd.models.capability`` (``accelerator_precision``); the
pipeline's second device is ``drafter_device``'s choice.
"""
from __future__ import annotations

import torch

KINDS = ("cpu", "cuda", "mps")
NAMES = "auto, cpu, cuda, cuda:N or mps"


def mps_available() -> bool:
    return bool(getattr(torch.backends, "mps", None)) and torch.backends.mps.is_available()


def accelerator() -> torch.device | None:
    """The GPU auto would pick: cuda, else mps; None on a machine with neither."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("mps") if mps_available() else None


def why_no_cuda() -> str:
    if torch.version.cuda is None:
        return (f"this torch ({torch.__version__}) is the CPU build; on a machine with an NVIDIA GPU, `make install` "
                "installs the CUDA build of the pinned torch from PyPI")
    return f"this torch (CUDA {torch.version.cuda}) sees no NVIDIA GPU (driver, CUDA_VISIBLE_DEVICES?)"


def resolve_device(device="auto", parameter: str = "device") -> torch.device:
    """auto | cpu | cuda | cuda:N | mps (or a torch.device) -> the torch.device, present on this machine."""
    name = str(device).strip() if device is not None else ""
    if name == "auto":
        return accelerator() or torch.device("cpu")
    try:
        found = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        found = None
    if found is None or found.type not in KINDS:
        raise ValueError(f"{parameter} must be one of {NAMES}; got {device!r}")
    if found.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{parameter}={name!r} but torch.cuda.is_available() is False: {why_no_cuda()}")
        count = torch.cuda.device_count()
        if found.index is not None and found.index >= count:
            raise ValueError(f"{parameter}={name!r} but this machine has {count} CUDA device(s): cuda:0 to "
                             f"cuda:{count - 1}")
    if found.type == "mps" and not mps_available():
        raise ValueError(f"{parameter}={name!r} but torch.backends.mps.is_available() is False: MPS needs Apple "
                         "Silicon, macOS 12.3 or later and a torch built with MPS")
    return found


def drafter_device(verifier: torch.device, spawned: bool = True) -> torch.device:
    """The pipeline drafter's device when none is given: the GPU after the verifier's (cuda:1 beside cuda:0), else
    the CPU. A drafter this process spawns needs that GPU here; under torchrun it may be another host's."""
    verifier = torch.device(verifier)
    if verifier.type != "cuda":
        return torch.device("cpu")
    drafter = torch.device("cuda", (verifier.index or 0) + 1)
    if spawned and drafter.index >= torch.cuda.device_count():
        raise ValueError(f"the pipeline needs a second GPU for its drafter: the verifier is on {verifier} and this "
                         f"machine has {torch.cuda.device_count()} CUDA device(s); give draft_device='cpu' to draft on "
                         "the CPU, or run one rank per host with torchrun (docs/pipeline.md, two hosts)")
    return drafter


def synchronize(device) -> None:
    """Wait for the device's queued work (a GPU runs asynchronously): before reading a clock."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()

