"""The speculation cache: {outcome (k, t*) -> the next round's draft}, with its hit / miss bookkeeping."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Speculation:
    """A ready draft for one round: what a hit hands to the verifier, so the draft phase is skipped."""

    tokens: list[int]  # x_1..x_K
    q: torch.Tensor  # [K, V] the distributions they were drawn from (verify needs them to stay lossless)
    logits: torch.Tensor | None  # [K, V] the draft's logits there, to rank the next candidates; None for a proposal
    fan_out: list[int]  # the F_0..F_K the draft was made for (Saguaro down-weighted exactly those sets)


class SpeculationCache:
    def __init__(self):
        self.entries: dict[tuple[int, int], Speculation] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, outcome: tuple[int, int]) -> bool:
        return outcome in self.entries

    def fill(self, entries: dict[tuple[int, int], Speculation]) -> None:
        """Replace the cache with the speculations for the round being verified (older ones can never hit)."""
        self.entries = dict(entries)

    def lookup(self, outcome: tuple[int, int]) -> Speculation | None:
        found = self.entries.get(outcome)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return self.hits / n if n else None
