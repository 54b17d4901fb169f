"""GroupStream's admission and order, with rollouts simulated by sleeps (the scheduler is ours; no engine).

A simulated trainer takes ``B`` groups per step, trains (a sleep), pushes (version + 1). Groups carry the version
they were admitted under as their tokens' version, as an engine would stamp them.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from agentloop_grpc.agent import Sample, Termination, Trajectory
from agentloop_grpc.agent.manager import RolloutBatch
from agentloop_grpc.agent.metrics import RolloutMetrics
from agentloop_grpc.integrations.group_stream import GroupStream, admission_limit, oldest_version
from agentloop_grpc.integrations.version_clock import VersionClock


def _trajectory(sample: Sample, version: int, failed: bool = False) -> Trajectory:
    return Trajectory(
        sample_id=sample.sample_id, loop="tool", group_id=sample.group_id, prompt_ids=(1, 2),
        response_ids=(5, 6, 7), response_mask=(1, 0, 1), response_logprobs=(-0.5, 0.0, -0.25),
        weight_versions=(version, -1, version + 1), reward=0.0,
        termination=Termination.ERROR if failed else Termination.STOP,
        error="engine gone" if failed else None, infrastructure_failure=failed,
    )


class Simulated:
    """Groups whose row says how long they take; tokens stamped with the stream's version when they start."""

    def __init__(self, long_every: int = 0, long_s: float = 0.0, short_s: float = 0.002, group_size: int = 2,
                 seed: int = 0) -> None:
        self.long_every, self.long_s, self.short_s, self.group_size = long_every, long_s, short_s, group_size
        self.rng = random.Random(seed)
        self.stream: GroupStream | None = None
        self.long: set[int] = set()
        self.running = 0
        self.most_running = 0
        self.stale_version: dict[int, int] = {}  # group index -> the (old) version its tokens claim

    def next_group(self, index: int) -> list[Sample]:
        if self.long_every and self.rng.randrange(self.long_every) == 0:
            self.long.add(index)
        return [Sample(sample_id=f"{index}/{k}", group_id=str(index), messages=({"role": "user", "content": "hi"},))
                for k in range(self.group_size)]

    async def run_group(self, samples) -> RolloutBatch:
        assert self.stream is not None
        index = int(samples[0].group_id)
        version = self.stale_version.get(index, self.stream.clock.version)
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        try:
            await asyncio.sleep(self.long_s if index in self.long else self.short_s)
        finally:
            self.running -= 1
        trajectories = tuple(_trajectory(s, version) for s in samples)
        return RolloutBatch(trajectories, RolloutMetrics.of(trajectories, 0.0))


async def _train(sim: Simulated, steps: int, groups_per_step: int, max_staleness: int, train_s: float = 0.003,
                 base: int = 0):
    clock = VersionClock(max_staleness)
    clock.start(base)
    stream = sim.stream = GroupStream(sim.next_group, sim.run_group, groups_per_step, clock)
    await stream.start()
    trained = []  # (step, group)
    try:
        for step in range(steps):
            for group in await stream.take(groups_per_step):
                trained.append((step, group))
            await asyncio.sleep(train_s)
            clock.advance(base + step + 1)
            stream.wake()
    finally:
        await stream.close()
    return stream, trained


def test_the_capacity_rule():
    assert admission_limit(0, 4, 1) == 8  # this step's groups and the next step's
    assert admission_limit(3, 4, 1) == 20
    assert admission_limit(0, 4, 0) == 4  # no overlap: the next step's groups wait for its weights
    assert admission_limit(2, 3, 2, discarded=5) == 20


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_no_group_is_trained_more_than_max_staleness_versions_late(max_staleness):
    sim = Simulated(long_every=4, long_s=0.03)
    stream, trained = asyncio.run(_train(sim, steps=30, groups_per_step=3, max_staleness=max_staleness, base=7))
    assert len(trained) == 90
    lags = [7 + step - group.oldest_version for step, group in trained]
    assert max(lags) <= max_staleness and min(lags) >= 0
    assert max(lags) == max_staleness  # the overlap is used: groups do run ahead of the trainer
    assert [g.index for _, g in trained] == list(range(90))  # oldest first: admission order
    # never more admitted than the rule allows (at the end: the last version's limit)
    assert stream.counters.admitted <= admission_limit(30, 3, max_staleness)
    assert sim.most_running <= (max_staleness + 1) * 3
    assert stream.counters.dropped_stale == 0


