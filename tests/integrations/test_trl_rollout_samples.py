"""A rolled-out group -> AsyncGRPOTrainer's RolloutSamples: token for token, our mask, the engine's logprobs,
TRL's advantage formula over the trajectories that did not fail, versions as the trainer counts them; and the
worker that queues them raises from check_health when its rollouts fail or hang."""

from __future__ import annotations

import numpy as np
import pytest

from agentloop_grpc.agent import Sample
from agentloop_grpc.integrations.trl.rollout_samples import rollout_samples
from agentloop_grpc.integrations.version_clock import VersionClock

from .test_trl_fields import failed, trajectory

MESSAGES = ({"role": "user", "content": "What is 2 + 3?"},)


def _clock(base: int) -> VersionClock:
    clock = VersionClock()
    clock.start(base)
    return clock


def _samples(n: int) -> list[Sample]:
    return [Sample(sample_id=f"s{k}", group_id="g", messages=MESSAGES) for k in range(n)]


def test_a_trajectory_becomes_a_sample_token_for_token():
    t = trajectory("s0", reward=1.0, weight_versions=(7, 7, 8, -1, -1, 8, 8))
    (sample,), metrics = rollout_samples(_samples(1), [t], group_id=12, clock=_clock(5))
    assert sample.input_ids.tolist() == list(t.prompt_ids) + list(t.response_ids)
    assert sample.input_ids.dtype == np.int64 and sample.completion_mask.dtype == np.int64
    assert sample.completion_mask.tolist() == [0, 0, 0, 1, 1, 1, 0, 0, 1, 1]
    assert sample.old_log_probs.dtype == np.float32
    assert sample.old_log_probs.tolist() == [0.0, 0.0, 0.0, -0.5, -0.25, -0.125, 0.0, 0.0, -1.0, -0.0625]
    assert sample.model_version == 2  # the oldest model token's version (7), counted from the run's start (5)
    assert sample.group_id == 12 and sample.prompt == list(MESSAGES)
    assert sample.advantage == 0.0  # alone in its group
    assert metrics["agentloop/groups_total"] == 1.0 and metrics["agentloop/failed_trajectories_total"] == 0.0


def test_advantages_are_trls_over_the_trajectories_that_did_not_fail():
    group = [trajectory("s0", reward=1.0), trajectory("s1", reward=0.0), trajectory("s2", reward=1.0),
             failed("s3", infrastructure=True), failed("s4", infrastructure=False)]
    samples, metrics = rollout_samples(_samples(5), group, group_id=0, clock=_clock(0))
    assert len(samples) == 3  # the failed ones are no samples
    rewards = np.array([1.0, 0.0, 1.0])
    expected = (rewards - rewards.mean()) / (rewards.std() + 1e-8)
    assert [s.advantage for s in samples] == pytest.approx(expected.tolist())
    assert all(s.metrics["reward_std"] == pytest.approx(rewards.std()) for s in samples)
    assert metrics["agentloop/failed_trajectories_total"] == 2.0
    assert metrics["agentloop/infrastructure_failures_total"] == 1.0


def test_a_group_that_failed_whole_yields_nothing_but_its_count():
    samples, metrics = rollout_samples(_samples(2), [failed("s0", True), failed("s1", True)], 3, _clock(0))
    assert samples == [] and metrics["agentloop/infrastructure_failures_total"] == 2.0


class _Rollout:
    """What AgentLoopRolloutWorker asks of an AsyncAgentLoopRollout, over a real GroupStream whose groups fail to
    roll out (the worker's health logic is under test, not the loops)."""

    clock = VersionClock(1)

    def __init__(self, run_group) -> None:
        from agentloop_grpc.integrations.background_loop import BackgroundLoop

        self.loop = BackgroundLoop("test-worker")
        self.run_group = run_group
        self.stream = None

    def open_stream(self, group_size: int, groups_per_step: int):
        from agentloop_grpc.integrations.group_stream import GroupStream

        async def open_():
            stream = GroupStream(lambda i: _samples(group_size), self.run_group, groups_per_step, self.clock)
            await stream.start()
            return stream

        self.stream = self.loop.run(open_())
        return self.stream

    def submit(self, coroutine):
        return self.loop.submit(coroutine)

    def close_stream(self) -> None:
        if self.stream is not None:
            self.loop.run(self.stream.close())
        self.loop.close()


def test_a_worker_whose_rollouts_fail_raises_from_check_health():
    import time

    from agentloop_grpc.integrations.trl.async_worker import AgentLoopRolloutWorker

    async def broken(samples):
        raise ConnectionError("every engine is gone")

    worker = AgentLoopRolloutWorker(_Rollout(broken), num_generations=2, groups_per_step=1)
    with pytest.raises(RuntimeError, match="not started"):
        worker.check_health(60)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        with pytest.raises(RuntimeError, match="stopped producing") as raised:
            while time.monotonic() < deadline:
                worker.check_health(60)
                time.sleep(0.05)
        assert "every engine is gone" in repr(raised.value.__cause__)
    finally:
        worker.stop()


