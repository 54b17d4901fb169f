"""A call that sets no budget takes the server's default (GetServerInfoResponse.default_max_new_tokens) once, in
all: resumed on another server after a failure, it asks for what is left of that default, not a fresh one."""

from __future__ import annotations

from agentloop_grpc.common import wire
from agentloop_grpc.common.types import FinishReason
from agentloop_grpc.router import GenerateCall, GenerateResult, Router
from agentloop_grpc.router.attempts import attempt_request, ended_before_resume
from agentloop_grpc.v1 import generation_pb2

from .conftest import address, fake_servers
from .test_routing import FAST

DEFAULT = 60


def test_a_resumed_attempt_without_a_budget_asks_for_what_is_left_of_the_default() -> None:
    call = GenerateCall("s", [1, 2, 3])
    first, resumed = generation_pb2.GenerateRequest(), generation_pb2.GenerateRequest()
    attempt_request("r", call, wire.prompt_to_raw([1, 2, 3]), [], None, into=first, default_budget=DEFAULT)
    attempt_request("r.2", call, wire.prompt_to_raw([1, 2, 3]), [9] * 20, None, into=resumed, default_budget=DEFAULT)
    assert not first.sampling_params.HasField("max_new_tokens")  # the first attempt leaves it to the server
    assert resumed.sampling_params.max_new_tokens == DEFAULT - 20
    assert ended_before_resume([9] * DEFAULT, None, (2,), DEFAULT) == (FinishReason.LENGTH, None)
    assert ended_before_resume([9] * (DEFAULT - 1), None, (2,), DEFAULT) is None


async def test_a_generation_resumed_elsewhere_keeps_the_servers_default_budget() -> None:
    # the fake draws any id of its vocabulary, eos too: in int32's largest vocabulary eos practically never comes,
    # so the default budget alone ends the generation (a small vocabulary made the test fail now and then)
    async with fake_servers(2, token_latency_s=0.005, default_max_new_tokens=DEFAULT, vocab_size=2**31 - 1,
                            eos_token_id=2**31 - 2) as servers, Router([address(s) for s in servers], FAST) as router:
        await router.fleet.wait_ready(2)
        by_address = {address(s): s for s in servers}
        received, result = 0, None
        async for event in router.stream(GenerateCall("no-budget", [10, 11, 12])):
            if isinstance(event, GenerateResult):
                result = event
                break
            received += len(event.token_ids)
            if received >= 20 and len(by_address) == 2:  # the first server goes away mid-stream
                await by_address.pop(router.session_server("no-budget")).server.stop(0)
        assert result is not None and result.failovers == 1
        assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == DEFAULT
