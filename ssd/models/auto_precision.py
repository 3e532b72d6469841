"""The ``auto`` choice of each model's precision: on a CPU the pair of precisions that makes SD fastest, predicted from
passes timed once; on a GPU its default (no timing). The decision, its measurements and its reason are a
``Precisions`` record, kept in the user cache by machine.

SD's decode rate at draft length K is E(a, K) / (K d + v(K + 1)) (``ssd.core.theory.expected_tokens``): d a draft step,
v(n) the target's pass over n tokens, a the acceptance rate. Each is a property of the precisions, so auto measures
each candidate once: the target's pass over 2 to 5 tokens and the draft's one-token step, one thread, eager; and a,
per target and draft precision, as the share of positions of a fixed text (``AGREEMENT_TEXTS``) where the draft's
greedy token is the target's. A weight-only kernel takes rows four at a time (``ssd.models.int4``), so a pass over 5
tokens can cost two over 4: pricing K from 1 to 4 lets such a precision be judged at the K that suits it."""
from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass, field

import torch

from ..core.theory import expected_tokens
from .capability import accelerator_precision, capability, capability_line, device_name, supported


MARGIN = 0.10  # a reduced-precision target must make SD at least 10% faster than a float32 target to be chosen
AUTO_KS = (1, 2, 3, 4)  # the draft lengths each pair is priced at: the target is timed over K + 1 = 2 to 5 tokens
RULE = 4  # what auto times and how; a new rule measures every machine again (2: targets keep float32 logits;
# 3: float32 timed through the faster matrix library, ssd.models.kernels; 4: the pair that makes SD fastest, the
# weight-only precisions among the candidates, acceptance measured per pair)

# What the acceptance rate is measured on: a function and a paragraph, as the course's two prompt sets are code and
# prose. Any fixed text serves: a is compared between precisions, never reported as a rate of the course's prompts.
AGREEMENT_TEXTS = (
    'def moving_average(values, window):\n'
    '    """Return the mean of each run of `window` consecutive values."""\n'
    '    if window <= 0:\n'
    '        raise ValueError("window must be positive")\n'
    '    total = sum(values[:window])\n'
    '    averages = [total / window]\n'
    '    for i in range(window, len(values)):\n'
    '        total += values[i] - values[i - window]\n'
    '        averages.append(total / window)\n'
    '    return averages\n',
    "The river had risen overnight, and by morning the old stone bridge stood in brown water up to its arches. "
    "People from the village gathered on the bank to watch the current carry branches, fence posts and once a "
    "wooden chair past them. Nobody spoke much. The baker said the last flood like this had come when he was a boy, "
    "and that the water had stayed for a week before it went back to the fields.",
)


@dataclass(frozen=True)
class Precisions:
    """What a pair runs at, and why: recorded in every bench JSON and notebook."""

    target: str
    draft: str
    reason: str
    capability: dict = field(default_factory=dict)
    # auto's measurements: {"target": {precision: {tokens: ms}}, "draft": {precision: ms},
    # "agreement": {target precision: {draft precision: a}}}
    measured_ms: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        return f"target {self.target}, draft {self.draft}"


def candidates(role: str, device, cap: dict) -> list[str]:
    """The precisions auto considers for a role on this device: float32, bfloat16 where the CPU has it natively, the
    weight-only int4 and int8w, and for a draft int8."""
    native_bf16 = "bfloat16" in cap["native"] if torch.device(device).type == "cpu" else supported("bfloat16", device)
    floats = ["float32"] + (["bfloat16"] if native_bf16 else [])
    weight_only = [p for p in ("int4", "int8w") if supported(p, device)]
    return floats + weight_only + (["int8"] if role == "draft" and supported("int8", device) else [])


def sd_rate(target_ms: dict, draft_ms: float, a: float, k: int) -> float:
    """SD's predicted decode tokens/s at draft length k: E(a, k) over k draft steps and a pass over k + 1 tokens."""
    return expected_tokens(a, k) / (k * draft_ms + float(target_ms[k + 1])) * 1000


def best_draft(target: str, target_ms: dict, draft_ms: dict, agreement: dict) -> tuple[float, str, int]:
    """(tokens/s, draft precision, K) of the fastest SD with this target."""
    curve = {int(n): ms for n, ms in target_ms[target].items()}
    return max((sd_rate(curve, ms, agreement[target][draft], k), draft, k)
               for draft, ms in draft_ms.items() for k in AUTO_KS)


def choose(target_ms: dict, draft_ms: dict[str, float], agreement: dict, cap: dict) -> Precisions:
    """The auto rule on measurements: target_ms {precision: {tokens: ms of a pass}}, draft_ms {precision: ms of a
    one-token step}, agreement {target precision: {draft precision: a}}. The pair whose SD is predicted fastest; a
    reduced-precision target only if that is MARGIN faster than the best with a float32 target."""
    if "float32" not in target_ms or not draft_ms:
        raise ValueError("auto needs the target's float32 times and at least one draft time")
    best = {target: best_draft(target, target_ms, draft_ms, agreement) for target in target_ms}
    fastest = max(best, key=lambda t: best[t][0])
    target = fastest if best[fastest][0] * (1 - MARGIN) >= best["float32"][0] else "float32"
    rate, draft, k = best[target]
    by_target = ", ".join(f"{t} {r:.1f} (draft {d}, K {kk})" for t, (r, d, kk) in best.items())
    steps = ", ".join(f"{p} {ms:.0f} ms" for p, ms in draft_ms.items())
    reason = (f"auto: target {target}, draft {draft}: SD predicted {rate:.1f} tokens/s at K {k}, the fastest pair (a "
              f"reduced-precision target must be {MARGIN:.0%} faster than float32's best); one thread, eager, the "
              f"acceptance rate measured per pair. Best by target: {by_target}; a draft step: {steps}; CPU "
              f"{capability_line(cap)}")
    measured = {"target": {t: {str(n): ms for n, ms in c.items()} for t, c in target_ms.items()},  # JSON's keys
                "draft": dict(draft_ms), "agreement": {t: dict(a) for t, a in agreement.items()}}
    return Precisions(target, draft, reason, cap, measured)


@torch.inference_mode()
def greedy_tokens(model, texts: list[list[int]]) -> torch.Tensor:
    """The model's greedy next token at every position of each text (token ids), one after another: what the
    acceptance rate a is measured from."""
    device = next(model.parameters()).device
    return torch.cat([model(torch.tensor([ids], device=device)).logits[0].argmax(-1).cpu() for ids in texts])


def agreement(target_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> float:
    """The share of positions where the draft's greedy token is the target's: greedy SD's acceptance rate there."""
    return (target_tokens == draft_tokens).float().mean().item()


def fixed(target: str, draft: str, cap: dict | None = None, why: str = "as asked") -> Precisions:
    cap = cap or capability()
    return Precisions(target, draft, f"{why}: target {target}, draft {draft}; CPU {capability_line(cap)}", cap)


def decision_path(cache_root, pair_name: str, device, cap: dict):
    """Where auto's decision for this pair, device and machine is kept: a change of any of them measures again."""
    key = json.dumps([pair_name, str(device), cap["cpu"], cap["isa"], cap["flags"], cap["torch"], MARGIN, AUTO_KS,
                      RULE])
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


