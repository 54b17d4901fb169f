"""GroupStream: GRPO groups rolled out without stopping, admitted so that none is trained too stale.

Fully-async training overlaps the rollout of the next steps with the current one's training. What keeps that
honest is *admission*, not discarding finished work (AReaL's capacity rule): with ``groups_per_step`` groups trained
per step and the trainer at version ``v`` (optimizer steps done), the ``n``-th group (admission order, from 0,
groups that yield nothing to train not counted) starts only while ``n < (max_staleness + v + 1) * groups_per_step``.
The trainer takes groups in admission order, so group ``n`` is trained at step ``n // groups_per_step``, at most
``max_staleness`` versions after the version it started under, and its tokens are no older than that. A group is
admitted, run and judged whole (every turn of every trajectory): multi-turn trajectories are not judged chain by
chain. Taking strictly oldest first also means long groups are never starved: a slow group holds the trainer
(counted as trainer idle) rather than being overtaken and expiring, so long and short tasks are trained in the
proportion they were generated. A group still too stale when taken (its oldest token more than ``max_staleness``
behind: an engine that served older weights) is dropped, counted, and replaced by a new admission.

The stream is trainer-agnostic: ``next_group(index)`` makes the group's samples, ``run_group`` rolls them out (the
manager's ``generate``, loops or an agent's sessions), and a consumer takes groups with ``take``. The trainer's
version and ``max_staleness`` are the run's ``VersionClock`` (version_clock.py), read here and never copied:
whoever advances the clock calls ``wake`` so that admission sees it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agentloop_grpc.agent import Sample, Trajectory
from agentloop_grpc.agent.manager import RolloutBatch

from .version_clock import VersionClock


def admission_limit(version: int, groups_per_step: int, max_staleness: int, discarded: int = 0) -> int:
    """How many groups may have been admitted in all while the trainer is at ``version``."""
    return (max_staleness + version + 1) * groups_per_step + discarded


def oldest_version(trajectories: Sequence[Trajectory]) -> int | None:
    """The oldest weight version among the model tokens of the trajectories that did not fail (None: none)."""
    versions = [v for t in trajectories if not t.failed
                for v, m in zip(t.weight_versions, t.response_mask, strict=True) if m and v >= 0]
    return min(versions) if versions else None


@dataclass
class FinishedGroup:
    """One group, rolled out: its trajectories in the samples' order."""

    index: int
    samples: tuple[Sample, ...]
    trajectories: tuple[Trajectory, ...]

    @property
    def oldest_version(self) -> int | None:
        return oldest_version(self.trajectories)


@dataclass
class StreamCounters:
    """What the stream did so far (cumulative; a consumer reports differences per step)."""

    admitted: int = 0
    dropped_stale: int = 0
    trainer_wait_s: float = 0.0
    engine_idle_s: float = 0.0
    in_flight: int = 0
    waiting: int = 0  # finished, not yet taken


class GroupStream:
    """Admits, runs and hands out groups; see the module docstring. Runs on one event loop (``start`` there)."""

    def __init__(
        self,
        next_group: Callable[[int], Sequence[Sample]],
        run_group: Callable[[Sequence[Sample]], Awaitable[RolloutBatch]],
        groups_per_step: int,
        clock: VersionClock,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        if groups_per_step < 1:
            raise ValueError("groups_per_step must be >= 1")
        self.next_group, self.run_group = next_group, run_group
        self.groups_per_step, self.clock = groups_per_step, clock
        self.counters = StreamCounters()
        self._timer = timer
        self._start_version = clock.version  # admission counts the trainer's versions from the stream's start
        self._discarded = 0
        self._finished: dict[int, FinishedGroup] = {}
        self._next_take = 0
        self._tasks: set[asyncio.Task] = set()
        self._admitter: asyncio.Task | None = None
        self._changed: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._idle_since: float | None = None

    def limit(self) -> int:
        """Groups that may have been admitted by now (see ``admission_limit``; versions count from the start)."""
        return admission_limit(self.clock.version - self._start_version, self.groups_per_step,
                               self.clock.max_staleness, self._discarded)

    async def start(self) -> None:
        self._changed = asyncio.Event()
        self._idle_since = self._timer()
        self._admitter = asyncio.create_task(self._admit())

    def wake(self) -> None:
        """The clock moved (or a group was dropped): admit what may start now. Call on the stream's loop."""
        if self._changed is not None:
            self._changed.set()

    async def _admit(self) -> None:
        assert self._changed is not None
        while True:
            while self.counters.admitted < self.limit():
                index = self.counters.admitted
                samples = tuple(self.next_group(index))
                self.counters.admitted += 1
                self._launch(index, samples)
            self._changed.clear()
            await self._changed.wait()

    def _launch(self, index: int, samples: tuple[Sample, ...]) -> None:
        if self.counters.in_flight == 0 and self._idle_since is not None:
            self.counters.engine_idle_s += self._timer() - self._idle_since
            self._idle_since = None
        self.counters.in_flight += 1
        task = asyncio.create_task(self._run(index, samples))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, index: int, samples: tuple[Sample, ...]) -> None:
        try:
            batch = await self.run_group(samples)
        except Exception as error:  # noqa: BLE001 (the consumer raises it: a broken stream must not look idle)
            self._error = self._error or error
        else:
            self._finished[index] = FinishedGroup(index, samples, batch.trajectories)
            self.counters.waiting += 1
        finally:
            self.counters.in_flight -= 1
            if self.counters.in_flight == 0:
                self._idle_since = self._timer()
            self.wake()

    async def take(self, count: int) -> list[FinishedGroup]:
        """The next ``count`` groups in admission order (waiting for each; the wait counts as trainer idle). A
        group too stale by now is dropped and another admitted in its place."""
        assert self._changed is not None, "start() first"
        taken: list[FinishedGroup] = []
        started = self._timer()
        try:
            while len(taken) < count:
                if self._error is not None:
                    raise RuntimeError(f"a group's rollout failed: {self._error!r}") from self._error
                group = self._finished.pop(self._next_take, None)
                if group is None:
                    self._changed.clear()
                    await self._changed.wait()
                    continue
                self._next_take += 1
                self.counters.waiting -= 1
                if self.clock.too_stale(group.oldest_version):
                    self.counters.dropped_stale += 1
                    self._discarded += 1
                    self.wake()
                    continue
                taken.append(group)
        finally:
            self.counters.trainer_wait_s += self._timer() - started
        return taken

    def replace(self, groups: int) -> None:
        """Admit ``groups`` more, in place of groups whose trajectories gave a consumer nothing to train (a
        consumer of samples, whose failed trajectories are none). Call on the stream's loop."""
        self._discarded += groups
        self.wake()

    def exhausted(self) -> bool:
        """Whether the stream can give nothing more until the clock moves: no group running, none finished and
        untaken, none admitted or about to be, no error. Read on the stream's loop."""
        counters = self.counters
        return (not counters.in_flight and not counters.waiting and counters.admitted >= self.limit()
                and self._error is None)

    def engine_idle_s(self) -> float:
        """Seconds with no group in flight so far (engines idle: admission held them back)."""
        idle = self.counters.engine_idle_s
        if self.counters.in_flight == 0 and self._idle_since is not None:
            idle += self._timer() - self._idle_since
        return idle

    async def close(self) -> None:
        """Cancel the admission and every group still running."""
        tasks = [t for t in (self._admitter, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._admitter = None
