"""StreamedGroups: the streaming source of a fully-async ``AgentLoopRollout`` (``max_staleness`` set): groups rolled
out without stopping by a ``GroupStream``, taken oldest first, as many as a training step's prompts make.

The dataset order is the stream's (the rows shuffled with ``seed``, every row once per epoch): TRL's ``prompts``
only say how many groups a step trains, since a group must start before the step that trains it asks. The
trainer's version and ``max_staleness`` are the rollout's ``VersionClock``; each step's metrics carry the
staleness of every trained trajectory (the trained version minus its oldest token's), the queue, and the seconds
trainer and engines waited for each other.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agentloop_grpc.agent import Sample, Trajectory
from agentloop_grpc.agent.manager import RolloutBatch

from ..group_stream import GroupStream, oldest_version
from ..version_clock import VersionClock


class StreamedGroups:
    """``sample(row, sample_id, group_id)`` makes a row's Sample; ``run_group`` rolls a group's samples out."""

    def __init__(self, rows: Sequence[Mapping[str, Any]], sample: Callable[[Mapping[str, Any], str, str], Sample],
                 run_group: Callable[[Sequence[Sample]], Awaitable[RolloutBatch]], clock: VersionClock,
                 seed: int = 0) -> None:
        self.rows, self.sample, self.run_group, self.clock, self.seed = list(rows), sample, run_group, clock, seed
        self.stream: GroupStream | None = None
        self._group_size = 0
        self._epoch: tuple[int, list[int]] = (-1, [])  # groups are admitted in order: one epoch's order at a time
        self._last = {"trainer_wait_s": 0.0, "engine_idle_s": 0.0, "dropped_stale": 0}

    def _row(self, index: int) -> Mapping[str, Any]:
        """The row of the ``index``-th group: every row once per epoch, each epoch in its own seeded order."""
        epoch, position = divmod(index, len(self.rows))
        if self._epoch[0] != epoch:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
            self._epoch = (epoch, order)
        return self.rows[self._epoch[1][position]]

    def _group(self, index: int) -> list[Sample]:
        row = self._row(index)
        return [self.sample(row, f"a{index}/{k}", f"a{index}") for k in range(self._group_size)]

    async def open(self, group_size: int, groups_per_step: int) -> GroupStream:
        """Start the stream of groups of ``group_size``, ``groups_per_step`` admitted per trainer version from the
        clock's version now. Call on the rollout's loop."""
        if self.stream is not None:
            raise RuntimeError("this rollout's stream is already open")
        if group_size < 1:
            raise ValueError("group_size must be >= 1")
        if not self.rows:
            raise ValueError("no dataset rows to roll out")
        self._group_size = group_size
        stream = GroupStream(self._group, self.run_group, groups_per_step, self.clock)
        await stream.start()
        self.stream = stream
        return stream

    async def close(self) -> None:
        """Stop admitting and cancel the groups still rolling out."""
        if self.stream is not None:
            await self.stream.close()
        self.stream = None

    def metrics(self, trajectories: Sequence[Trajectory], version: int) -> dict[str, float]:
        """The step's staleness histogram (``staleness_K``: trajectories trained K versions after their oldest
        token), the queue, and the seconds trainer and engines waited since the last step."""
        assert self.stream is not None  # taken from it
        counters = self.stream.counters
        staleness = [version - v for t in trajectories if (v := oldest_version((t,))) is not None]
        metrics: dict[str, float] = {f"staleness_{k}": float(staleness.count(k))
                                     for k in range(self.clock.max_staleness + 1)}
        engine_idle = self.stream.engine_idle_s()
        metrics.update({
            "staleness_mean": sum(staleness) / len(staleness) if staleness else 0.0,
            "staleness_max": float(max(staleness, default=0)),
            "queue_groups": float(counters.waiting),
            "in_flight_groups": float(counters.in_flight),
            "dropped_stale": float(counters.dropped_stale - self._last["dropped_stale"]),
            "trainer_idle_s": counters.trainer_wait_s - self._last["trainer_wait_s"],
            "engine_idle_s": engine_idle - self._last["engine_idle_s"],
        })
        self._last.update(trainer_wait_s=counters.trainer_wait_s, engine_idle_s=engine_idle,
                          dropped_stale=counters.dropped_stale)
        return metrics
