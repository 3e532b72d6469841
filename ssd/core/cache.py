"""The speculation cache: {outcome (k, t*) -> the next round's draft}, with its hit / miss bookkeeping."""
from __future__ import annotations

from .proposers import Draft


class SpeculationCache:
    def __init__(self):
        self.entries: dict[tuple[int, int], Draft] = {}
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, outcome: tuple[int, int]) -> bool:
        return outcome in self.entries

    def fill(self, entries: dict[tuple[int, int], Draft]) -> None:
        """Replace the cache with the speculations for the round being verified (older ones can never hit)."""
        self.entries = dict(entries)

    def lookup(self, outcome: tuple[int, int]) -> Draft | None:
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
