"""A weight update with one engine dead must leave the others running, not paused until every later generation's
deadline (issue 18, fault 2)."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from agentloop_grpc.agent.manager import update_weights_mid_rollout
from agentloop_grpc.common.types import EngineState, NamedTensor
from agentloop_grpc.router import Fleet, RouterConfig
from agentloop_grpc.router.errors import InfrastructureError

from ..router.conftest import free_port
from .conftest import TextScript, scripted_engine

pytestmark = pytest.mark.fault


@pytest.mark.parametrize("pause", ["abort", "none"])
async def test_an_update_with_one_engine_dead_resumes_the_live_ones(codec, pause):
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    async with AsyncExitStack() as stack:
        live = await stack.enter_async_context(scripted_engine(TextScript(codec, ["hi"])))
        control = await stack.enter_async_context(Fleet([live, dead], RouterConfig(control_timeout_s=2)))
        await control.wait_ready(min_servers=1)
        tensor = NamedTensor("w", "float32", (1,), b"\0\0\0\0")
        with pytest.raises(InfrastructureError, match=dead):
            await update_weights_mid_rollout(control, [tensor], weight_version=1, pause=pause)
        info = (await control.server_info()).responses[live]
    assert info.state is EngineState.RUNNING  # was PAUSED: nothing resumed it
    assert info.weight_version == 0  # nothing was applied while the fleet could not all take it


@pytest.mark.parametrize("pause", ["abort", "none"])
async def test_a_trainer_can_leave_a_dead_engine_out_and_go_on(codec, pause):
    """leave_out_unreachable (what the TRL rollouts ask): the engines that answer take the update, the dead one is
    named, not fatal; back later it would be held out of routing as behind the fleet's version."""
    dead = f"127.0.0.1:{free_port()}"
    async with AsyncExitStack() as stack:
        live = await stack.enter_async_context(scripted_engine(TextScript(codec, ["hi"])))
        control = await stack.enter_async_context(Fleet([live, dead], RouterConfig(control_timeout_s=2)))
        await control.wait_ready(min_servers=1)
        tensor = NamedTensor("w", "float32", (1,), b"\0\0\0\0")
        left_out = await update_weights_mid_rollout(control, [tensor], weight_version=1, pause=pause,
                                                    leave_out_unreachable=True)
        info = (await control.server_info()).responses[live]
        assert left_out == {dead}
        assert info.state is EngineState.RUNNING and info.weight_version == 1
        assert control.weight_version == 1