def test_a_worker_whose_groups_hang_raises_once_its_bound_passes():
    import asyncio
    import time

    from agentloop_grpc.integrations.trl.async_worker import AgentLoopRolloutWorker

    async def hangs(samples):
        await asyncio.sleep(3600)

    worker = AgentLoopRolloutWorker(_Rollout(hangs), num_generations=2, groups_per_step=1)
    worker.start()
    try:
        worker.check_health(60)  # within its bound: healthy
        time.sleep(0.3)
        with pytest.raises(RuntimeError, match=r"no group finished for 0\.\d s \(> 0\.1 s\) while 2 ran"):
            worker.check_health(0.1)
    finally:
        worker.stop()


def _starved_worker(group, groups: int):
    """A started worker whose ``n``-th group rolls out as ``group(n, k)`` (k: the sample's position) on a stream that
    admits two groups of two (max_staleness 1) before the trainer steps, once its pump took ``groups`` (or 5 s)."""
    import itertools
    import time

    from agentloop_grpc.agent.manager import RolloutBatch
    from agentloop_grpc.agent.metrics import RolloutMetrics
    from agentloop_grpc.integrations.trl.async_worker import AgentLoopRolloutWorker

    count = itertools.count()

    async def run_group(samples):
        n = next(count)
        trajectories = tuple(group(n, k) for k in range(len(samples)))
        return RolloutBatch(trajectories, RolloutMetrics.of(trajectories, 0.0))

    worker = AgentLoopRolloutWorker(_Rollout(run_group), num_generations=2, groups_per_step=1)
    worker.start()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and worker.metrics_queue.qsize() < groups:  # taken by the pump
        time.sleep(0.01)
    time.sleep(0.05)  # and no more coming
    assert worker.metrics_queue.qsize() == groups
    return worker


def test_a_worker_whose_every_trajectory_failed_raises_stream_starved_at_once():
    """No group gives a sample: one is admitted in place of the first (a window of two in a row gave none: the
    engines are gone), then the trainer cannot step and says so at the first health check (not after
    stale_after_s, nor never), with the trajectories for the causes."""
    from agentloop_grpc.integrations.trl.async_worker import StreamStarved

    worker = _starved_worker(lambda n, k: failed(f"s{k}", infrastructure=True), groups=3)
    try:
        with pytest.raises(StreamStarved, match="every one of the 6 trajectories rolled out failed") as raised:
            worker.check_health(300)
        assert raised.value.every_trajectory_failed and raised.value.samples_given == 0
        assert [t.error for t in raised.value.trajectories] == ["engine gone"] * 6
    finally:
        worker.stop()


def test_a_worker_admits_groups_in_place_of_failed_trajectories():
    """The trainer counts samples: with one trajectory of each group failing, the two groups admitted give two,
    and the groups admitted in place of the failed ones make up the four a step and its read-ahead take."""
    worker = _starved_worker(lambda n, k: failed(f"s{k}", infrastructure=False) if k else trajectory(f"s{k}"),
                             groups=4)
    try:
        assert worker.samples_given == 4
        worker.check_health(300)  # samples queued: the trainer has them to take
    finally:
        worker.stop()


def test_a_worker_whose_latest_groups_all_failed_raises_stream_starved_once_its_samples_are_taken():
    from agentloop_grpc.integrations.trl.async_worker import StreamStarved

    worker = _starved_worker(lambda n, k: trajectory(f"s{k}") if n == 0 else failed(f"s{k}", infrastructure=True),
                             groups=3)
    try:
        worker.check_health(300)  # two samples queued: the trainer has something to take
        taken = [worker.rollout_buffer.get_nowait() for _ in range(2)]
        assert len(taken) == 2 and worker.rollout_buffer.empty()
        with pytest.raises(StreamStarved, match="4 of the 6 trajectories not yet trained failed") as raised:
            worker.check_health(300)
        assert not raised.value.every_trajectory_failed and raised.value.samples_given == 2
    finally:
        worker.stop()


def test_a_worker_starved_without_a_failure_says_the_trainer_asked_past_what_may_start():
    from agentloop_grpc.integrations.trl.async_worker import StreamStarved

    worker = _starved_worker(lambda n, k: trajectory(f"s{k}"), groups=2)
    try:
        taken = [worker.rollout_buffer.get_nowait() for _ in range(4)]  # a trainer that asked for more than a step's
        assert len(taken) == 4
        with pytest.raises(StreamStarved, match="asks for samples of its next step before it steps") as raised:
            worker.check_health(300)
        assert not raised.value.every_trajectory_failed and raised.value.samples_given == 4
    finally:
        worker.stop()
