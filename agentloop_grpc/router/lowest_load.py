"""LowestLoad: the least load among a Fleet's healthy servers, kept as their loads change.

Every sticky call compares its server's load with the least-loaded server's (policy.keeps); taking that minimum
over all servers on each call made a sticky call's cost grow with the fleet (figures in NOTES.md). Loads are small
integers that mostly move by one (a request begins or ends), so a count of servers per load value finds the new
lowest in a step or two when the last server at the lowest moves up.
"""

from __future__ import annotations


class LowestLoad:
    """Counts of servers per load value and the lowest value held; ``value`` is None while no server is held."""

    __slots__ = ("_counts", "value")

    def __init__(self) -> None:
        self._counts: dict[int, int] = {}
        self.value: int | None = None

    def add(self, load: int) -> None:
        """A server carrying ``load`` is counted from now on (it became healthy)."""
        self._counts[load] = self._counts.get(load, 0) + 1
        if self.value is None or load < self.value:
            self.value = load

    def remove(self, load: int) -> None:
        """A server carrying ``load`` is counted no more (it stopped serving or left)."""
        if self._drop(load) and load == self.value:
            self.value = min(self._counts) if self._counts else None  # rare: a server leaves, so a scan is fine

    def move(self, old: int, new: int) -> None:
        """A counted server's load went from ``old`` to ``new``."""
        self._counts[new] = self._counts.get(new, 0) + 1
        emptied = self._drop(old)
        if self.value is None or new < self.value:
            self.value = new
        elif emptied and old == self.value:
            # every other server carries more than old, and this one carries new: the lowest lies in (old, new]
            self.value = next(load for load in range(old + 1, new + 1) if load in self._counts)

    def _drop(self, load: int) -> bool:
        """Count one server less at ``load``; whether none is left there."""
        left = self._counts[load] - 1
        if left:
            self._counts[load] = left
            return False
        del self._counts[load]
        return True
