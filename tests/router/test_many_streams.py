"""Thousands of concurrent generates on one server: the Router bounds the streams it opens per channel (gRPC
cancels streams beyond ~1,000 on one channel), so every generate completes."""

from __future__ import annotations

import asyncio

import pytest

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import create_server, start_adapter
from agentloop_grpc.router import GenerateCall, Router, RouterConfig


@pytest.mark.slow
async def test_3000_concurrent_generates_on_one_server_all_complete():
    engine = FakeEngine(FakeEngineConfig(max_running=1024, max_waiting=8192))
    server = await create_server(engine, "127.0.0.1:0")
    await start_adapter(server)
    try:
        async with Router([f"127.0.0.1:{server.port}"], RouterConfig()) as router:
            await router.fleet.wait_ready()
            params = SamplingParams(max_new_tokens=2, temperature=0)
            results = await asyncio.gather(
                *(router.generate(GenerateCall(f"s{i}", [5, 6, 7, i % 1000 + 8], params)) for i in range(3000)),
                return_exceptions=True,
            )
    finally:
        await server.stop(grace_s=1)
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} failed, e.g. {failures[0]!r}"
    assert all(len(r.token_ids) == 2 for r in results)
