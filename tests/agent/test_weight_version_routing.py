"""An engine that returns after a weight update serves the old weights (issue 18, fault 2): every worker's Fleet
holds it out, not only the one that pushed the update."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent import AgentLoopManager, WorkerSpec
from agentloop_grpc.common.types import NamedTensor
from agentloop_grpc.engine_adapters.fake import FakeEngine
from agentloop_grpc.engine_adapters.fake_config import FakeEngineConfig
from agentloop_grpc.engine_adapters.server import EngineServer, create_server, start_adapter

from ..router.conftest import free_port
from ..router.test_routing import _until
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
        # the second worker's Fleet pushed nothing and has generated nothing since: the manager told it
        assert [fleet.held_out for fleet in fleets] == [{returning}, {returning}]
        assert all(fleet.weight_version == 1 for fleet in fleets)
