"""EngineLifecycle's rules, written once for every adapter: the one Generate path (the servicer's too) and its
abort-on-exit, the gate of Pause, the in-flight registry, Sleep and weight versions (the fake engine underneath; the
contract suite checks the same over gRPC on every engine)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence

import pytest

from agentloop_grpc.common.errors import DuplicateRequestError, EngineUnavailableError, FailedPreconditionError
from agentloop_grpc.common.types import (
    ALL_RESOURCES,
    EngineState,
    FinishReason,
    GenerateComplete,
    GenerateEvent,
    GenerateRequest,
    PauseMode,
    Resource,
    SamplingParams,
)
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.lifecycle import EngineLifecycle


class RecordingFake(FakeEngine):
    """Test-only fake: records the ids the lifecycle aborts; with ``drop_completion`` its streams end without
    their completion (an adapter bug)."""

    def __init__(self, config: FakeEngineConfig) -> None:
        super().__init__(config)
        self.aborted: list[str] = []
        self.drop_completion = False

    async def abort(self, request_ids: Sequence[str]) -> None:
        self.aborted += request_ids
        await super().abort(request_ids)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        async with contextlib.aclosing(super().generate(request)) as events:
            async for event in events:
                if isinstance(event, GenerateComplete) and self.drop_completion:
                    return
                yield event


def _request(request_id: str, tokens: int = 4) -> GenerateRequest:
    return GenerateRequest(request_id, (1, 2, 3), SamplingParams(max_new_tokens=tokens, ignore_eos=True))


async def _collect(lifecycle: EngineLifecycle, request: GenerateRequest) -> tuple[list[int], GenerateComplete]:
    tokens: list[int] = []
    async for event in lifecycle.generate(request):
        if isinstance(event, GenerateComplete):
            return tokens, event
        tokens += event.token_ids
    raise AssertionError("no completion")


@pytest.fixture
async def lifecycle():
    engine = EngineLifecycle(RecordingFake(FakeEngineConfig(token_latency_s=0.002)))
    assert engine.state is EngineState.LOADING
    with pytest.raises(EngineUnavailableError, match="loading"):
        await engine.sleep(1)
    await engine.start()
    yield engine
    await engine.shutdown()


async def test_closing_the_stream_before_its_completion_aborts_the_request_in_the_engine(lifecycle) -> None:
    stream = lifecycle.generate(_request("gone", tokens=20))
    await anext(stream)
    await stream.aclose()  # what the servicer does when its client goes away or the deadline passes
    assert lifecycle.adapter.aborted == ["gone"]
    assert lifecycle.in_flight == 0 and lifecycle.load().running_requests == 0


async def test_a_caller_may_stop_reading_at_the_completion_and_reuse_the_id_at_once(lifecycle) -> None:
    async for event in lifecycle.generate(_request("done")):
        if isinstance(event, GenerateComplete):
            break  # the stream is left open: the request already left the registry
    assert lifecycle.in_flight == 0 and lifecycle.adapter.aborted == []
    tokens, complete = await _collect(lifecycle, _request("done"))
    assert len(tokens) == 4 and complete.finish_reason is FinishReason.LENGTH


async def test_an_adapter_stream_without_a_completion_is_an_error_and_aborted_in_the_engine(lifecycle) -> None:
    lifecycle.adapter.drop_completion = True
    with pytest.raises(RuntimeError, match="'broken' without a completion"):
        await _collect(lifecycle, _request("broken"))
    assert lifecycle.adapter.aborted == ["broken"] and lifecycle.in_flight == 0


async def test_a_request_held_at_the_gate_waits_for_resume_and_counts_as_waiting(lifecycle) -> None:
    await lifecycle.pause(PauseMode.WAIT)
    held = asyncio.create_task(_collect(lifecycle, _request("held")))
    await asyncio.sleep(0.02)
    assert not held.done() and lifecycle.state is EngineState.PAUSED
    assert (lifecycle.load().running_requests, lifecycle.load().waiting_requests) == (0, 1)
    await lifecycle.resume()
    tokens, complete = await held
    assert len(tokens) == 4 and complete.finish_reason is FinishReason.LENGTH


async def test_abort_ends_a_request_held_at_the_gate_without_reaching_the_engine(lifecycle) -> None:
    await lifecycle.pause(PauseMode.ABORT)
    held = asyncio.create_task(_collect(lifecycle, _request("held")))
    await asyncio.sleep(0.01)
    assert await lifecycle.abort(["held", "unknown"]) == ["held"]
    tokens, complete = await held
    assert tokens == [] and complete.finish_reason is FinishReason.ABORT and complete.completion_tokens == 0
    assert lifecycle.in_flight == 0


async def test_wait_after_keep_thaws_the_engine_so_its_requests_finish(lifecycle) -> None:
    running = asyncio.create_task(_collect(lifecycle, _request("kept", tokens=20)))
    while not lifecycle.load().running_requests:
        await asyncio.sleep(0.001)
    assert (await lifecycle.pause(PauseMode.KEEP)).kept_requests == 1
    await asyncio.wait_for(lifecycle.pause(PauseMode.WAIT), 5)  # without the thaw it would wait forever
    tokens, complete = await running
    assert len(tokens) == 20 and complete.finish_reason is FinishReason.LENGTH


async def test_a_duplicate_id_is_refused_while_the_first_is_in_flight(lifecycle) -> None:
    first = asyncio.create_task(_collect(lifecycle, _request("same", tokens=20)))
    await asyncio.sleep(0.005)
    with pytest.raises(DuplicateRequestError, match="same"):
        await _collect(lifecycle, _request("same"))
    await first
    await _collect(lifecycle, _request("same"))  # free again once the first ended


async def test_sleep_rules_and_weight_versions(lifecycle) -> None:
    stream = lifecycle.generate(_request("in-flight", tokens=20))
    await anext(stream)
    with pytest.raises(FailedPreconditionError, match="in flight"):
        await lifecycle.sleep(1)
    await stream.aclose()
    assert lifecycle.in_flight == 0
    await lifecycle.sleep(2)
    assert lifecycle.state is EngineState.SLEEPING
    with pytest.raises(EngineUnavailableError, match="asleep"):
        await _collect(lifecycle, _request("asleep"))
    with pytest.raises(EngineUnavailableError, match="weights are released"):
        await lifecycle.update_weights([], 1, flush_cache=False)
    assert await lifecycle.wake_up(frozenset({Resource.WEIGHTS})) is EngineState.SLEEPING
    assert await lifecycle.wake_up(ALL_RESOURCES) is EngineState.RUNNING
    assert (await lifecycle.update_weights([], None, flush_cache=False)).weight_version == 1
    with pytest.raises(FailedPreconditionError, match="greater than the current 1"):
        await lifecycle.update_weights([], 1, flush_cache=False)
    _, complete = await _collect(lifecycle, _request("after"))
    assert complete.weight_version == 1


async def test_shutdown_leaves_every_weight_group_so_the_leader_fails_fast() -> None:
    import time

    from agentloop_grpc.common.weight_group import WeightGroupLeader
    from agentloop_grpc.common.weight_layout import WeightGroupError, WeightGroupSpec

    engine = EngineLifecycle(FakeEngine(FakeEngineConfig()))
    await engine.start()
    store, port = WeightGroupLeader.host("127.0.0.1", 2, 60)
    spec = WeightGroupSpec("g", "127.0.0.1", port, 2, 1, "gloo", 60)
    forming = asyncio.ensure_future(asyncio.to_thread(WeightGroupLeader.form, store, spec))
    assert await engine.join_weight_group(spec) == [1]
    leader = await forming
    with pytest.raises(FailedPreconditionError, match="already in weight group"):
        await engine.join_weight_group(spec)
    await engine.shutdown()
    started = time.monotonic()
    with pytest.raises(WeightGroupError):
        await asyncio.to_thread(leader.vote, True)
    assert time.monotonic() - started < 30  # the member left: no wait for the group's 60 s timeout
    leader.close()
