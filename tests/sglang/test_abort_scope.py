"""Aborting a request cancels its stream from the rank-0 actor and nothing else: calls the actor's generate made
to other actors (an engine's own Ray calls; the stand-in's call records) still run. Ray's default recursive
cancel dropped such a call while it waited to be sent, and every later call from that actor to the same target
then never ran (seen as the stand-in's records vanishing under load)."""

from __future__ import annotations

import asyncio
import time

import pytest
import ray

from agentloop_grpc.engine_adapters.sglang.engine import _InFlight

pytestmark = pytest.mark.usefixtures("ray_cluster")


class _Sink:
    def __init__(self) -> None:
        time.sleep(1.5)  # not ALIVE yet when the stream calls it: the call waits in the caller's queue
        self.items: list[str] = []

    def put(self, item: str) -> None:
        self.items.append(item)

    def seen(self) -> list[str]:
        return list(self.items)


class _Streamer:
    async def stream(self, sink):
        sink.put.remote("sent by the stream")
        while True:
            yield 1
            await asyncio.sleep(0.01)


async def test_abort_cancels_the_stream_but_not_the_calls_it_made() -> None:
    streamer = ray.remote(_Streamer).options(num_cpus=0).remote()
    await streamer.__ray_ready__.remote()
    sink = ray.remote(_Sink).options(num_cpus=0).remote()
    stream = streamer.stream.options(num_returns="streaming").remote(sink)  # type: ignore[attr-defined]  # Ray's stubs type an actor's methods as plain functions
    await stream.__anext__()
    _InFlight(request=None, stream=stream).abort()
    with pytest.raises((ray.exceptions.TaskCancelledError, StopAsyncIteration)):
        for _ in range(1000):
            await (await stream.__anext__())
    async with asyncio.timeout(30):
        while not await sink.seen.remote():  # type: ignore[attr-defined]  # Ray's stubs type an actor's methods as plain functions
            await asyncio.sleep(0.05)
    assert await sink.seen.remote() == ["sent by the stream"]  # type: ignore[attr-defined]  # Ray's stubs type an actor's methods as plain functions
    for actor in (sink, streamer):
        ray.kill(actor)
