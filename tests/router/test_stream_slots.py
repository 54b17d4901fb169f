"""A server's stream slots (RouterConfig.max_streams_per_server) are never lost, and waiting for one ends at the
call's deadline: a request that cannot be built gives its slot back (it is built before a slot is taken), and a
call that finds every slot taken fails when its deadline passes instead of waiting for ever."""

from __future__ import annotations

import asyncio

import pytest

from agentloop_grpc.router import GenerateCall, InfrastructureError, Router
from agentloop_grpc.router import router as router_module

from .conftest import address, fake_servers
from .test_routing import FAST, _until, params

SLOTS = FAST.model_copy(update={"max_streams_per_server": 4})


@pytest.mark.parametrize("tokens", [8, 64], ids=["unary", "stream"])
async def test_requests_that_cannot_be_built_give_their_slots_back(tokens: int, monkeypatch) -> None:
    # GenerateCall refuses every value known to break the request; this stands in for one it would miss
    built = router_module.attempt_request

    def unbuildable(request_id, call, *args, **kwargs):
        if call.session_id.startswith("bad"):
            raise ValueError("Value out of range: -1")
        return built(request_id, call, *args, **kwargs)

    monkeypatch.setattr(router_module, "attempt_request", unbuildable)
    async with fake_servers(1) as servers, Router([address(servers[0])], SLOTS) as router:
        await router.fleet.wait_ready()
        async with asyncio.timeout(30):  # with a slot leaked per failed call, the fifth call would wait for ever
            for index in range(SLOTS.max_streams_per_server):
                with pytest.raises(ValueError, match="out of range"):
                    await router.generate(GenerateCall(f"bad{index}", [1, 2, 3], params(tokens)))
            result = await router.generate(GenerateCall("good", [1, 2, 3], params(tokens)))
        assert len(result.token_ids) == tokens


async def test_waiting_for_a_slot_ends_at_the_calls_deadline() -> None:
    one_slot = FAST.model_copy(update={"max_streams_per_server": 1})
    async with fake_servers(1, token_latency_s=0.05) as servers, Router([address(servers[0])], one_slot) as router:
        await router.fleet.wait_ready()
        holder = asyncio.create_task(router.generate(GenerateCall("holder", [1, 2, 3], params(4000))))
        await _until(lambda: router.fleet.endpoint(address(servers[0])).in_flight == 1)
        try:
            async with asyncio.timeout(30):  # without a bound the call waits until the holder's minutes-long call ends
                with pytest.raises(InfrastructureError, match=r"deadline.*slot"):
                    await router.generate(GenerateCall("waiter", [1, 2, 3], params(4), timeout_s=0.2))
            assert not holder.done()
        finally:
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder
