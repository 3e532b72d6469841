"""The ``auto`` choice of each model's precision: on a CPU the candidates timed once and the faster kept (a reduced-
precision target only if it verifies ``MARGIN`` faster than float32); on a GPU its default (no timing). The decision,
its timings and its reason are a ``Precisions`` record, kept in the user cache by machine."""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, field

import torch

from .capability import accelerator_precision, capability, capability_line, device_name, supported


MARGIN = 0.10  # a reduced-precision target must verify at least 10% faster than float32 to be chosen
AUTO_K = 4  # the draft length the target's verify pass is timed at (K + 1 = 5 tokens)
RULE = 3  # what auto times and how; a new rule measures every machine again (2: targets keep float32 logits;
# 3: float32 timed through the faster matrix library, ssd.models.kernels)


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


def accelerator_auto(device, cap: dict) -> Precisions | None:
    """auto's decision on a GPU (accelerator_precision for both models), or None on a CPU."""
    chosen = accelerator_precision(device)
    if chosen is None:
        return None
    return fixed(chosen, chosen, cap, why=f"auto on {device} ({device_name(device)}; the GPU default, no timing)")


