"""An engine that returns after a weight update serves the old weights (issue 18, fault 2): every worker's Fleet
holds it out, not only the one that pushed the update; and a version any worker's Fleet learns, every one of them
holds out the engines below (one ``ExpectedVersion`` for the manager's Fleets)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, WorkerSpec
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter

from ..router.conftest import free_port
from ..router.test_routing import FAST, _until
from .conftest import EOS, VOCAB, TextScript, scripted_engine

pytestmark = pytest.mark.fault


async def _engine(script: TextScript, address: str) -> EngineServer:
    engine = FakeEngine(FakeEngineConfig(vocab_size=VOCAB, eos_token_id=EOS, script=script))
    server = await create_server(engine, address)
    await start_adapter(server)
    return server


async def test_every_worker_fleet_holds_out_an_engine_restarted_after_an_update(codec):
    script = TextScript(codec, ["hi"])
    returning = f"127.0.0.1:{free_port()}"
    async with AsyncExitStack() as stack:
        steady = await stack.enter_async_context(scripted_engine(script))
        servers = [await _engine(script, returning)]
        stack.push_async_callback(lambda: servers[-1].stop(grace_s=0.1))
        manager = await stack.enter_async_context(
            AgentLoopManager(WorkerSpec(engines=(steady, returning)), num_workers=2)
        )
        fleets = manager.fleets
        assert len(fleets) == 2
        for fleet in fleets:
            await fleet.wait_ready(2)
        await manager.update_weights([NamedTensor("w", "float32", (1,), b"\0\0\0\0")], weight_version=1)

        await servers[-1].stop(grace_s=0.1)
        await _until(lambda: not any(fleet.servers[returning].healthy for fleet in fleets))
        servers.append(await _engine(script, returning))  # back at version 0
        await _until(lambda: all(fleet.servers[returning].healthy for fleet in fleets))
        # the second worker's Fleet pushed nothing and has generated nothing since: it shares the fleet's version
        assert [fleet.held_out for fleet in fleets] == [{returning}, {returning}]
        assert all(fleet.weight_version == 1 for fleet in fleets)


async def test_a_version_one_workers_fleet_learns_holds_out_the_older_engine_in_every_fleet(codec):
    """An engine updated from elsewhere (another trainer, an operator): the worker whose Fleet sees its version holds
    the other engine out, and so must every worker of the manager, or one batch mixes the two policies."""
    script = TextScript(codec, ["hi"])
    async with AsyncExitStack() as stack:
        servers = [await _engine(script, "127.0.0.1:0") for _ in range(2)]
        for server in servers:
            stack.push_async_callback(server.stop, 0.1)
        updated, older = (f"127.0.0.1:{server.port}" for server in servers)
        manager = await stack.enter_async_context(
            AgentLoopManager(WorkerSpec(engines=(updated, older), router=FAST), num_workers=2)
        )
        fleets = manager.fleets
        for fleet in fleets:
            await fleet.wait_ready(2)
        await servers[0].lifecycle.update_weights([NamedTensor("w", "float32", (1,), b"\0\0\0\0")], 2,
                                                  flush_cache=False)
        (await fleets[1].server_info()).raise_for_errors()  # the second worker's Fleet learns version 2
        assert fleets[1].held_out == {older}
        # the first holds out what it has not seen at version 2, at once, until its next poll of the updated one
        assert fleets[0].weight_version == 2 and older in fleets[0].held_out
        await _until(lambda: fleets[0].held_out == {older})
