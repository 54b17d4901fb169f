"""VersionClock: the trainer's weight version, the one number the rollouts, the group stream and the weight
pushes read, and the staleness rule, written once.

A version is an engine weight version, what every model token records. ``base``: the engines' version when the
run started (0 on fresh engines; an engine's versions only go up, also across runs). The trainer's optimizer steps
are counted from the first one the run sees (``anchor``), so a trainer resumed at step K starts at ``base``, as a
fresh one starts at step 0: ``version_of(step) = base + step - anchor``. ``version``: the newest trainer version
the engines hold (moved by ``advance``, never back); a group of trajectories is trained ``version - oldest`` versions
after its oldest token, and is too stale past ``max_staleness``.

Synchronous training reads ``version_of(step)`` only (each step's rollout and push); fully-async training also
admits groups by ``version`` (group_stream.py), which the weight pushes and the trainer's steps advance.
"""

from __future__ import annotations


class VersionClock:
    def __init__(self, max_staleness: int = 0) -> None:
        if max_staleness < 0:
            raise ValueError("max_staleness must be >= 0")
        self.max_staleness = max_staleness
        self.base = 0
        self.anchor: int | None = None
        self._version = 0

    def start(self, engine_version: int) -> None:
        """The engines hold ``engine_version`` as the run starts: the trainer's first step is that version."""
        self.base = self._version = engine_version

    @property
    def version(self) -> int:
        return self._version

    def version_of(self, step: int) -> int:
        """The version of the trainer's weights after ``step`` optimizer steps (the first step seen anchors)."""
        if self.anchor is None:
            self.anchor = step
        if step < self.anchor:
            raise ValueError(f"step {step} is before the run's first step {self.anchor}")
        return self.base + step - self.anchor

    def steps_since_start(self, version: int) -> int:
        """``version`` as the trainer's optimizer steps of this run (what TRL's async trainer calls its version)."""
        return version - self.base

    def advance(self, version: int) -> bool:
        """The engines now hold ``version`` (an older one changes nothing); whether the clock moved."""
        if version <= self._version:
            return False
        self._version = version
        return True

    def staleness(self, oldest: int) -> int:
        """How many versions a group whose oldest token is ``oldest`` is trained after it (at ``version``)."""
        return self._version - oldest

    def too_stale(self, oldest: int | None) -> bool:
        """Whether such a group is past ``max_staleness`` (None: no model token, nothing to be stale)."""
        return oldest is not None and self.staleness(oldest) > self.max_staleness
