"""The Fleet answers in domain types, never protobuf messages: each server's answer to a fanned-out control call
(FanOutResult.responses) and the server info an Endpoint keeps, read from real servers on loopback."""

from __future__ import annotations

import asyncio

import pytest
from google.protobuf.message import Message

from agentloop_grpc.common.types import EngineState, NamedTensor, PauseMode, PauseResult
from agentloop_grpc.common.weight_layout import TensorSpec
from agentloop_grpc.router import GenerateCall, Router, ServerInfo, WeightsApplied
from agentloop_grpc.router.fanout import tensor_specs

from .conftest import address, fake_servers
from .test_routing import FAST, _until, params


async def test_every_control_call_answers_in_domain_types() -> None:
    async with fake_servers(1, token_latency_s=0.005, vocab_size=1000) as servers, Router(
        [address(servers[0])], FAST
    ) as router:
        fleet, server = router.fleet, address(servers[0])
        await fleet.wait_ready()
        await _until(lambda: fleet.endpoint(server).info is not None)
        kept = fleet.endpoint(server).info
        assert isinstance(kept, ServerInfo) and kept.engine_kind == "fake" and kept.vocab_size == 1000
        assert kept.state is EngineState.RUNNING and kept.eos_token_ids == (2,)

        info = (await fleet.server_info()).raise_for_errors().responses[server]
        assert info == kept  # nothing changed since the endpoint fetched it
        updated = await fleet.update_weights([NamedTensor("w", "float32", (2,), bytes(8))], weight_version=3)
        assert updated.raise_for_errors().responses[server] == WeightsApplied(3, 1, 8)

        busy = asyncio.create_task(router.generate(GenerateCall("busy", [1, 2], params(3000), request_id="busy-1")))
        await _until(lambda: servers[0].lifecycle.load().running_requests == 1)
        assert (await fleet.pause(PauseMode.KEEP)).responses[server] == PauseResult(aborted_requests=0, kept_requests=1)
        assert (await fleet.resume()).responses[server] is EngineState.RUNNING
        assert (await fleet.abort_all()).responses[server] == ("busy-1",)
        await busy
        assert (await fleet.sleep(1)).responses[server] is False  # the fake has no memory to release
        assert (await fleet.wake_up()).responses[server] is EngineState.RUNNING
        assert (await fleet.flush_cache()).responses[server] is None
        assert not isinstance(info, Message) and not isinstance(updated.responses[server], Message)


def test_announced_tensors_are_domain_specs_converted_at_the_boundary() -> None:
    [spec] = tensor_specs([TensorSpec("w", "bfloat16", (3, 4))])
    assert (spec.name, list(spec.shape)) == ("w", [3, 4])
    with pytest.raises(ValueError, match="tensor 'x': unsupported dtype 'complex64'"):
        tensor_specs([TensorSpec("x", "complex64", (1,))])
