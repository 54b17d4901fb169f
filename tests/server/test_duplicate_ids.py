"""A request id already in flight is refused with ALREADY_EXISTS, and the Router takes that as the caller's
mistake: it does not retry the request on another server (where it would run twice)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from agentloop_grpc.common.types import SamplingParams
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.router import GenerateCall, RequestError, Router, RouterConfig

pytestmark = pytest.mark.fault

FAST = RouterConfig(load_poll_interval_s=0.05, health_retry_interval_s=0.05, backoff_initial_s=0.01)


@asynccontextmanager
async def _two_fake_servers() -> AsyncIterator[list[EngineServer]]:
    servers = []
    try:
        for _ in range(2):  # 5 ms a token: a 400-token request stays in flight for seconds
            servers.append(await create_server(FakeEngine(FakeEngineConfig(token_latency_s=0.005)), "127.0.0.1:0"))
            await start_adapter(servers[-1])
        yield servers
    finally:
        for server in servers:
            await server.stop(grace_s=0.5)


def _params(tokens: int) -> SamplingParams:
    return SamplingParams(max_new_tokens=tokens, ignore_eos=True)


@pytest.mark.parametrize("request_id", ["dup", "d" * 256])
async def test_a_duplicate_request_id_is_already_exists_and_not_retried(request_id: str) -> None:
    async with _two_fake_servers() as servers, Router([f"127.0.0.1:{s.port}" for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        first = asyncio.create_task(router.generate(GenerateCall("s", [1, 2, 3], _params(400), request_id=request_id)))
        async with asyncio.timeout(30):
            while not any(e.in_flight for e in router.fleet.servers.values()):
                await asyncio.sleep(0.01)
        with pytest.raises(RequestError) as refused:  # the same session: the server that runs the first
            await router.generate(GenerateCall("s", [1, 2, 3], _params(2), request_id=request_id))
        assert refused.value.code == grpc.StatusCode.ALREADY_EXISTS, refused.value.details
        assert request_id[:32] in refused.value.details
        for code in ("ALREADY_EXISTS", "RESOURCE_EXHAUSTED"):
            assert router.metrics.value("agentloop_router_retries_total", code=code) == 0
        assert len((await first).token_ids) == 400
