"""One version clock for a training run: which version each step's weights are, where the engines are, and the
staleness rule; and a fully-async rollout whose trainer resumes mid-run reads the same clock as its stream."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from agentloop_grpc.agent import WorkerSpec
from agentloop_grpc.agent.spec import load_codec
from agentloop_grpc.integrations.version_clock import VersionClock

from ..agent.conftest import TextScript, scripted_engine

ROWS = [{"id": "a", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "ground_truth": "5"}]


def test_the_first_step_seen_is_the_engines_version_and_versions_only_go_up():
    clock = VersionClock(max_staleness=1)
    clock.start(7)  # the engines had updates before this run
    assert clock.version_of(5) == 7 and clock.version_of(6) == 8  # a trainer resumed at step 5
    with pytest.raises(ValueError, match="before the run's first step"):
        clock.version_of(4)
    assert clock.advance(8) and not clock.advance(8) and not clock.advance(7) and clock.version == 8
    assert clock.steps_since_start(8) == 1


@pytest.mark.parametrize(("oldest", "stale"), [(7, False), (6, True), (None, False)])
def test_a_group_is_too_stale_only_past_max_staleness(oldest, stale):
    clock = VersionClock(max_staleness=1)
    clock.start(8)
    assert clock.too_stale(oldest) is stale


@pytest.fixture(scope="module")
async def engine():
    async with scripted_engine(TextScript(load_codec(None), lambda text: "The answer is 5.")) as address:
        yield address


def _trainer(step: int) -> SimpleNamespace:
    return SimpleNamespace(model=SimpleNamespace(training=True), num_generations=2, num_generations_eval=2,
                           state=SimpleNamespace(global_step=step))


async def test_a_resumed_trainer_gets_its_groups_without_a_burst_of_admissions(engine):
    """A trainer resumed at step 5 asks on fresh engines (version 0): its first groups are trainable (the
    stream and the rollout read one clock: step 5 is version 0), and no more groups start than max_staleness
    allows. With the version held twice (the stream from the engines' version, the rollout as base + step), the
    stream saw the trainer 5 versions ahead: it admitted 5 steps of groups at once and dropped each as too stale,
    forever."""
    from agentloop_grpc.integrations.trl import AsyncAgentLoopRollout

    rollout = AsyncAgentLoopRollout(WorkerSpec(engines=(engine,)), ROWS, check_logprobs=0, max_staleness=1)
    try:
        await asyncio.to_thread(rollout.start)
        call = asyncio.to_thread(rollout, [ROWS[0]["messages"]] * 2, _trainer(5))
        fields = await asyncio.wait_for(call, 30)
        stream = rollout.stream
        assert stream is not None and stream.counters.admitted <= 2  # this step's group and the next one's
    finally:
        await asyncio.to_thread(rollout.close)
    (record,) = rollout.history
    assert record.step == 5 and record.metrics["dropped_stale"] == 0 and record.metrics["staleness_max"] == 0
    assert len(fields["completion_ids"]) == 2
