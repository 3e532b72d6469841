"""The latencies every prediction of the kit is priced on: a pair's pass times at its precisions, on the cores
each rank has, at one batch size. A plain record: ``ssd.bench.profile`` measures and stores it; SD's and SSD's tuners
(``ssd.core.tuning``) and Theorem 7 (``ssd.core.theory``) read it through ``target_at``, ``draft_at`` and
``glue_at``."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


@dataclass
class Profile:
    """Latency curves of one pair at its precisions: ms per pass, keyed by tokens (target, glue) or rows (draft: one
    depth of the pre-speculation tree)."""

    pair: str
    precisions: dict  # ssd.models.auto_precision.Precisions.as_dict()
    capability: dict
    verifier_cores: list[int]
    drafter_cores: list[int]
    context: int
    target_ms: dict[int, float]  # verify pass over n tokens
    draft_ms: dict[int, float]  # one depth of the pre-speculation tree over n branch rows, draws included
    bandwidth_gbs: dict[str, float]  # per rank's core set: {"target": .., "draft": ..}
    step_bytes: dict[str, int]
    measured_at: str = ""
    glue_ms: dict[int, float] | None = None  # the draft's glue step over n new tokens; None: stored before v2
    batch_size: int = 1  # b: every curve timed over b rows at once (target: b x n tokens; draft: b x n rows)
    # The kit's commit that measured it (ssd.bench.machines.commit): which code a curve's timings belong to. "" in a
    # profile measured before it was recorded; a stored one backfilled from data/index.csv has the commit that stored
    # it, and commit_is says so ("": the commit that measured it).
    commit: str = ""
    commit_is: str = ""
    # Whose kernels ran the passes: "torch" (the kit's models) or "llama.cpp" (the GGUF files as they are,
    # ssd.bench.profile_llamacpp; precisions are then GGUF types such as Q4_K_M, and a core set is a thread count)
    engine: str = "torch"
    # llama.cpp at b = 1: one round of its speculative tool replayed on its engine, ms (median): its draft's pass over
    # the K + 1 tokens verified, K draft steps, the target's verify pass, and the whole round; "k": the K replayed.
    # None: not replayed (the kit's engine, b > 1)
    round_ms: dict | None = None
    forward: str = "eager"  # how the kit's models ran the passes: eager or compiled (ssd.models.forwards)

    def __post_init__(self):
        # JSON keys come back as strings
        self.target_ms = {int(n): float(v) for n, v in self.target_ms.items()}
        self.draft_ms = {int(n): float(v) for n, v in self.draft_ms.items()}
        if self.glue_ms is not None:
            self.glue_ms = {int(n): float(v) for n, v in self.glue_ms.items()}

    def floor_ms(self, role: str) -> float:
        """The one-token step of reading every weight once at the measured bandwidth."""
        return self.step_bytes[role] / (self.bandwidth_gbs[role] * 1e9) * 1000

    def target_at(self, tokens: float) -> float:
        """ms of a verify pass over `tokens` tokens, interpolated between the measured points."""
        return _interp(self.target_ms, tokens)

    def draft_at(self, rows: float) -> float:
        """ms of one depth of the pre-speculation tree over `rows` branch rows (1: a draft step), interpolated."""
        return _interp(self.draft_ms, rows)

    def glue_at(self, tokens: float) -> float:
        """ms of SSD's glue step over `tokens` new tokens (the draft's logits after them), interpolated. A profile
        stored before this curve was measured prices it as one draft step, as Theorem 7 then did."""
        return _interp(self.glue_ms, tokens) if self.glue_ms else self.draft_at(1)

    def rows(self) -> list[dict]:
        """One record per (role, n): ms, ratio to the one-token step, and the floor of that step (role glue: the
        draft's glue step, where the profile has it); as a table, ``ssd.bench.frames.profile_frame``."""
        rows = []
        curves = [("target", self.target_ms), ("draft", self.draft_ms)]
        curves += [("glue", self.glue_ms)] if self.glue_ms else []
        for role, curve in curves:
            model = "draft" if role == "glue" else role
            one = curve[min(curve)]
            for n, ms in sorted(curve.items()):
                rows.append({"role": role, "precision": self.precisions[model], "n": n, "ms": ms, "ratio": ms / one,
                             "floor_ms": self.floor_ms(model)})
        return rows

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Profile":
        return cls(**d)


def _interp(curve: dict[int, float], n: float) -> float:
    xs = sorted(curve)
    if not xs[0] <= n <= xs[-1]:
        raise ValueError(f"{n} lies outside the profiled range {xs[0]}..{xs[-1]}")
    return float(np.interp(n, xs, [curve[x] for x in xs]))