def test_long_tasks_are_trained_in_the_share_they_were_generated():
    """A quarter of the groups take 15x longer. Taking strictly oldest first, a long group holds the trainer
    instead of being overtaken and expiring, so the share of long groups among those trained equals their share
    among those generated (to within the groups still in flight at the end: at most (max_staleness + 1) x B of
    ~160), where a take-what-finished-first trainer dropping expired groups would train mostly short ones."""
    sim = Simulated(long_every=4, long_s=0.03, short_s=0.002, seed=3)
    stream, trained = asyncio.run(_train(sim, steps=40, groups_per_step=4, max_staleness=1, train_s=0.002))
    admitted = stream.counters.admitted
    generated_long = len([i for i in sim.long if i < admitted]) / admitted
    trained_long = sum(g.index in sim.long for _, g in trained) / len(trained)
    assert 0.15 < generated_long < 0.35  # the mix is what the test means
    assert abs(trained_long - generated_long) <= 8 / admitted + 1e-9, (trained_long, generated_long)
    assert stream.counters.dropped_stale == 0
    assert stream.counters.trainer_wait_s > 0  # the long groups were waited for, not skipped


def test_a_group_whose_tokens_are_too_old_is_dropped_counted_and_replaced():
    sim = Simulated()
    sim.stale_version = {2: 3}  # its tokens claim weights far older than the trainer's (an engine left behind)
    stream, trained = asyncio.run(_train(sim, steps=4, groups_per_step=1, max_staleness=1, base=10))
    assert [g.index for _, g in trained] == [0, 1, 3, 4]
    assert stream.counters.dropped_stale == 1


@pytest.mark.parametrize(("claimed", "kept"), [(11, True), (10, False)])
def test_a_group_exactly_max_staleness_behind_is_kept_one_more_is_dropped(claimed, kept):
    """Group 2 is taken with the trainer at 12 and max_staleness 1: tokens of version 11 are trainable, 10's not."""
    sim = Simulated()
    sim.stale_version = {2: claimed}
    stream, trained = asyncio.run(_train(sim, steps=4, groups_per_step=1, max_staleness=1, base=10))
    assert [g.index for _, g in trained] == ([0, 1, 2, 3] if kept else [0, 1, 3, 4])
    assert stream.counters.dropped_stale == (0 if kept else 1)


def test_a_failed_rollout_is_raised_to_the_trainer():
    async def broken(samples):
        raise ConnectionError("no engine answers")

    async def main():
        stream = GroupStream(Simulated().next_group, broken, 1, VersionClock(1))
        await stream.start()
        try:
            with pytest.raises(RuntimeError, match="no engine answers"):
                await asyncio.wait_for(stream.take(1), 5)
        finally:
            await stream.close()

    asyncio.run(main())


def test_oldest_version_reads_model_tokens_of_trajectories_that_did_not_fail():
    sample = Sample(sample_id="a", messages=({"role": "user", "content": "hi"},))
    assert oldest_version([_trajectory(sample, 4), _trajectory(sample, 2, failed=True)]) == 4
    assert oldest_version([_trajectory(sample, 2, failed=True)]) is None


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="groups_per_step"):
        GroupStream(Simulated().next_group, Simulated().run_group, 0, VersionClock(1))
    with pytest.raises(ValueError, match="max_staleness"):
        VersionClock(-1)
