"""A call that a server refuses with RESOURCE_EXHAUSTED (its waiting queue is full) is tried again after a backoff,
preferring another server, as docs/router.md says; the caller sees one generation. A server that keeps refusing
spends the call's attempts, and the call ends as an infrastructure failure naming the code."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager

import pytest

from agentloop_grpc.common.errors import EngineOverloadedError
from agentloop_grpc.common.types import GenerateEvent, GenerateRequest
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter
from agentloop_grpc.router import GenerateCall, InfrastructureError, Router

from .conftest import address, fake_servers
from .test_routing import FAST, params


class RefusesAtFirst(FakeEngine):
    """A fake engine whose first ``refusals`` generate calls find its waiting queue full."""

    def __init__(self, refusals: int) -> None:
        super().__init__(FakeEngineConfig())
        self.refusals = refusals
        self.calls = 0

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerateEvent, None]:
        self.calls += 1
        if self.calls <= self.refusals:
            raise EngineOverloadedError("the waiting queue is full (a test's refusal)")
        async for event in super().generate(request):
            yield event


@asynccontextmanager
async def refusing_server(refusals: int) -> AsyncIterator[tuple[EngineServer, RefusesAtFirst]]:
    engine = RefusesAtFirst(refusals)
    server = await create_server(engine, "127.0.0.1:0")
    try:
        await start_adapter(server)
        yield server, engine
    finally:
        await server.stop(grace_s=0.5)


def _retries(router: Router) -> float:
    return router.metrics.value("agentloop_router_retries_total", code="RESOURCE_EXHAUSTED")


@pytest.mark.parametrize("tokens", [8, 64], ids=["unary", "stream"])
async def test_a_call_refused_as_overloaded_is_retried_and_succeeds(tokens: int) -> None:
    sampling = params(tokens, temperature=0)
    async with fake_servers(1) as plain, Router([address(plain[0])], FAST) as router:
        await router.fleet.wait_ready()
        expected = await router.generate(GenerateCall("s", [4, 5, 6], sampling))
    async with refusing_server(refusals=2) as (server, engine), Router([address(server)], FAST) as router:
        await router.fleet.wait_ready()
        result = await router.generate(GenerateCall("s", [4, 5, 6], sampling))
        assert result.token_ids == expected.token_ids and len(result.token_ids) == tokens
        assert engine.calls == 3 and _retries(router) == 2
        assert result.servers == (address(server),) * 3 and result.failovers == 0  # nothing to resume from


async def test_a_refused_call_moves_to_a_server_that_takes_it() -> None:
    async with refusing_server(refusals=1_000) as (full, engine), fake_servers(1) as free:
        async with Router([address(full), address(free[0])], FAST) as router:
            await router.fleet.wait_ready(2)
            router._sessions.remember("s", address(full), time.monotonic())  # the session lives on the full server
            result = await router.generate(GenerateCall("s", [4, 5, 6], params(8)))
            assert result.servers == (address(full), address(free[0])) and engine.calls == 1
            assert _retries(router) == 1


async def test_a_server_that_keeps_refusing_spends_the_attempts_and_says_so() -> None:
    async with refusing_server(refusals=1_000) as (server, engine), Router([address(server)], FAST) as router:
        await router.fleet.wait_ready()
        with pytest.raises(InfrastructureError, match="failed on 5 attempts; last: RESOURCE_EXHAUSTED"):
            await router.generate(GenerateCall("s", [4, 5, 6], params(8)))
        assert engine.calls == FAST.max_attempts == 5 and _retries(router) == 5
